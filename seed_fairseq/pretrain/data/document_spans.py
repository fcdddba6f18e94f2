"""coCondenser's data: the documents of a binarized split, each cut into spans, two spans a document.

A split is fairseq's binarized text: one item per line (its pieces and ``</s>``) and, between two
documents, an empty line, the one-token item ``[</s>]`` (``preprocess/encode.py``; what fairseq's
``complete_doc`` mode reads as a document boundary).  :func:`document_spans` cuts every document into
non-overlapping spans of at most ``block_size`` tokens that never cross a document boundary, as
``--sample-break-mode`` says:

* ``complete`` / ``complete_doc``: whole lines packed up to ``block_size`` (fairseq's ``complete_doc``
  packing); a line longer than ``block_size`` is first cut into ``ceil(n / block_size)`` near-equal
  pieces (nothing is dropped, unlike a block of fairseq's ``complete`` mode);
* ``none``: consecutive runs of ``block_size`` tokens of the document, the last one shorter;
* ``eos``: one line a span (a longer line cut as above).

A span of a single token (a lone ``</s>``) carries no text and is left out.  A document with one span
cannot give two: ``short_documents="drop"`` leaves it out (what the authors' preprocessing does:
``helper/create_train_co.py`` skips every document of fewer than two spans; the paper samples a pair
"from each" document and says nothing of shorter ones), ``"halves"`` cuts its one span, when it has
at least 4 tokens, into two halves (the first ``ceil(n / 2)`` tokens and the rest).

:class:`SpanPairs` picks, for document ``i`` in epoch ``e``, two different spans uniformly at
random from ``(seed, e, i)`` alone (a counter-based hash, splitmix64, vectorised: every document's
pick of an epoch is computed at once for the batching), so a batch holds the same spans however
it is split over ``--update-freq`` and workers, and a resumed run picks what the straight one
picked.  Of the two, the longer is the first view (ties: the first drawn): which is "first" is
immaterial to the symmetric loss, and the document's size for the batching is then the first view's
length, exactly what ``src_tokens`` holds.  :class:`DocumentSpanView` is one view of every
document (``[CLS]`` + span); its ``sizes`` change with the epoch (updated in place by
``set_epoch``, so the task rebuilds its batches every epoch).
"""

from typing import Tuple

import numpy as np
import torch
from fairseq.data import FairseqDataset

