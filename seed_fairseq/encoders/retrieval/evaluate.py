"""Dense retrieval evaluation: encode the corpus, faiss top-k, ir_measures.

    python examples/retrieval/evaluate.py --model HF_DIR --data DIR --split test --run OUT.trec

HF_DIR is an exported checkpoint (examples/export_to_hf.py), a folder saved by
finetune.py or any sentence-transformers model, in its own representation
(``search.load_model``).  The metrics
(MRR@10, R@100, R@1000, nDCG@10; those whose cutoff is within --k) are printed as one JSON object on the
last line.
"""

from typing import TYPE_CHECKING, Dict, Optional, Sequence, Tuple

from ...base.retrieval_data import RetrievalData
from .metrics import check_depth, evaluate, measured_at
from .search import make_retriever

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


def evaluate_model(
    model: "SentenceTransformer",
    data: RetrievalData,
    k: int = 1000,
    batch_size: int = 64,
    precision: str = "fp32",
    index: str = "flat",
    show_progress: bool = True,
    names: Optional[Sequence[str]] = None,
    **index_kwargs,
) -> Tuple[Dict[str, float], Dict[str, Dict[str, float]]]:
    """(metrics, run) of ``model`` on the judged queries of ``data``.

    ``names``: the metrics (``metrics.MEASURES``); a ValueError, before anything is encoded,
    when one looks deeper than the ``k`` documents ranked (``metrics.check_depth``).  Without
    ``names``, the metrics a run of ``k`` documents can report (R@1000 only with k >= 1000).
    ValueError when ``data`` has no judged query (see ``metrics.per_query``),
    :class:`SearchError` for an empty corpus or index settings faiss refuses.
    """
    if names is None:
        names = measured_at(k)
    else:
        check_depth(k, names)
    retriever = make_retriever(
        model,
        data.corpus,
        batch_size=batch_size,
        precision=precision,
        index=index,
        show_progress=show_progress,
        **index_kwargs,
    )
    run = retriever.retrieve({q: data.queries[q] for q in data.query_ids()}, k=k)
    return evaluate(data.qrels, run, names), run
