"""IR metrics with ir_measures, TREC run files, and a paired permutation test.

    python examples/retrieval/metrics.py --data DIR --split test --run A.trec [--baseline B.trec]

prints the metrics of A (and B, and the two-sided p-value of A vs B per
metric) as one JSON object on its last line.
"""

import math
import sys
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Tuple

import ir_measures
import numpy as np

from ...base.fileio import OutputError, atomic_path, check_parents, naming
from ...base.retrieval_data import DataFormatError

# Display name -> ir_measures measure.  ir_measures calls MRR "RR"; MS MARCO
# and the paper call it MRR@10, so the JSON keys use the familiar names.
MEASURES = {
    "MRR@10": ir_measures.RR @ 10,
    "R@100": ir_measures.R @ 100,
    "R@1000": ir_measures.R @ 1000,
    "nDCG@10": ir_measures.nDCG @ 10,
}

# what the dev curve of fine-tuning records at every evaluation (curve.py; --eval-k covers them)
CURVE_METRICS = ("MRR@10", "R@100", "nDCG@10")


def cutoff(name: str) -> int:
    """The rank a metric looks down to (``R@100``: 100)."""
    return int(MEASURES[name].params["cutoff"])


def check_depth(k: int, names: Sequence[str] = tuple(MEASURES), flag: str = "--k") -> None:
    """ValueError when runs of ``k`` documents per query are too shallow for a metric of ``names``:
    a recall at 100 of a run of 5 documents is a recall at 5, printed as R@100."""
    deepest = max(names, key=cutoff)
    if k < cutoff(deepest):
        raise ValueError(
            f"{flag} {k} is below the cutoff of {deepest}, which the tool reports: a run of {k} documents per "
            f"query would make it a measure at {k}; use {flag} {cutoff(deepest)} or more"
        )


def measured_at(k: int) -> Tuple[str, ...]:
    """The metrics a run of ``k`` documents per query can report (their cutoff is at most ``k``)."""
    return tuple(n for n in MEASURES if cutoff(n) <= k)


Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]


def per_query(qrels: Qrels, run: Run, names: Sequence[str] = tuple(MEASURES)) -> Dict[str, Dict[str, float]]:
    """{measure name: {qid: value}} over every query of ``qrels`` with a relevant document.

    ir_measures (pytrec_eval) only reports queries present in the run; a judged
    query that retrieved nothing must count as 0 (trec_eval ``-c``), otherwise
    a system could look better by returning nothing for hard queries, and the
    paired test would compare different query sets.

    Raises ValueError when no query has a relevant document: the mean over no
    query is not 0, and printing 0.0 would look like a real (bad) result.
    """
    judged = [q for q, rels in qrels.items() if any(r > 0 for r in rels.values())]
    if not judged:
        raise ValueError("no judged query (none has a document with relevance > 0): nothing to evaluate")
    measures = [MEASURES[n] for n in names]
    values = {n: {q: 0.0 for q in judged} for n in names}
    by_measure = {m: n for n, m in zip(names, measures)}
    qrels_j = {q: dict(qrels[q]) for q in judged}
    run_j = {q: dict(run[q]) for q in judged if q in run and len(run[q])}
    if run_j:
        for metric in ir_measures.iter_calc(measures, qrels_j, run_j):
            values[by_measure[metric.measure]][metric.query_id] = float(metric.value)
    return values


def aggregate(values: Mapping[str, Mapping[str, float]]) -> Dict[str, float]:
    empty = [n for n, v in values.items() if not v]
    if empty:
        raise ValueError(f"no query values for {', '.join(empty)}: a mean over no query is not a result")
    return {n: float(np.mean(list(v.values()))) for n, v in values.items()}


def evaluate(qrels: Qrels, run: Run, names: Sequence[str] = tuple(MEASURES)) -> Dict[str, float]:
    return aggregate(per_query(qrels, run, names))


def permutation_test(a: Sequence[float], b: Sequence[float], n_resamples: int = 10000, seed: int = 0) -> float:
    """Two-sided paired randomisation test on the mean difference.

    The IR test of Smucker, Allan & Carterette (CIKM 2007) that the paper used:
    under H0 the two systems' labels are exchangeable per query, so each
    per-query difference keeps or flips its sign with probability 1/2.
    p = (1 + #{|mean(sign * d)| >= |mean(d)|}) / (1 + n_resamples).  Written
    out (a few lines of numpy) rather than via scipy.stats.permutation_test
    because scipy's two-sided p is twice the smaller one-sided p, which
    differs from the |mean| statistic used in IR, and because a p-value is
    never 0 with the +1 correction.  All 2^n sign patterns are enumerated
    exactly when there are at most 2^16 of them.
    """
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if d.shape != np.asarray(b).shape or d.ndim != 1:
        raise ValueError("paired samples must be 1-D and of equal length")
    n = len(d)
    if n == 0:
        raise ValueError("no paired values: a p-value needs at least one query")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    observed = abs(d.mean())
    # tolerance: float sums in a different order must not turn a tie into "less extreme"
    tol = 1e-12 * max(1.0, np.abs(d).max())
    if n <= 16:
        patterns = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1) * 2 - 1
        stats = np.abs(patterns @ d) / n
        return float(np.mean(stats >= observed - tol))
    rng = np.random.default_rng(seed)
    hits, done = 0, 0
    while done < n_resamples:
        m = min(2000, n_resamples - done)
        signs = rng.integers(0, 2, size=(m, n), dtype=np.int8) * 2 - 1
        hits += int(np.sum(np.abs(signs @ d) / n >= observed - tol))
        done += m
    return (hits + 1) / (n_resamples + 1)


