"""BM25 with bm25s: the sparse baseline and the source of DPR-style hard negatives.

    python examples/retrieval/bm25.py --data DIR --split test --run bm25.trec

prints the metrics as one JSON object on its last line.
"""

from typing import Dict, List, Optional

import bm25s


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
