"""The identity of a fairseq dictionary, recorded wherever ids are fixed.

Two ``dict.txt`` files of the same size can map the same id to different
pieces (e.g. two sentencepiece models trained on different text with the same
``--vocab-size``); a model trained with one and used with the other runs
without a shape error and silently produces garbage.  Every tool of the plugin
therefore records ``dictionary_sha256`` next to what it writes (the data
folder's ``preprocess.json``, every checkpoint's ``task_state``, exported
models) and compares it before it loads, exports or resumes.
"""

import hashlib
import os
from typing import Any, Union


def dictionary_sha256(path: Union[str, os.PathLike]) -> str:
    """sha256 of the symbols of ``dict.txt`` in id order, as fairseq loads it
    (its four specials first); the counts do not take part (they never change
    an id)."""
    from fairseq.data import Dictionary

    symbols = Dictionary.load(str(path)).symbols
    return hashlib.sha256("\n".join(symbols).encode("utf-8")).hexdigest()


def is_ordinary(ids: Any, nspecial: int, mask_idx: int) -> Any:
    """THE rule of which ids are ordinary tokens (the text's words and pieces): not one of
    the dictionary's ``nspecial`` leading specials (``<s>`` = [CLS], ``<pad>``, ``</s>``,
    ``<unk>``) and not ``<mask>``.  ``ids``: an int, or a torch / numpy array (elementwise)."""
    return (ids >= nspecial) & (ids != mask_idx)
