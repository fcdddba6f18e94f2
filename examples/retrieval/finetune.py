#!/usr/bin/env python
"""Fine-tune an exported encoder as a shared-weight dual encoder ([CLS], dot product).

    python examples/retrieval/finetune.py --model HF_DIR --data DIR --split train --out OUT_DIR \\
        [--negatives bm25|ance|none] [--loss mnrl|triplet] [--train-fraction F] [--eval-every N]

* ``--negatives bm25`` (default): the paper's "DPR (BM25 Neg)": in-batch
  negatives plus hard negatives sampled from the bm25s top-k of each query,
  positives excluded.
* ``--negatives ance``: ANCE-style rounds: encode the corpus with the current
  model, mine hard negatives from a faiss top-k (positives excluded), train,
  repeat (``--ance-rounds``).  Each round restarts the optimizer and the
  linear schedule (warm-up only in the first round); the original ANCE
  refreshes the index asynchronously instead, which needs a second GPU.
* ``--loss mnrl`` (default): sentence-transformers' MultipleNegativesRankingLoss
  with a raw dot product (scale 1), i.e. DPR's softmax over in-batch + hard
  negatives.  ``--loss triplet``: the paper's Eq. (4.2)
  ``relu(margin - (s(q,d+) - s(q,d-)))`` with s = dot product, via
  TripletLoss with a negative-dot-product "distance".
* ``--train-fraction F``: a deterministic subset of the training queries
  (Figure 6c/d few-shot curves); nested fractions are nested subsets.
* ``--eval-every N``: retrieval metrics on ``--dev-split`` at step 0, every
  N steps counted within each epoch (sentence-transformers'
  ``evaluation_steps``) and at every epoch end, appended as JSON lines
  ``{"step", "MRR@10", "R@100", "nDCG@10"}`` to ``OUT/curve.jsonl`` (Figure 6a/b).
* Hard negatives are documents not judged for the query.  A query with fewer
  such documents than ``--num-negatives`` (tiny corpora) gets as many as exist,
  with a note on stderr; batches only group examples with the same number of
  texts, because MultipleNegativesRankingLoss stacks them column by column.
  When no negative at all is possible (every document is judged for every
  training query, e.g. a one-passage corpus) the run stops with an error that
  names the data folder.
* ``--representation dupmae`` (the default for a folder with DupMAE's head files):
  the score is DupMAE's Eq. 12 (projected [CLS] dot + sparse dot over shared
  vocabulary indices), trained with the same losses (Eq. 13: in-batch plus hard
  negatives); the [CLS] projection and the vocabulary projection are trained
  with the encoder and saved back beside it.
* ``OUT`` is built under a temporary name beside it and renamed into place when
  complete, with ``OUT/finetune.json`` as this tool's record (it lists the
  files written).  A rerun into an earlier output needs ``--force`` and
  replaces exactly the files that record lists: anything else in ``OUT`` (notes,
  a save-dir) stays.  A non-empty folder without the record is refused.

Training uses sentence-transformers' own loop (``SentenceTransformer.old_fit``:
AdamW, linear warm-up/decay, gradient clipping, AMP on CUDA) rather than
``SentenceTransformerTrainer``, which would add the ``datasets`` and
``accelerate`` packages for no gain here.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional

from seed_fairseq.fileio import OutputError
from seed_fairseq.retrieval.cli import add_search_args, index_kwargs, report
from seed_fairseq.retrieval.data import DataFormatError, load_data
from seed_fairseq.retrieval.search import SearchError
from seed_fairseq.retrieval.training import CURVE_METRICS, FinetuneConfig, finetune_to_folder


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
