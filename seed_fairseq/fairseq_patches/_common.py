"""What every fix shares: the label of its replacements and the logger.

``tests/test_fairseq_patches.py`` reads the label to check that, after
``apply()``, each attribute of the table is the replacement its row names.
"""

import logging

MARK = "_seed_fairseq_patch"

# The name fairseq-train's log lines have always shown for these messages
# (the fixes lived in seed_fairseq/compat.py until 0.2.0).
logger = logging.getLogger("seed_fairseq.compat")


def mark(replacement, fix: str):
    """``replacement``, labelled as installed by the module ``fix``."""
    setattr(replacement, MARK, fix)
    return replacement
