"""Moved to :mod:`seed_fairseq.dupmae.retriever` in 0.2.0; this import path keeps working."""

import sys

from ..dupmae import retriever as _moved

sys.modules[__name__] = _moved
