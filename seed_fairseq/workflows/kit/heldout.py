"""How many documents a workflow holds out for validation: enough blocks for a batch and the probe.

fairseq validates in batches of ``--batch-size`` blocks and drops a last batch
whose size is not a multiple of ``--required-batch-size-multiple`` (default 8):
6 validation blocks in batches of 16 make no batch at all, and fairseq-train
stops with "The dataset is empty" after the data and SimLM's generator were
built (4 held-out package descriptions of one short paragraph each gave 6
blocks).  The diagnostics' retrieval probe wants ``--probe-size`` blocks.  So the
held-out set is sized in blocks, and ``--valid-docs`` is its least size:

* before any stage, from the corpus: its documents and their sizes are known,
  tokens per byte are not (the data stage builds the vocabulary).  A corpus
  that cannot give the blocks from a quarter of its documents even at one token
  per byte in half-full blocks is refused (``plan_valid_docs``); otherwise the
  first guess assumes a typical 4 bytes per token in blocks 80% full, with a
  margin for the documents the split happens to pick.
* in the data stage, from the built data: the valid split's blocks are counted
  as the task cuts them (``count_blocks``: fairseq's ``TokenBlockDataset``);
  too few, and the split is built again with proportionally more documents, at
  most a quarter of the corpus (``more_valid_docs``; ``build_data``, the data stage
  of every workflow, ``kit.pipeline``).
"""

import argparse
import math
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

from .folder import StageError

REQUIRED_BATCH_SIZE_MULTIPLE = 8  # fairseq's default --required-batch-size-multiple
MAX_SHARE = 4  # documents held out automatically: at most 1 / MAX_SHARE of the corpus
TYPICAL_BYTES_PER_TOKEN = 4.0  # measured: 3.85 for a 2,000-piece BPE on English prose, 1.7 for 400 pieces
TYPICAL_FILL = 0.8  # complete-sentence blocks: measured 0.78-0.84 full
MARGIN = 1.25  # the split picks documents at random, shorter ones too


def first_batch_blocks(batch_size: int, multiple: int) -> int:
    """The fewest blocks of which fairseq's ``batch_by_size`` keeps a batch.

    A batch is cut at ``batch_size`` blocks, rounded down to a multiple of
    ``multiple`` when it has one; the last batch is dropped unless its size is
    such a multiple.  So ``multiple`` blocks when a batch can hold them, else
    one more than a batch (a full batch is then kept, the rest dropped).
    """
    return multiple if batch_size >= multiple else batch_size + 1


def fairseq_overrides(fairseq_args: Sequence[str]) -> argparse.Namespace:
    """The batch options of ``--fairseq-args`` that change what a validation needs."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--required-batch-size-multiple", type=int, default=REQUIRED_BATCH_SIZE_MULTIPLE)
    p.add_argument("--batch-size-valid", "--max-sentences-valid", type=int, default=None)
    p.add_argument("--disable-validation", action="store_true")
    return p.parse_known_args(list(fairseq_args))[0]


def blocks_needed(batch_sizes: Iterable[int], probe_size: int, fairseq_args: Sequence[str] = ()) -> int:
    """Validation blocks every run needs: a batch for each objective's batch size, and the probe's blocks."""
    o = fairseq_overrides(fairseq_args)
    if o.disable_validation:
        return 0
    sizes = [o.batch_size_valid] if o.batch_size_valid else list(batch_sizes)
    return max([first_batch_blocks(b, max(1, o.required_batch_size_multiple)) for b in sizes] + [probe_size])


def most_blocks(text_bytes: int, tokens_per_sample: int) -> int:
    """An upper bound on the blocks of ``text_bytes`` bytes: at most one token per byte (a
    byte-fallback piece is one byte), and consecutive blocks hold more than one block's worth."""
    return int(2 * text_bytes / (tokens_per_sample - 1)) + 1


def typical_blocks(text_bytes: float, tokens_per_sample: int) -> float:
    return text_bytes / (TYPICAL_BYTES_PER_TOKEN * TYPICAL_FILL * (tokens_per_sample - 1))


