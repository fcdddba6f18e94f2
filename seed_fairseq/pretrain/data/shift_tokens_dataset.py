import numpy as np
from fairseq.data import BaseWrapperDataset


class ShiftTokensDataset(BaseWrapperDataset):
    """Drop the first or the last token of every item.

    The weak decoder's input and target are the two shifts of ONE sequence
    ``s = [CLS] x1 .. xn``: input ``s[:-1]``, target ``s[1:]``.  Deriving both
    from the same item keeps ``target[t] == input[t + 1]`` by construction,
    whatever the block ends with (the authors' version stripped trailing
    separators and misaligned blocks ending in two of them).
    """

    def __init__(self, dataset, drop: str):
        super().__init__(dataset)
        if drop not in ("first", "last"):
            raise ValueError(f"drop must be 'first' or 'last', got {drop!r}")
        self.drop = drop
        self._sizes = np.maximum(np.asarray(dataset.sizes) - 1, 0)

    def __getitem__(self, index):
        item = self.dataset[index]
        return item[1:] if self.drop == "first" else item[:-1]

    @property
    def sizes(self) -> np.ndarray:
        return self._sizes

    def num_tokens(self, index) -> np.integer:
        return self._sizes[index]

    def size(self, index) -> np.integer:
        return self._sizes[index]
