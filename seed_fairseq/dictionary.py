"""Moved to :mod:`seed_fairseq.vocabulary.dictionary` in 0.2.0; this import path keeps working."""

import sys

from .vocabulary import dictionary as _moved

sys.modules[__name__] = _moved
