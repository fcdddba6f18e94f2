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

from examples.retrieval.common import (  # noqa: E402
    OutputError,
    nonneg_float,
    positive_int,
    report,
    unit_interval,
)
from examples.retrieval.data import DataFormatError, load_data  # noqa: E402
from examples.retrieval.metrics import check_run_output, evaluate, write_trec_run  # noqa: E402


class BM25:
    """Lucene-variant BM25 (k1=0.9, b=0.4: Anserini's MS MARCO defaults) over a corpus dict.

    ``has_terms`` is False when no document has an indexable term (empty texts
    or stop words only): bm25s cannot index that (``max()`` of an empty
    vocabulary), and every query then retrieves nothing.
    """

    def __init__(
        self,
        corpus: Dict[str, str],
        k1: float = 0.9,
        b: float = 0.4,
        stopwords: Optional[str] = "en",
        show_progress: bool = False,
    ):
        if not corpus:
            raise ValueError("BM25 needs at least one document: the corpus is empty")
        self.doc_ids: List[str] = list(corpus)
        self.stopwords = stopwords
        self.show_progress = show_progress
        self.model = bm25s.BM25(k1=k1, b=b, method="lucene")
        tokens = bm25s.tokenize([corpus[d] for d in self.doc_ids], stopwords=stopwords, show_progress=show_progress)
        self.has_terms = bool(tokens.vocab)
        if self.has_terms:
            self.model.index(tokens, show_progress=show_progress)

    def retrieve(self, queries: Dict[str, str], k: int = 1000) -> Dict[str, Dict[str, float]]:
        """Top-k per query; documents with score 0 (no shared term) are left out.

        Zero-score documents come back in arbitrary order, so listing them would
        rank unrelated passages by accident.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        qids = list(queries)
        k = min(k, len(self.doc_ids))
        if not qids or not self.has_terms:
            return {q: {} for q in qids}
        # strings, not ids: ids from a second tokenize() call would use a new vocabulary
        q_tokens = bm25s.tokenize(
            [queries[q] for q in qids], stopwords=self.stopwords, return_ids=False, show_progress=False
        )
        docs, scores = self.model.retrieve(q_tokens, k=k, show_progress=self.show_progress, n_threads=1)
        run: Dict[str, Dict[str, float]] = {}
        for qid, drow, srow in zip(qids, docs, scores):
            run[qid] = {self.doc_ids[int(i)]: float(s) for i, s in zip(drow, srow) if s > 0}
        return run


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
    metrics["num_queries"] = len(data.query_ids())
    print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
