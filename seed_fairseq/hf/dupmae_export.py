"""Moved to :mod:`seed_fairseq.dupmae.export` in 0.2.0; this import path keeps working."""

import sys

from ..dupmae import export as _moved

sys.modules[__name__] = _moved
