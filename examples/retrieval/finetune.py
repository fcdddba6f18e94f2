#!/usr/bin/env python
"""Fine-tune an exported encoder as a shared-weight dual encoder: the driver of
``seed_fairseq.encoders.retrieval.training`` (its docstring, printed by ``--help``, says what
every option does; docs/retrieval.md)."""

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional

from seed_fairseq.base.fileio import OutputError
from seed_fairseq.base.retrieval_data import DataFormatError, load_data
from seed_fairseq.encoders.retrieval import training
from seed_fairseq.encoders.retrieval.cli import add_search_args, index_kwargs, report
from seed_fairseq.encoders.retrieval.index import SearchError
from seed_fairseq.encoders.retrieval.metrics import CURVE_METRICS
from seed_fairseq.encoders.retrieval.training import FinetuneConfig, finetune_to_folder


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=training.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="exported HF / sentence-transformers folder to start from")
    p.add_argument("--data", required=True, help="BEIR or MS MARCO folder")
    p.add_argument("--split", default="train")
    p.add_argument(
        "--out",
        required=True,
        help="where the fine-tuned sentence-transformers model goes: a new or empty folder, or (with --force) "
        "an earlier output of this tool (it has finetune.json)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier output in --out: exactly the files its finetune.json lists; anything else in "
        "the folder stays, and any other non-empty folder is refused, with or without --force",
    )
    p.add_argument(
        "--dev-split",
        default=None,
        help="split for the dev curve (default with --eval-every: 'dev' if the folder has it)",
    )
    FinetuneConfig.add_args(p)
    add_search_args(p)
    args = p.parse_args(argv)
    cfg = FinetuneConfig.from_args(args)
    try:
        cfg.validate()  # flag combinations (e.g. --loss triplet --negatives none)
    except ValueError as e:
        p.error(str(e))
    data_dir = Path(args.data)
    dev_split = args.dev_split
    # dev evaluation re-encodes the whole corpus: only when a curve is asked for
    if dev_split is None and args.eval_every > 0:
        if (data_dir / "qrels" / "dev.tsv").is_file() or (data_dir / "qrels.dev.tsv").is_file():
            dev_split = "dev"
    try:
        train = load_data(data_dir, args.split)
        dev = load_data(data_dir, dev_split) if dev_split else None
        summary = finetune_to_folder(
            args.model,
            train,
            cfg,
            Path(args.out),
            dev=dev,
            device=args.device,
            max_seq_length=args.max_seq_length,
            index_kw=index_kwargs(args),
            representation=args.representation,
            sparse_top_k=args.sparse_top_k,
            force=args.force,
        )
    except (DataFormatError, OutputError, SearchError) as e:
        return report(e)
    last = summary["curve"][-1] if summary["curve"] else {}
    result = {"out": str(args.out), "steps": summary["steps"], "train_queries": summary["train_queries"]}
    print(json.dumps({**result, **{k: v for k, v in last.items() if k in CURVE_METRICS}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
