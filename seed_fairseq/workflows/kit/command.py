"""What the command lines of the workflows share: the fine-tuning flags, the corpus, quiet libraries and
the one-line report of a stage's error."""

import os
import sys
from pathlib import Path
from typing import List, Optional

from preprocess.errors import PreprocessError

from ...base.fileio import OutputError, storage_line
from ...base.retrieval_data import DataFormatError
from ...encoders.retrieval.cli import report
from ...encoders.retrieval.config import flag_of
from ...encoders.retrieval.index import SearchError
from .layout import StageError, corpus_documents

# FinetuneConfig field -> the comparison's flag: its own names (the epochs, batch size and
# learning rate of fine-tuning under ft-), the flags and help generated from the fields
FT_PREFIXED = ("epochs", "batch_size", "lr")
FINETUNE_FLAGS = {
    name: flag_of(name, prefix="ft-" if name in FT_PREFIXED else "")
    for name in ("negatives", "loss", "num_negatives", *FT_PREFIXED, "encode_batch_size", "index")
}
FINETUNE_TYPES = {"lr": float}  # --ft-lr: checked by FinetuneConfig.validate (finetune.py: by argparse)


def read_corpus(corpus: Path) -> List[List[str]]:
    """Its documents: the held-out set and the derived retrieval set are planned from them."""
    try:
        return corpus_documents(corpus)
    except UnicodeDecodeError as e:
        raise OutputError(corpus, f"--corpus: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise OutputError(corpus, f"--corpus: cannot be read ({e.strerror})") from None


def quiet_libraries() -> None:
    """The libraries' progress bars and warnings would bury the stage log; no hub look-ups."""
    for key, value in (("TRANSFORMERS_VERBOSITY", "error"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
                       ("TOKENIZERS_PARALLELISM", "false"), ("HF_HUB_OFFLINE", "1")):  # fmt: skip
        os.environ.setdefault(key, value)


def report_stage_error(e: Exception) -> Optional[int]:
    """Exit status 2 after one ``error:`` line for an error of a stage the user can act on
    (bad data, a refused folder, the one-line errors of the tools the stages call, a full
    disk); None for anything else (a bug: the caller re-raises it with its traceback)."""
    from ...encoders.hf.import_ import HFImportError

    if isinstance(e, StageError):
        if e.detail:
            print(e.detail, file=sys.stderr)
        return report(e)
    if isinstance(e, (DataFormatError, OutputError, SearchError, PreprocessError, HFImportError)):
        return report(e)
    line = storage_line(e)  # a full disk or file-size limit (runs, reports, plots)
    return None if line is None else report(line)
