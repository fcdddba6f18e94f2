"""Encoded pieces -> fairseq mmap .bin/.idx, in parallel, byte-identical to fairseq's binarizer.

The bytes are exactly those of ``fairseq-preprocess --only-source --srcdict dict.txt
--dataset-impl mmap`` (fairseq's FileBinarizer + VocabularyDatasetBinarizer, tested
byte for byte): each line's whitespace-separated symbols looked up in dict.txt
(unknown -> <unk>, counted as replaced), then </s>; tokens in fairseq's
``best_fitting_int_dtype(len(dictionary))``; the index is fairseq's
``MMapIndexedDataset.Index`` (magic, version, dtype code, count, int32 sizes,
int64 byte pointers).

Why not fairseq's code: it builds a torch tensor per line (1.5-2 MB/s) and its
multi-worker mode gives each worker one slice of the file and merges their files
afterwards (no faster on 2 cores). Here workers look up whole chunks of lines
(``--workers`` processes, each reads its own byte range, a bounded number in
flight) and the main process appends their tokens in order, so the output
does not depend on the number of workers. Memory is bounded: sizes go to a
temporary file until the index is written.

fairseq (its Dictionary and index format) is imported by the functions that use
it: importing this module does not load fairseq.
"""

import collections
import os
import struct
from typing import Tuple, Union

import numpy as np

from .errors import PreprocessError, writing
from .parallel import line_ranges, ordered_imap, read_range, split_lines

CHUNK_BYTES = 4 << 20

_INDEX = None
_UNK = _EOS = 0
_DTYPE = None


def _init_worker(dict_path):
    from fairseq.data import Dictionary
    from fairseq.data.indexed_dataset import best_fitting_int_dtype

    global _INDEX, _UNK, _EOS, _DTYPE
    dictionary = Dictionary.load(str(dict_path))
    _INDEX = dictionary.indices
    _UNK, _EOS = dictionary.unk(), dictionary.eos()
    _DTYPE = best_fitting_int_dtype(len(dictionary))


def binarize_text(text: str) -> Tuple[bytes, np.ndarray, collections.Counter]:
    """(token bytes, int32 sizes, Counter of replaced symbols) for the lines of ``text``."""
    if "\r" in text:  # fairseq reads in text mode: universal newlines
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    get = _INDEX.get
    ids = []
    sizes = []
    for line in split_lines(text):
        words = line.split()
        ids.extend(map(get, words, [-1] * len(words)))
        ids.append(_EOS)
        sizes.append(len(words) + 1)
    tokens = np.array(ids, dtype=np.int64)
    replaced = collections.Counter()
    unknown = tokens < 0
    if unknown.any():
        words = [w for line in split_lines(text) for w in line.split() + [None]]
        replaced.update(words[i] for i in np.flatnonzero(unknown))
        tokens[unknown] = _UNK
    return tokens.astype(_DTYPE).tobytes(order="C"), np.array(sizes, dtype=np.int32), replaced


def _binarize_range(task):
    path, start, end = task
    return binarize_text(read_range(path, start, end).decode("utf-8"))


def write_index(index_path: Union[str, os.PathLike], dtype: type, sizes_path: Union[str, os.PathLike], n: int) -> None:
    """fairseq's MMapIndexedDataset index for the ``n`` int32 sizes in ``sizes_path``, streaming."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset, _dtype_header_code

    itemsize = np.dtype(dtype).itemsize
    with open(index_path, "wb") as out, open(sizes_path, "rb") as f:
        out.write(MMapIndexedDataset.Index._HDR_MAGIC)
        out.write(struct.pack("<Q", 1))
        out.write(struct.pack("<B", _dtype_header_code(dtype)))
        out.write(struct.pack("<Q", n))
        while True:
            block = f.read(1 << 22)
            if not block:
                break
            out.write(block)
        f.seek(0)
        address = 0
        while True:
            sizes = np.frombuffer(f.read(1 << 22), dtype=np.int32)
            if not len(sizes):
                break
            ends = np.cumsum(sizes, dtype=np.int64) * itemsize + address
            out.write(np.concatenate(([address], ends[:-1])).astype(np.int64).tobytes(order="C"))
            address = int(ends[-1])


def binarize_file(
    encoded_path: Union[str, os.PathLike],
    dict_path: Union[str, os.PathLike],
    output_prefix: Union[str, os.PathLike],
    workers: int,
    chunk_bytes: int = CHUNK_BYTES,
) -> Tuple[int, int]:
    """Write ``output_prefix``.bin/.idx; returns (sequences, tokens)."""
    from fairseq.data import Dictionary
    from fairseq.data.indexed_dataset import best_fitting_int_dtype

    dictionary = Dictionary.load(str(dict_path))
    dtype = best_fitting_int_dtype(len(dictionary))
    bin_path, idx_path = f"{output_prefix}.bin", f"{output_prefix}.idx"
    sizes_path = f"{output_prefix}.sizes.tmp"
    n_seq = n_tok = 0
    replaced = collections.Counter()
    tasks = ((str(encoded_path), start, end) for start, end in line_ranges(encoded_path, chunk_bytes))
    try:
        # the sizes are part of the .bin's output: a write error in either names the .bin
        with writing(bin_path), open(bin_path, "wb") as data, open(sizes_path, "wb") as size_file:
            for tokens, sizes, chunk_replaced in ordered_imap(
                _binarize_range, tasks, workers, initializer=_init_worker, initargs=(str(dict_path),)
            ):
                data.write(tokens)
                size_file.write(sizes.tobytes(order="C"))
                n_seq += len(sizes)
                n_tok += int(sizes.sum())
                replaced.update(chunk_replaced)
        with writing(idx_path):
            write_index(idx_path, dtype, sizes_path, n_seq)
    except BaseException:
        # no partial .bin/.idx is left for anyone to mistake for data
        for path in (bin_path, idx_path):
            if os.path.exists(path):
                os.remove(path)
        raise
    finally:
        if os.path.exists(sizes_path):
            os.remove(sizes_path)
    if replaced:
        # Every piece comes from the same spm model as dict.txt, so an <unk>
        # replacement means the two disagree: refuse to write a silent mismatch.
        raise PreprocessError(
            encoded_path,
            f"{sum(replaced.values())} pieces are not in {dict_path} "
            f"(e.g. {list(replaced)[:5]}); dict.txt and spm.model do not match",
        )
    return n_seq, n_tok
