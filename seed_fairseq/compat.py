"""Moved to :mod:`seed_fairseq.pretrain.fairseq_patches` in 0.2.0 (one module per fix, the table
``PATCHES``); this import path keeps working and, as before, importing it applies the patches."""

import sys

from .pretrain import fairseq_patches as _moved

_moved.apply()
sys.modules[__name__] = _moved
