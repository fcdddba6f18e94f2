"""Dense retrieval evaluation: encode the corpus, faiss top-k, ir_measures.

    python examples/retrieval/evaluate.py --model HF_DIR --data DIR --split test --run OUT.trec

HF_DIR is an exported checkpoint (examples/export_to_hf.py) or a folder saved by
finetune.py: a sentence-transformers model with [CLS] pooling.  The metrics
(MRR@10, R@100, R@1000, nDCG@10) are printed as one JSON object on the last line.
"""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.retrieval.common import OutputError, positive_int, report  # noqa: E402
from examples.retrieval.data import DataFormatError, RetrievalData, load_data  # noqa: E402
from examples.retrieval.metrics import check_run_output, evaluate, write_trec_run  # noqa: E402
from examples.retrieval.search import INDEX_PRESETS, DenseRetriever, SearchError, load_model  # noqa: E402


def evaluate_model(
    model,
    data: RetrievalData,
    k: int = 1000,
    batch_size: int = 64,
    precision: str = "fp32",
    index: str = "flat",
    show_progress: bool = True,
    **index_kwargs,
) -> Tuple[Dict[str, float], Dict[str, Dict[str, float]]]:
    """(metrics, run) of ``model`` on the judged queries of ``data``.

    ValueError when ``data`` has no judged query (see ``metrics.per_query``),
    :class:`SearchError` for an empty corpus or index settings faiss refuses.
    """
    retriever = DenseRetriever(
        model,
        data.corpus,
        batch_size=batch_size,
        precision=precision,
        index=index,
        show_progress=show_progress,
        **index_kwargs,
    )
    run = retriever.retrieve({q: data.queries[q] for q in data.query_ids()}, k=k)
    return evaluate(data.qrels, run), run


def add_search_args(p: argparse.ArgumentParser):
    g = p.add_argument_group("encoding and search")
    g.add_argument("--batch-size", type=positive_int, default=64, help="encoding batch size")
    g.add_argument(
        "--max-seq-length",
        type=positive_int,
        default=None,
        help="truncate queries and passages (default: the model's setting)",
    )
    g.add_argument(
        "--precision",
        choices=("fp32", "fp16", "bf16"),
        default="fp16",
        help="autocast dtype for encoding on CUDA (CPU always runs fp32)",
    )
    g.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    g.add_argument(
        "--index",
        default="flat",
        help=f"faiss index: {', '.join(INDEX_PRESETS)} or any faiss.index_factory string "
        "(always inner product; flat = exact, the default)",
    )
    g.add_argument("--nlist", type=positive_int, default=1024, help="IVF lists")
    g.add_argument("--nprobe", type=positive_int, default=32, help="IVF lists probed per query")
    g.add_argument("--pq-m", type=positive_int, default=64, help="PQ sub-quantizers (must divide the dimension)")
    g.add_argument("--hnsw-m", type=positive_int, default=32)
    g.add_argument("--ef-search", type=positive_int, default=128)


def index_kwargs(args) -> dict:
    return dict(nlist=args.nlist, nprobe=args.nprobe, pq_m=args.pq_m, hnsw_m=args.hnsw_m, ef_search=args.ef_search)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="sentence-transformers / exported HF folder")
    p.add_argument("--data", required=True, help="BEIR or MS MARCO folder")
    p.add_argument("--split", default="test")
    p.add_argument("--run", help="write the TREC run here (an existing file only if it is a TREC run)")
    p.add_argument("--k", type=positive_int, default=1000, help="documents retrieved per query")
    add_search_args(p)
    args = p.parse_args(argv)
    t0 = time.time()
    try:
        if args.run:
            check_run_output(args.run)  # before encoding anything: a bad --run costs nothing
        data = load_data(args.data, args.split)
        model = load_model(args.model, args.device, args.max_seq_length)
        metrics, run = evaluate_model(
            model,
            data,
            k=args.k,
            batch_size=args.batch_size,
            precision=args.precision,
            index=args.index,
            **index_kwargs(args),
        )
        if args.run:
            # the TREC tag is one whitespace-free token; model folder names may hold blanks
            tag = "_".join((Path(args.model).resolve().name or "dense").split())
            write_trec_run(run, args.run, tag=tag)
    except (DataFormatError, OutputError, SearchError) as e:
        return report(e)
    metrics.update(num_queries=len(data.query_ids()), num_docs=len(data.corpus), seconds=round(time.time() - t0, 1))
    print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