def compare(
    qrels: Qrels,
    run_a: Run,
    run_b: Run,
    names: Sequence[str] = tuple(MEASURES),
    n_resamples: int = 10000,
    seed: int = 0,
) -> Dict[str, float]:
    """p-value of A vs B for each metric, paired over the judged queries."""
    va, vb = per_query(qrels, run_a, names), per_query(qrels, run_b, names)
    return {n: query_permutation_test(va[n], vb[n], n_resamples, seed) for n in names}


def query_permutation_test(
    a: Mapping[str, float], b: Mapping[str, float], n_resamples: int = 10000, seed: int = 0
) -> float:
    """``permutation_test`` of two systems' per-query values ({query id: value}), paired by query id
    in sorted order (the order fixes the resampling, so the same values always give the same p)."""
    if sorted(a) != sorted(b):
        raise ValueError("the two systems were evaluated on different queries")
    qids = sorted(a)
    return permutation_test([a[q] for q in qids], [b[q] for q in qids], n_resamples, seed)


# ---------------------------------------------------------------------------
# TREC run files
# ---------------------------------------------------------------------------


def _trec_line_problem(line: str) -> Optional[str]:
    """None for a valid ``qid Q0 docid rank score tag`` line, else what is wrong."""
    cols = line.split()
    if len(cols) != 6:
        return f"expected 6 columns (qid Q0 docid rank score tag), found {len(cols)}"
    try:
        int(cols[3])
    except ValueError:
        return f"rank {cols[3]!r} is not an integer"
    try:
        score = float(cols[4])
    except ValueError:
        return f"score {cols[4]!r} is not a number"
    if not math.isfinite(score):
        return f"score {cols[4]!r} is not a finite number"
    return None


def _run_lines(path: Path):
    """(line number, text) of the non-blank lines; bad UTF-8 is a DataFormatError with its line."""
    if not path.is_file():
        # a folder or a FIFO is not read: opening a FIFO would wait forever for a writer
        raise DataFormatError(path, None, "not a regular file" if path.exists() else "file not found")
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DataFormatError(path, None, f"cannot read: {e.strerror}") from None
    with f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataFormatError(path, lineno, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
            if line.strip():
                yield lineno, line


def is_trec_run(path) -> bool:
    """Is ``path`` an empty file or a readable TREC run?  (Reads the whole file:
    a run that only starts like one is someone else's file.)"""
    try:
        return all(_trec_line_problem(line) is None for _, line in _run_lines(Path(path)))
    except DataFormatError:
        return False


def check_run_output(path) -> Path:
    """May a tool write its TREC run to ``path``?  Raises :class:`OutputError` if not.

    A run file is the tool's own output when it reads as a TREC run (or is
    empty): rerunning the same command must be able to replace it.  Anything
    else (a folder, a device such as /dev/null, a corpus passed by mistake) is
    the user's and is never overwritten.  Called before the work starts, so a
    bad ``--run`` costs nothing, and again by :func:`write_trec_run`.
    """
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise OutputError(path, "is a broken symbolic link")
    if not path.exists():
        check_parents(path)
        return path
    if path.is_dir():
        raise OutputError(path, "is a folder, not a TREC run file")
    if not path.is_file():
        raise OutputError(path, "exists and is not a regular file; refusing to replace it")
    if not is_trec_run(path):
        raise OutputError(
            path,
            "exists and is not a TREC run file (qid Q0 docid rank score tag); "
            "refusing to overwrite it: choose another --run",
        )
    return path


def write_trec_run(run: Run, path, tag: str = "dense") -> Path:
    """Write ``run`` atomically; an existing file is replaced only if it is a TREC run.
    A full disk or file-size limit raises the ``OSError`` naming ``path``."""
    path = check_run_output(path)
    with naming(path), atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for qid, docs in run.items():
            ranked = sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))
            for rank, (did, score) in enumerate(ranked, 1):
                f.write(f"{qid} Q0 {did} {rank} {score:.6f} {tag}\n")
    return path


def read_trec_run(path) -> Dict[str, Dict[str, float]]:
    """``qid Q0 docid rank score tag`` lines; errors name the file and line."""
    path = Path(path)
    run: Dict[str, Dict[str, float]] = {}
    first: Dict[tuple, int] = {}
    for lineno, line in _run_lines(path):
        problem = _trec_line_problem(line)
        if problem:
            raise DataFormatError(path, lineno, problem)
        cols = line.split()
        # a document listed twice for a query would silently keep the last score
        if (cols[0], cols[2]) in first:
            raise DataFormatError(
                path,
                lineno,
                f"document {cols[2]!r} listed twice for query {cols[0]!r} (first on line {first[cols[0], cols[2]]})",
            )
        first[cols[0], cols[2]] = lineno
        run.setdefault(cols[0], {})[cols[2]] = float(cols[4])
    return run


def check_run_covers(run: Run, qrels: Qrels, path) -> None:
    """Refuse a run that shares no query with the judged queries (the wrong
    split or file: every metric would print as 0); warn about partial coverage."""
    judged = {q for q, rels in qrels.items() if any(r > 0 for r in rels.values())}
    if not run:
        raise DataFormatError(path, None, "the run file is empty: no ranking to evaluate")
    hit = judged & {q for q, docs in run.items() if docs}
    if not hit:
        raise DataFormatError(
            path,
            None,
            f"none of its {len(run)} queries is a judged query of the qrels (wrong split or wrong run file?)",
        )
    if len(hit) < len(judged):
        print(
            f"warning: {path}: {len(judged) - len(hit)} of {len(judged)} judged queries have no ranking "
            "(each counts as 0)",
            file=sys.stderr,
        )
