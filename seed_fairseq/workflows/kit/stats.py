"""Aggregation over pre-training seeds, and the paired test against the baseline.

* :func:`mean_std`: the mean and the sample standard deviation (``ddof=1``; 0 for
  one seed, where no spread can be measured -- the table then shows ``n=1``).
* :func:`seed_mean_per_query`: a system's per-query values averaged over its seeds.
* :func:`paired_p`: the two-sided paired permutation test
  (``seed_fairseq.encoders.retrieval.metrics.permutation_test``) of system A against system
  B over the queries, each query's value being its mean over the seeds.  Averaging
  over seeds first keeps the test's unit the query (the seeds are not independent
  samples of the query population) and makes it see the seed-averaged systems.
* :func:`document_p`: the same test with the document as its unit, for a derived
  retrieval set, whose queries come several to each held-out document and are
  not independent: a difference that holds for one document's queries and not for
  another's is significant over the queries more readily than over the documents.
"""

import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ...base.derived_set import query_document
from ...encoders.retrieval.metrics import permutation_test, query_permutation_test

PerQuery = Mapping[str, float]


def mean_std(values: Sequence[float]) -> Dict[str, Optional[float]]:
    """{"mean", "std", "n"}; std is the sample standard deviation (None for no value)."""
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return {"mean": None, "std": None, "n": 0}
    mean = sum(vals) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "n": n}


def aggregate_seeds(per_seed: Sequence[Mapping[str, float]]) -> Dict[str, Dict[str, Optional[float]]]:
    """[{metric: value} of each seed] -> {metric: mean_std}; every seed must report every metric."""
    if not per_seed:
        return {}
    names = list(per_seed[0])
    for i, row in enumerate(per_seed):
        if set(row) != set(names):
            raise ValueError(f"seed #{i} reports {sorted(row)}, the first seed {sorted(names)}")
    return {n: mean_std([row[n] for row in per_seed]) for n in names}


def seed_mean_per_query(per_seed: Sequence[PerQuery]) -> Dict[str, float]:
    """{qid: mean over seeds}; every seed must cover the same queries (the judged queries of one split)."""
    if not per_seed:
        raise ValueError("no seed to average")
    qids = sorted(per_seed[0])
    for i, row in enumerate(per_seed):
        if sorted(row) != qids:
            raise ValueError(f"seed #{i} has other queries than the first seed")
    return {q: sum(row[q] for row in per_seed) / len(per_seed) for q in qids}


def _paired_means(a: Sequence[PerQuery], b: Sequence[PerQuery]) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Both systems' seed-averaged per-query values, which must cover the same queries."""
    ma, mb = seed_mean_per_query(a), seed_mean_per_query(b)
    if sorted(ma) != sorted(mb):
        raise ValueError("the two systems were evaluated on different queries")
    return ma, mb


def paired_p(a: Sequence[PerQuery], b: Sequence[PerQuery], n_resamples: int = 10000, seed: int = 0) -> float:
    """p-value of A vs B: paired permutation test over the queries of the seed-averaged values."""
    return query_permutation_test(*_paired_means(a, b), n_resamples=n_resamples, seed=seed)


def document_p(
    a: Sequence[PerQuery], b: Sequence[PerQuery], n_resamples: int = 10000, seed: int = 0
) -> Optional[float]:
    """p-value of A vs B over the documents of a derived set: each document's value is the sum over
    its queries of the seed-averaged scores, so the statistic (|mean over documents of A - B|) is
    the per-query test's up to a constant factor (every query weighs alike) and only its null
    distribution changes: whole documents keep or flip their sign.  None when a query id is not a
    derived one (``query_document``) or the queries come from fewer than 2 documents."""
    ma, mb = _paired_means(a, b)
    docs: Dict[str, List[str]] = {}
    for q in sorted(ma):
        d = query_document(q)
        if d is None:
            return None
        docs.setdefault(d, []).append(q)
    if len(docs) < 2:
        return None
    names = sorted(docs)
    sum_a = [sum(ma[q] for q in docs[d]) for d in names]
    sum_b = [sum(mb[q] for q in docs[d]) for d in names]
    return permutation_test(sum_a, sum_b, n_resamples=n_resamples, seed=seed)


def fmt_mean_std(agg: Mapping[str, Optional[float]], digits: int = 3) -> str:
    if not agg or agg.get("mean") is None:
        return "-"
    if agg.get("n", 1) > 1:
        return f"{agg['mean']:.{digits}f} ± {agg['std']:.{digits}f}"
    return f"{agg['mean']:.{digits}f}"


def fmt_p(p: Optional[float]) -> str:
    return "-" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"
