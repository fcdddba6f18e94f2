"""File safety shared by every tool of the project: atomic writes that respect
the umask, and output folders that a tool may only replace when its own record
says it wrote them.

The guarantees (docs/guarantees.md):

* every file appears complete or not at all: it is written under a temporary
  name in the same folder, flushed and fsync'ed, then renamed over the target;
* files and folders get the permissions the user's umask gives (``tempfile``
  creates 0600 files and 0700 folders; we chmod them before the rename);
* a tool replaces or deletes an existing output only when the output carries
  the tool's own record (a file it wrote and names, e.g. ``preprocess.json``),
  and then only the files that record lists (:func:`delete_listed`,
  :func:`staged_output`): a user's notes or a save-dir inside the folder stay;
  anything else is refused with :class:`OutputError`;
* nothing is deleted through a symbolic link: a listed path whose folders
  include a link is refused before anything is deleted;
* an output folder is checked before anything is read or written (``paths``:
  :func:`check_out_path`, :func:`check_apart`), the same way by every tool.
"""

# the public names of the modules below, importable as ``seed_fairseq.base.fileio.NAME``
from .atomic import (  # noqa: F401
    HASH_CHUNK,
    OutputError,
    PathLike,
    atomic_path,
    check_output_dir,
    check_parents,
    chmod_tree,
    copy_atomic,
    current_umask,
    dir_mode,
    file_mode,
    fsync_dir,
    sha256_file,
    temp_dir_beside,
    temp_path_beside,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)
from .locks import lock_folder  # noqa: F401
from .ownership import (  # noqa: F401
    STAGING_MARK,
    Owned,
    claim_name,
    delete_listed,
    listed_path,
    owned_output,
    remove_stale_staging,
    staged_dir,
    staged_files,
    staged_output,
    write_output_record,
)
from .paths import FAIRSEQ_COLON, check_apart, check_out_path, place_in  # noqa: F401
from .storage import (  # noqa: F401
    STORAGE_ERRNOS,
    naming,
    storage_error,
    storage_line,
)