SEPARATOR_SIZE = 1  # an empty line: [</s>]
BREAK_MODES = ("none", "complete", "complete_doc", "eos")
SHORT_DOCUMENT_POLICIES = ("drop", "halves")
_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# separates these draws from any other stream hashed from (seed, epoch, index)
SALT = 0xC0C0


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 values (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _split_long(sizes: np.ndarray, block_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """Every item longer than ``block_size`` cut into ``ceil(n / block_size)`` near-equal pieces, each
    of at least ``block_size // 2 >= 2`` tokens (never mistaken for a separator): (piece sizes, item of
    each piece)."""
    pieces = np.maximum(1, -(-sizes // block_size))
    item = np.repeat(np.arange(len(sizes)), pieces)
    k = np.arange(len(item)) - np.repeat(np.cumsum(pieces) - pieces, pieces)  # piece k of its item
    n, p = sizes[item], pieces[item]
    return n // p + (k < n % p), item


def document_spans(
    sizes: np.ndarray, break_mode: str, block_size: int, short_documents: str = "drop"
) -> Tuple[np.ndarray, np.ndarray]:
    """``(spans, document)``: the spans as ``(n, 2)`` token offsets ``[start, end)`` into the split's
    token stream, in stream order, and each span's document (0, 1, ... in stream order; a document
    is numbered whether or not it keeps spans), for the documents that give at least two."""
    if break_mode not in BREAK_MODES:
        raise ValueError(f"unknown --sample-break-mode {break_mode!r}; one of {', '.join(BREAK_MODES)}")
    if short_documents not in SHORT_DOCUMENT_POLICIES:
        raise ValueError(f"unknown short-document policy {short_documents!r}")
    if block_size < 4:
        raise ValueError(f"spans of at most {block_size} tokens: coCondenser needs --tokens-per-sample >= 5")
    sizes = np.asarray(sizes, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    separator = sizes == SEPARATOR_SIZE
    if break_mode in ("complete", "complete_doc"):
        from fairseq.data.token_block_utils_fast import _get_slice_indices_fast

        pieces, _ = _split_long(sizes, block_size)
        spans = _get_slice_indices_fast(pieces, "complete_doc", block_size, SEPARATOR_SIZE).astype(np.int64)
    elif break_mode == "eos":
        pieces, item = _split_long(sizes, block_size)
        ends = np.cumsum(pieces)
        spans = np.stack([ends - pieces, ends], 1)[~separator[item]]
    else:  # none: runs of block_size tokens within each document
        text = np.flatnonzero(~separator)
        doc_of_item = np.cumsum(separator) - separator
        first = np.flatnonzero(np.diff(np.concatenate([[-1], doc_of_item[text]])) != 0)
        starts = offsets[text[first]]
        ends = offsets[text[np.append(first[1:], len(text)) - 1] + 1]
        runs = -(-(ends - starts) // block_size)
        begin = np.repeat(starts, runs) + block_size * (np.arange(runs.sum()) - np.repeat(np.cumsum(runs) - runs, runs))
        spans = np.stack([begin, np.minimum(begin + block_size, np.repeat(ends, runs))], 1)
    spans = spans.reshape(-1, 2)
    spans = spans[spans[:, 1] - spans[:, 0] >= 2]  # a lone </s> is no text
    document = np.searchsorted(offsets[:-1][separator], spans[:, 0], side="right")
    counts = np.bincount(document, minlength=int(document.max(initial=-1)) + 1)
    if short_documents == "halves":
        single = (counts[document] == 1) & (spans[:, 1] - spans[:, 0] >= 4)  # halves of 2 tokens or more
        start, end = spans[single, 0], spans[single, 1]
        middle = start + (end - start + 1) // 2
        halves = np.stack([np.stack([start, middle], 1), np.stack([middle, end], 1)], 1).reshape(-1, 2)
        spans = np.concatenate([spans[~single], halves])
        document = np.concatenate([document[~single], np.repeat(document[single], 2)])
        order = np.argsort(spans[:, 0], kind="stable")
        spans, document = spans[order], document[order]
        counts = np.bincount(document, minlength=len(counts))
    keep = counts[document] >= 2
    return spans[keep], document[keep]


class SpanPairs:
    """The spans of the documents that give two (``document_spans``), and two of them per document
    and epoch.  Documents are indexed 0 .. n-1 in stream order (those left out are skipped)."""

    def __init__(self, spans: np.ndarray, document: np.ndarray, seed: int):
        self.spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        self.lengths = self.spans[:, 1] - self.spans[:, 0]
        boundary = np.flatnonzero(np.diff(np.concatenate([[-1], document])) != 0)
        self.first = boundary  # each document's first span
        self.count = np.diff(np.append(boundary, len(document)))
        self.seed = int(seed)

    def __len__(self) -> int:
        return len(self.first)

    def picks(self, epoch: int, index: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(first view, second view): span ids of documents ``index`` in ``epoch``, two different
        spans of each drawn uniformly, the longer one first."""
        index = np.asarray(index, dtype=np.int64)
        n = self.count[index].astype(np.uint64)
        with np.errstate(over="ignore"):
            key = _mix(np.full(len(index), (self.seed & _MASK64) ^ SALT, dtype=np.uint64) + _GOLDEN)
            key = _mix(key ^ np.uint64(epoch & _MASK64)) + index.astype(np.uint64)
            a = _mix(key + _GOLDEN) % n
            b = _mix(key + _GOLDEN + _GOLDEN) % (n - np.uint64(1))
        b = b + (b >= a)
        a, b = self.first[index] + a.astype(np.int64), self.first[index] + b.astype(np.int64)
        swap = self.lengths[b] > self.lengths[a]
        return np.where(swap, b, a), np.where(swap, a, b)


class FixedSpanPairs(SpanPairs):
    """Every span of every document once, in fixed pairs: its spans 1-2, 3-4, ... (an odd last span
    left out), whatever the epoch.  For validation: the whole split is scored, the same pairs every
    time, so that validation losses compare across the run (two pairs of one document meet as
    negatives when a batch holds both)."""

    def __init__(self, spans: np.ndarray, document: np.ndarray, seed: int = 0):
        super().__init__(spans, document, seed)
        per_document = self.count // 2
        self.pair_first = np.repeat(self.first, per_document) + 2 * (
            np.arange(per_document.sum()) - np.repeat(np.cumsum(per_document) - per_document, per_document)
        )

    def __len__(self) -> int:
        return len(self.pair_first)

    def picks(self, epoch: int, index: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        a = self.pair_first[np.asarray(index, dtype=np.int64)]
        b = a + 1
        swap = self.lengths[b] > self.lengths[a]
        return np.where(swap, b, a), np.where(swap, a, b)


class SpanBlocks(FairseqDataset):
    """The tokens of given spans of a dataset of lines (token offsets into their concatenation)."""

    def __init__(self, dataset, spans: np.ndarray):
        super().__init__()
        self.dataset = dataset
        self.spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        self._sizes = self.spans[:, 1] - self.spans[:, 0]
        offsets = np.concatenate([[0], np.cumsum(np.asarray(dataset.sizes, dtype=np.int64))])
        self._offsets = offsets
        self._first = np.searchsorted(offsets, self.spans[:, 0], side="right") - 1
        self._last = np.searchsorted(offsets, self.spans[:, 1] - 1, side="right") - 1

    @property
    def sizes(self) -> np.ndarray:
        return self._sizes

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, i: int) -> torch.Tensor:
        first, last = int(self._first[i]), int(self._last[i])
        lines = torch.cat([self.dataset[k] for k in range(first, last + 1)])
        start = int(self.spans[i, 0] - self._offsets[first])
        return lines[start : start + int(self._sizes[i])]

    def num_tokens(self, index: int) -> int:
        return int(self._sizes[index])

    def size(self, index: int) -> int:
        return int(self._sizes[index])


class DocumentSpanView(FairseqDataset):
    """View ``which`` (0: the longer span, 1: the other) of every document of ``pairs``, as
    ``[CLS] + span``; ``sizes`` (this epoch's lengths) are updated in place by ``set_epoch``."""

    def __init__(self, blocks: SpanBlocks, pairs: SpanPairs, which: int, bos: int, epoch: int = 1):
        super().__init__()
        self.blocks, self.pairs, self.which, self.bos = blocks, pairs, int(which), int(bos)
        self._sizes = np.zeros(len(pairs), dtype=np.int64)
        self.set_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.epoch = int(epoch)
        picked = self.pairs.picks(self.epoch, np.arange(len(self.pairs)))[self.which]
        self._sizes[:] = self.pairs.lengths[picked] + 1

    @property
    def can_reuse_epoch_itr_across_epochs(self) -> bool:
        return False  # the sizes, hence the batches, change with the epoch

    @property
    def sizes(self) -> np.ndarray:
        return self._sizes

    def span(self, index: int) -> int:
        return int(self.pairs.picks(self.epoch, [index])[self.which][0])

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> torch.Tensor:
        tokens = self.blocks[self.span(index)]
        return torch.cat([tokens.new_tensor([self.bos]), tokens])

    def num_tokens(self, index: int) -> int:
        return int(self._sizes[index])

    def size(self, index: int) -> int:
        return int(self._sizes[index])
