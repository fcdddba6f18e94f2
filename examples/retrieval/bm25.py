"""BM25 with bm25s: the sparse baseline and the source of DPR-style hard negatives.

    python examples/retrieval/bm25.py --data DIR --split test --run bm25.trec

prints the metrics as one JSON object on its last line.
"""
import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

import bm25s

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.retrieval.data import DataFormatError, load_data  # noqa: E402
from examples.retrieval.metrics import evaluate, write_trec_run  # noqa: E402


class BM25:
    """Lucene-variant BM25 (k1=0.9, b=0.4: Anserini's MS MARCO defaults) over a corpus dict."""

    def __init__(self, corpus: Dict[str, str], k1: float = 0.9, b: float = 0.4,
                 stopwords: Optional[str] = "en", show_progress: bool = False):
        self.doc_ids: List[str] = list(corpus)
        self.stopwords = stopwords
        self.show_progress = show_progress
        self.model = bm25s.BM25(k1=k1, b=b, method="lucene")
        tokens = bm25s.tokenize([corpus[d] for d in self.doc_ids], stopwords=stopwords,
                                show_progress=show_progress)
        self.model.index(tokens, show_progress=show_progress)

    def retrieve(self, queries: Dict[str, str], k: int = 1000) -> Dict[str, Dict[str, float]]:
        """Top-k per query; documents with score 0 (no shared term) are left out.

        Zero-score documents come back in arbitrary order, so listing them would
        rank unrelated passages by accident.
        """
        qids = list(queries)
        k = min(k, len(self.doc_ids))
        if not qids or k == 0:
            return {q: {} for q in qids}
        # strings, not ids: ids from a second tokenize() call would use a new vocabulary
        q_tokens = bm25s.tokenize([queries[q] for q in qids], stopwords=self.stopwords,
                                  return_ids=False, show_progress=False)
        docs, scores = self.model.retrieve(q_tokens, k=k, show_progress=self.show_progress, n_threads=1)
        run: Dict[str, Dict[str, float]] = {}
        for qid, drow, srow in zip(qids, docs, scores):
            run[qid] = {self.doc_ids[int(i)]: float(s) for i, s in zip(drow, srow) if s > 0}
        return run


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="BEIR or MS MARCO folder")
    p.add_argument("--split", default="test")
    p.add_argument("--run", help="write the TREC run here")
    p.add_argument("--k", type=int, default=1000)
    p.add_argument("--k1", type=float, default=0.9)
    p.add_argument("--b", type=float, default=0.4)
    args = p.parse_args(argv)
    try:
        data = load_data(args.data, args.split)
    except DataFormatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    bm25 = BM25(data.corpus, k1=args.k1, b=args.b, show_progress=True)
    run = bm25.retrieve({q: data.queries[q] for q in data.query_ids()}, k=args.k)
    if args.run:
        write_trec_run(run, args.run, tag="bm25")
    metrics = evaluate(data.qrels, run)
    metrics["num_queries"] = len(data.query_ids())
    print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
