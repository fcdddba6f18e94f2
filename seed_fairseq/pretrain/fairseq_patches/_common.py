"""What every fix shares: the label of its replacements, the logger, and fairseq-train's module.

``tests/test_fairseq_patches.py`` reads the label to check that, after
``apply()``, each attribute of the table is the replacement its row names.
"""

import logging
import sys
from types import ModuleType
from typing import List

MARK = "_seed_fairseq_patch"

# The name fairseq-train's log lines have always shown for these messages
# (the fixes lived in seed_fairseq/compat.py until 0.2.0).
logger = logging.getLogger("seed_fairseq.compat")


def mark(replacement, fix: str):
    """``replacement``, labelled as installed by the module ``fix``."""
    setattr(replacement, MARK, fix)
    return replacement


def fairseq_train_modules() -> List[ModuleType]:
    """The loaded module(s) of fairseq-train in this process: ``fairseq_cli.train`` (the
    ``fairseq-train`` command) and ``__main__`` under ``python -m fairseq_cli.train``.  Never
    imported here: importing ``fairseq_cli.train`` configures the root logger."""
    main_module = sys.modules.get("__main__")
    found = [sys.modules.get("fairseq_cli.train")]
    if getattr(getattr(main_module, "__spec__", None), "name", None) == "fairseq_cli.train":
        found.append(main_module)
    return [m for m in found if m is not None]