def plan_valid_docs(
    corpus: Path, docs: List[List[str]], need: int, tokens_per_sample: int, least: int
) -> Tuple[int, int]:
    """(documents to hold out first, the most held out automatically) for ``need`` blocks; the data
    stage corrects the first.  ValueError when the corpus cannot give them."""
    doc_bytes = [sum(len(p.encode("utf-8")) + 1 for p in d) for d in docs]
    n = len(doc_bytes)
    if not n:
        raise ValueError(f"{corpus}: no text (a corpus is paragraphs, one a line, and a blank line between documents)")
    if least >= n:
        raise ValueError(f"{corpus}: --valid-docs {least} leaves no document to pre-train on (the corpus has {n})")
    cap = max(least, min(n - 1, n // MAX_SHARE))
    if not need:
        return least, cap
    largest = sum(sorted(doc_bytes, reverse=True)[:cap])
    if most_blocks(largest, tokens_per_sample) < need:
        raise ValueError(
            f"{corpus}: too little text for the validation: {cap} of its {n} documents (the most held out) "
            f"give fewer than {need} blocks of {tokens_per_sample} tokens, and every run needs {need} "
            "(a batch, and --probe-size blocks for the probe); use a larger corpus, a smaller --probe-size, "
            "--batch-size or --tokens-per-sample, or --validate-every 0"
        )
    per_doc = typical_blocks(sum(doc_bytes) / n, tokens_per_sample)
    return min(cap, max(least, math.ceil(MARGIN * need / per_doc))), cap


def plan_held_out(corpus: Path, docs: List[List[str]], batch_sizes: Iterable[int], settings, least: int) -> dict:
    """A plan's ``valid_docs``, ``valid_blocks`` and ``max_valid_docs``: the blocks every run of the
    ``PretrainSettings`` ``settings`` needs (none without validation), held out of ``docs``."""
    need = blocks_needed(batch_sizes, settings.probe_size, settings.fairseq_args) if settings.validate_every else 0
    first, most = plan_valid_docs(corpus, docs, need, settings.tokens_per_sample, least)
    return {"valid_docs": first, "valid_blocks": need, "max_valid_docs": most}


def more_valid_docs(valid_docs: int, blocks: int, need: int, cap: int) -> int:
    """Documents to hold out next when ``valid_docs`` gave ``blocks`` < ``need`` (``valid_docs``: no more allowed)."""
    return min(cap, max(valid_docs + 1, math.ceil(MARGIN * valid_docs * need / max(1, blocks))))


def count_blocks(data_bin: Path, split: str, tokens_per_sample: int) -> int:
    """Blocks of ``split`` as the plugin's task cuts them (``--sample-break-mode complete``)."""
    from fairseq.data import Dictionary, TokenBlockDataset, data_utils

    d = Dictionary.load(str(data_bin / "dict.txt"))
    dataset = data_utils.load_indexed_dataset(str(data_bin / split), d)
    if dataset is None or len(dataset) == 0:
        return 0
    # the task prepends [CLS] to blocks of tokens_per_sample - 1 (MaskedLMTask._load_dataset_split)
    blocks = TokenBlockDataset(
        dataset, dataset.sizes, tokens_per_sample - 1, pad=d.pad(), eos=d.eos(), break_mode="complete"
    )
    return len(blocks)


def build_data(
    data_bin: Path,
    corpus: Path,
    tokens_per_sample: int,
    valid_docs: int,
    valid_blocks: int,
    max_valid_docs: int,
    threads: int,
    tokenizer: Optional[Path] = None,
    vocab_size: Optional[int] = None,
    *,
    say: Callable[[str], None],
) -> dict:
    """``preprocess.build`` of ``corpus`` into ``data_bin`` with a valid split of at least
    ``valid_blocks`` blocks (held out again with more documents while it has fewer); the
    model's ``tokenizer`` (an import folder) or a new vocabulary of ``vocab_size``; ``say``: the
    workflow's log line.  ``{"valid_docs", "valid_blocks"}``; a :class:`StageError` when the
    corpus cannot give them."""
    from preprocess.build import build
    from preprocess.record import load_record

    options = dict(test_docs=0, workers=max(1, min(2, threads)), seed=1, max_line_pieces=tokens_per_sample - 2)
    if tokenizer is not None:
        options["tokenizer"] = str(tokenizer)
    else:
        options["vocab_size"] = vocab_size
    # This stage runs when its options or inputs changed: a finished build in the folder is
    # the earlier one, replaced file by file as its record lists (an unfinished one resumes).
    options["force"] = load_record(data_bin) is not None
    while True:
        build(data_bin, text=[corpus], valid_docs=valid_docs, **options)
        blocks = count_blocks(data_bin, "valid", tokens_per_sample) if valid_blocks else 0
        if blocks >= valid_blocks:
            return {"valid_docs": valid_docs, "valid_blocks": blocks}
        more = more_valid_docs(valid_docs, blocks, valid_blocks, max_valid_docs)
        if more <= valid_docs:
            raise StageError(
                corpus,
                f"too little text for the validation: {valid_docs} held-out documents give {blocks} blocks of "
                f"{tokens_per_sample} tokens, and every run needs {valid_blocks} (a batch, and --probe-size blocks "
                "for the probe); use a larger corpus, a smaller --probe-size or --tokens-per-sample, or "
                "--validate-every 0",
            )
        say(f"{valid_docs} held-out documents give {blocks} validation blocks of the {valid_blocks} needed: "
            f"building the data again with {more}")  # fmt: skip
        valid_docs, options["force"] = more, True
