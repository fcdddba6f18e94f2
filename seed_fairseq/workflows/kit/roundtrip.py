"""Does the import -> export round trip give back the model as the user gave it?

The tools that continue a user's model (``compare --init``, ``examples/adapt.py`` and its
study) start pre-training from its import; the model they compare with is the user's own
folder, loaded as it is.  This stage exports the import unchanged (``OUT/roundtrip/``) and
compares the vectors both folders give the retrieval tools (each in the representation
its folder declares, ``retrieval.search.load_model``: pooled, normalised when it compares
by cosine, each text cut where the folder cuts it) on a sample of the evaluation's texts and
one longer than any cut, in fp32.  The round trip is exact only when both are the same kind of
retriever (modules, similarity, text cut) and their vectors agree.
The reports say in their first sentence when the round trip is not exact (a model whose
modules the import cannot carry never gets here: it is refused before anything is written).
"""

import math
from pathlib import Path
from typing import Any, Dict, List, Sequence

from .folder import StageError

ATOL = 1e-5  # the import's and the export's own tolerance against the model they read
SAMPLE = 256  # texts compared: half queries, half passages of the evaluation split


def sample_texts(data, n: int = SAMPLE) -> List[str]:
    """Up to ``n`` texts of a retrieval split (``base.retrieval_data.RetrievalData``): its queries, then
    its passages, each in id order, half of each when both have enough."""
    queries = [data.queries[q] for q in sorted(data.query_ids())]
    docs = [data.corpus[d] for d in sorted(data.corpus)]
    take = min(len(queries), max(n // 2, n - len(docs)))
    return queries[:take] + docs[: n - take]


def describe(model) -> str:
    """``Transformer -> Pooling(mean) -> Normalize, cosine, max 256 tokens``: a loaded model's modules
    (``Normalize(at load)``: one its folder lacks, added because it compares by cosine), similarity and
    text cut."""
    from ...encoders.retrieval import representations
    from ...encoders.retrieval.search import ADDED_AT_LOAD, similarity

    parts = []
    for module in model:
        name = type(module).__name__
        mode = getattr(module, "pooling_mode", None)
        mode = "at load" if getattr(module, ADDED_AT_LOAD, False) else mode
        parts.append(f"{name}({mode})" if isinstance(mode, str) else name)
    rep = representations.of_model(model).name
    cut = f", max {model.max_seq_length} tokens"
    return " -> ".join(parts) + f", {similarity(model)}{cut}" + ("" if rep == representations.BUILT_IN else f" ({rep})")


def compare_folders(given: Path, written: Path, texts: Sequence[str], device: str) -> Dict[str, Any]:
    """The vectors of the model folder ``given`` and of its round trip ``written`` on ``texts`` and on
    their concatenation (longer than any cut), each folder cutting texts where it says: ``exact``
    when they are the same kind of retriever (modules, similarity, text cut) and agree to
    :data:`ATOL`."""
    from ...encoders.retrieval.search import encode, load_model

    models = [load_model(str(f), device) for f in (given, written)]
    kinds = [describe(m) for m in models]
    texts = [*texts, " ".join(texts)] if texts else []
    vectors = [encode(m, list(texts), batch_size=32, precision="fp32", show_progress=False) for m in models]
    if vectors[0].shape != vectors[1].shape:
        diff = math.inf
    else:
        diff = float(abs(vectors[0] - vectors[1]).max()) if len(texts) else 0.0
    return {
        "texts": len(texts),
        "max_seq_length": [m.max_seq_length for m in models],  # the given folder's cut, the round trip's
        "max_abs_diff": diff if math.isfinite(diff) else None,
        "given": kinds[0],
        "round_trip": kinds[1],
        "exact": kinds[0] == kinds[1] and diff <= ATOL,
    }


def export_and_compare(imported: Path, given: Path, out: Path, data, device: str) -> Dict[str, Any]:
    """Export the import folder's checkpoint unchanged to ``out`` (the model's own representation)
    and compare it with ``given`` on :func:`sample_texts` of ``data``; :class:`StageError` when the
    export fails."""
    from ...encoders.hf.export import ExportError, export
    from ...encoders.hf.import_ import CHECKPOINT

    try:
        export(imported / CHECKPOINT, imported, out, force=True, representation="own")
    except ExportError as e:
        raise StageError(out, f"export failed: {e}") from None
    return compare_folders(given, out, sample_texts(data), device)


def first_sentence(check: Dict[str, Any], model: str) -> str:
    """The reports' first sentence when the round trip is not exact ("" when it is)."""
    if not check or check.get("exact", True):
        return ""
    diff = check.get("max_abs_diff")
    differ = "differ in their modules or size" if diff is None else f"differ by up to {diff:.2g}"
    kinds = (
        f"; given: {check['given']}, round trip: {check['round_trip']}"
        if check.get("given") != check.get("round_trip")
        else ""
    )
    return (
        f"**The import -> export round trip does not reproduce `{model}` exactly**: its vectors and the re-exported "
        f"model's {differ} on {check['texts']} texts of the evaluation (tolerance {ATOL:g}{kinds}). Continued "
        "pre-training starts from the round trip, so part of every difference to the model as given below is the "
        "round trip's, not the pre-training's."
    )


def statement(check: Dict[str, Any]) -> str:
    """One sentence for the reports' notes: what was checked, and the result."""
    if not check:
        return ""
    diff = check.get("max_abs_diff")
    result = "exact" if check.get("exact") else "NOT exact"
    return (
        f"The import -> export round trip (`roundtrip/`) was compared with the model as given on {check['texts']} "
        f"texts of the evaluation: {result} (max abs difference of their vectors "
        f"{'-' if diff is None else f'{diff:.2g}'}, tolerance {ATOL:g}; {check['given']})."
    )
