"""Moved to :mod:`seed_fairseq.dupmae.pooling` in 0.2.0; this import path keeps working."""

import sys

from ..dupmae import pooling as _moved

sys.modules[__name__] = _moved
