#!/usr/bin/env python
"""BM25 with bm25s: the sparse baseline and the source of DPR-style hard negatives.

    python examples/retrieval/bm25.py --data DIR --split test --run bm25.trec

prints the metrics as one JSON object on its last line.
"""

import argparse
import json
import sys
from typing import List, Optional

from seed_fairseq.base.fileio import OutputError
from seed_fairseq.base.retrieval_data import DataFormatError, load_data
from seed_fairseq.encoders.retrieval.bm25 import BM25
from seed_fairseq.encoders.retrieval.cli import nonneg_float, positive_int, report, report_storage, unit_interval
from seed_fairseq.encoders.retrieval.metrics import check_run_output, evaluate, write_trec_run


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="BEIR or MS MARCO folder")
    p.add_argument("--split", default="test")
    p.add_argument("--run", help="write the TREC run here (an existing file only if it is a TREC run)")
    p.add_argument("--k", type=positive_int, default=1000)
    p.add_argument("--k1", type=nonneg_float, default=0.9)
    p.add_argument("--b", type=unit_interval, default=0.4)
    args = p.parse_args(argv)
    try:
        if args.run:
            check_run_output(args.run)  # before the work: a bad --run costs nothing
        data = load_data(args.data, args.split)
        bm25 = BM25(data.corpus, k1=args.k1, b=args.b, show_progress=True)
        if not bm25.has_terms:
            # every metric would be 0 for a reason that has nothing to do with BM25
            raise DataFormatError(
                data.corpus_path, None, "no document has an indexable term (every text is empty or only stop words)"
            )
        run = bm25.retrieve({q: data.queries[q] for q in data.query_ids()}, k=args.k)
        metrics = evaluate(data.qrels, run)
        if args.run:
            write_trec_run(run, args.run, tag="bm25")
    except (DataFormatError, OutputError) as e:
        return report(e)
    except OSError as e:  # a full disk or file-size limit while writing --run
        return report_storage(e)
    metrics["num_queries"] = len(data.query_ids())
    print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
