from .shift_tokens_dataset import ShiftTokensDataset  # noqa: F401
from .update_counts import UpdateCountsEpochBatchIterator  # noqa: F401
