"""What the comparison checks before its first stage, with ``--out`` untouched (beside the checks every
workflow makes: ``kit.checks``).

Each of these used to fail only after the data, the generator and pre-training
had run: a retrieval split without judged queries in the evaluation, an
``--init`` model with fewer positions than ``--tokens-per-sample`` in
fairseq-train.  Each is refused here with one ``error:`` line (a ValueError
whose text is ``FILE: problem``).  The held-out set is planned in ``kit/heldout.py``.
"""

import argparse
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence

from ...base.retrieval_data import DataFormatError, load_data
from ..kit.checks import init_positions
from ..kit.corpus import write_retrieval_set
from .plan import Plan


def _max_positions(args: Sequence[str]) -> Optional[int]:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--max-positions", type=int, default=None)
    return p.parse_known_args(list(args))[0].max_positions


def check_positions(plan: Plan) -> None:
    """--tokens-per-sample, --max-seq-length and --cos-lengths against the pre-trained models' positions."""
    s = plan.pretrain
    tps = s.tokens_per_sample
    if plan.init:
        positions = init_positions(plan.init)
        if positions is None:
            return
        if tps > positions:
            raise ValueError(
                f"{plan.init / 'config.json'}: the --init model has {positions} positions (max_position_embeddings, "
                f"less the padding rows of RoBERTa-style models), fewer than --tokens-per-sample {tps}; "
                f"use --tokens-per-sample {positions} or less"
            )
        whose = "the --init model's"
    else:
        positions = _max_positions([*s.encoder_args, *s.fairseq_args]) or tps
        whose = "--tokens-per-sample" if positions == tps else "--max-positions"
    if plan.max_seq_length > positions:
        raise ValueError(
            f"--max-seq-length {plan.max_seq_length} is more than the {positions} positions of the pre-trained "
            f"models ({whose}); use {positions} or less"
        )
    if plan.cos_lengths and min(plan.cos_lengths) > positions:
        raise ValueError(
            f"--cos-lengths: every length is more than the {positions} positions of the pre-trained models "
            f"({whose}); give lengths of {positions} or less"
        )


def check_retrieval_splits(plan: Plan, docs: List[List[str]]) -> None:
    """--train-split and --test-split exist and have judged queries."""
    wanted = {"--train-split": plan.train_split, "--test-split": plan.test_split}
    if plan.retrieval_data is not None:
        for flag, split in wanted.items():
            try:
                load_data(plan.retrieval_data, split)
            except DataFormatError as e:  # no such split, no judged query, a malformed line, ...
                raise ValueError(f"{e} ({flag} {split})") from None
        return
    # the retrieval stage's own derivation (cheap: sentence splitting), into a folder that is thrown away
    with tempfile.TemporaryDirectory(prefix="compare-retrieval-") as tmp:
        queries = write_retrieval_set(docs, plan.retrieval_docs, Path(tmp)).queries
    for flag, split in wanted.items():
        if split not in queries:
            raise ValueError(
                f"{flag} {split!r}: the retrieval set derived from --corpus has the splits "
                f"{', '.join(queries)} (or give --retrieval-data)"
            )
        if not queries[split]:
            raise ValueError(
                f"{plan.corpus}: the retrieval set derived from it has no {split} query ({flag}): a query is one "
                "sentence of a paragraph of 3 or more sentences; use a corpus with longer paragraphs, more "
                "--retrieval-docs, or --retrieval-data"
            )


def check_plan(plan: Plan, docs: List[List[str]]) -> None:
    """Everything that can be refused before the first stage (ValueError, DataFormatError, HFImportError)."""
    check_positions(plan)
    check_retrieval_splits(plan, docs)
