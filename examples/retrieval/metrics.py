#!/usr/bin/env python
"""IR metrics with ir_measures, TREC run files, and a paired permutation test.

    python examples/retrieval/metrics.py --data DIR --split test --run A.trec [--baseline B.trec]

prints the metrics of A (and B, and the two-sided p-value of A vs B per
metric) as one JSON object on its last line.  On a retrieval set this project
derived from held-out documents (``derive_retrieval_set``: a query id names its
document), the same test over documents too (``p_value_documents``): its queries
come many to a document and are not independent.
"""

import argparse
import json
import sys
from typing import List, Optional

from seed_fairseq.base.retrieval_data import DataFormatError, load_data
from seed_fairseq.encoders.retrieval.cli import positive_int, report, seed_int
from seed_fairseq.encoders.retrieval.metrics import (
    MEASURES,
    check_run_covers,
    evaluate,
    per_query,
    read_trec_run,
)
from seed_fairseq.workflows.kit.stats import document_p, paired_p


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="BEIR or MS MARCO folder (for the qrels)")
    p.add_argument("--split", default="test")
    p.add_argument("--run", required=True, help="TREC run file to score")
    p.add_argument("--baseline", help="second TREC run: adds its metrics and p-values of RUN vs BASELINE")
    p.add_argument("--resamples", type=positive_int, default=10000)
    p.add_argument("--seed", type=seed_int, default=0)
    args = p.parse_args(argv)
    try:
        data = load_data(args.data, args.split)
        run = read_trec_run(args.run)
        check_run_covers(run, data.qrels, args.run)
        out = {"run": evaluate(data.qrels, run), "num_queries": len(data.query_ids())}
        if args.baseline:
            base = read_trec_run(args.baseline)
            check_run_covers(base, data.qrels, args.baseline)
            out["baseline"] = evaluate(data.qrels, base)
            # per-query values once, for both tests (paired_p of one run each is compare's test)
            va, vb = per_query(data.qrels, run), per_query(data.qrels, base)
            out["p_value"] = {n: paired_p([va[n]], [vb[n]], args.resamples, args.seed) for n in MEASURES}
            by_doc = {n: document_p([va[n]], [vb[n]], args.resamples, args.seed) for n in MEASURES}
            if None not in by_doc.values():
                out["p_value_documents"] = by_doc
    except DataFormatError as e:
        return report(e)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
