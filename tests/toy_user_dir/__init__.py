"""The toy objective's ``--user-dir`` (``toy_objective.TOY.user_dir``): fairseq-train imports this
folder as a module, with ``tests/`` put on ``sys.path`` first, and the import registers the toy."""

import toy_objective  # noqa: F401
