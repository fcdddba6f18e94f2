"""Moved to :mod:`seed_fairseq.retrieval_data` (the pre-training task reads dev sets with it); this
import path keeps working."""

import sys

from .. import retrieval_data as _moved

sys.modules[__name__] = _moved
