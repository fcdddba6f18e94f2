#!/usr/bin/env python
"""Dense retrieval evaluation: encode the corpus, faiss top-k, ir_measures.

    python examples/retrieval/evaluate.py --model HF_DIR --data DIR --split test --run OUT.trec

HF_DIR is an exported checkpoint (examples/export_to_hf.py), a folder saved by
finetune.py or any sentence-transformers model, searched with faiss in its own
representation: its modules as written (its pooling, its Normalize), compared by its
similarity (cosine: normalised vectors in the inner-product index; dot product for the
papers' [CLS] models); --representation cls takes the [CLS] vector and the dot product
instead.  A folder with DupMAE's head files (dupmae.json) is searched with DupMAE's own
representation (projected [CLS] + top-k vocabulary entries, exact combined top-k)
unless --representation own or cls.  The metrics
(MRR@10, R@100, R@1000, nDCG@10) are printed as one JSON object on the last line.
"""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import List, Optional

from seed_fairseq.base.fileio import OutputError
from seed_fairseq.base.retrieval_data import DataFormatError, load_data
from seed_fairseq.encoders.retrieval.cli import add_search_args, index_kwargs, positive_int, report, report_storage
from seed_fairseq.encoders.retrieval.evaluate import evaluate_model
from seed_fairseq.encoders.retrieval.index import SearchError
from seed_fairseq.encoders.retrieval.metrics import check_run_output, write_trec_run
from seed_fairseq.encoders.retrieval.search import length_source, load_model


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="sentence-transformers / exported HF folder")
    p.add_argument("--data", required=True, help="BEIR or MS MARCO folder")
    p.add_argument("--split", default="test")
    p.add_argument("--run", help="write the TREC run here (an existing file only if it is a TREC run)")
    p.add_argument("--k", type=positive_int, default=1000, help="documents retrieved per query")
    add_search_args(p)
    args = p.parse_args(argv)
    t0 = time.time()
    try:
        if args.run:
            check_run_output(args.run)  # before encoding anything: a bad --run costs nothing
        data = load_data(args.data, args.split)
        model = load_model(args.model, args.device, args.max_seq_length, args.representation, args.sparse_top_k)
        print(length_source(model, args.max_seq_length), file=sys.stderr)
        metrics, run = evaluate_model(
            model,
            data,
            k=args.k,
            batch_size=args.batch_size,
            precision=args.precision,
            index=args.index,
            **index_kwargs(args),
        )
        if args.run:
            # the TREC tag is one whitespace-free token; model folder names may hold blanks
            tag = "_".join((Path(args.model).resolve().name or "dense").split())
            write_trec_run(run, args.run, tag=tag)
    except (DataFormatError, OutputError, SearchError) as e:
        return report(e)
    except OSError as e:  # a full disk or file-size limit while writing --run
        return report_storage(e)
    metrics.update(num_queries=len(data.query_ids()), num_docs=len(data.corpus), seconds=round(time.time() - t0, 1))
    print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
