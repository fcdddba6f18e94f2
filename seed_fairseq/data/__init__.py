from .. import plugin  # noqa: F401  (registration first: see seed_fairseq/__init__.py)

# isort: split
from .shift_tokens_dataset import ShiftTokensDataset  # noqa: F401
from .update_counts import UpdateCountsEpochBatchIterator  # noqa: F401
