"""What the retrieval command-line drivers share: argparse types that refuse
values which would hang or mislead, the search options, and the one-line error.

The guarantees (docs/guarantees.md): bad input gives one line
``error: FILE: problem`` (``FILE:LINE:`` for data files) on stderr and exit
status 2; outputs are written atomically and only replace what the tool's own
record says it wrote (``seed_fairseq/base/fileio/``).
"""

import argparse
import math
import sys
from typing import Callable


def report(error: object) -> int:
    """Print ``error: ...`` (one line) on stderr; returns the exit status 2.

    ``error`` is an exception whose ``str()`` is ``FILE: problem`` (DataFormatError,
    OutputError) or such a message; only its first line is printed.
    """
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else type(error).__name__
    print(f"error: {text}", file=sys.stderr)
    return 2


def report_storage(error: OSError) -> int:
    """:func:`report` for a full disk, quota or file-size limit while writing an output (one line
    naming the file); any other OSError is not the user's input: re-raised with its traceback."""
    from ...base.fileio import storage_line

    line = storage_line(error)
    if line is None:
        raise error
    return report(line)


# ---------------------------------------------------------------------------
# argparse types: a bad value is an argparse error (usage + one error line, exit 2)
# ---------------------------------------------------------------------------


def _number(kind: type, check: Callable[[float], bool], wanted: str) -> Callable[[str], float]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        # float("nan") parses; NaN fails every comparison and would slip through
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if not check(value):
            raise argparse.ArgumentTypeError(f"{text} is not {wanted}")
        return value

    parse.__name__ = wanted  # argparse names the type in some messages
    return parse


positive_int = _number(int, lambda v: v >= 1, "an integer >= 1")
nonneg_int = _number(int, lambda v: v >= 0, "an integer >= 0")
# numpy's seeding accepts 0 .. 2**32 - 1 only; a negative seed would be a traceback
seed_int = _number(int, lambda v: 0 <= v < 2**32, "a seed in [0, 2**32)")
positive_float = _number(float, lambda v: v > 0, "a number > 0")
nonneg_float = _number(float, lambda v: v >= 0, "a number >= 0")
fraction = _number(float, lambda v: 0 < v <= 1, "in (0, 1]")
unit_interval = _number(float, lambda v: 0 <= v <= 1, "in [0, 1]")


# ---------------------------------------------------------------------------
# encoding and search options (evaluate.py, finetune.py)
# ---------------------------------------------------------------------------


def add_search_args(p: argparse.ArgumentParser) -> None:
    from . import representations
    from .index import INDEX_PRESETS
    from .precision import PRECISIONS

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
        choices=PRECISIONS,
        default="fp16",
        help="encoding precision. CUDA: fp16/bf16 autocast. CPU: bf16 = bfloat16 autocast (fast on CPUs with "
        "AVX512-BF16/AMX), int8 = dynamic int8 quantisation of the Linear layers, fp16 runs fp32. The quality "
        "change of each is measured in benchmarks/README.md. Default fp16 (= fp32 on the CPU)",
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
    g.add_argument(
        "--representation",
        choices=representations.names(),  # own, cls, dupmae
        default=None,
        help="own: the model as its folder says: its sentence-transformers modules as written (its pooling, its "
        "Normalize) compared by its similarity (config_sentence_transformers.json's similarity_fn_name; cosine "
        "for a model that normalises; dot for one this project exported as [CLS] + dot), cosine searched as "
        "normalised vectors in the inner-product index; cls: the papers' [CLS] vector and dot product, whatever "
        "the folder's pooling; dupmae: DupMAE's projected [CLS] + top-k vocabulary entries (Eq. 10-12; the "
        "folder needs dupmae.json and dupmae_head.safetensors). Default: what the folder declares (dupmae with "
        "DupMAE's head files, else own)",
    )
    g.add_argument(
        "--sparse-top-k",
        type=positive_int,
        default=None,
        help="DupMAE: vocabulary entries kept per text (default: the folder's dupmae.json)",
    )


def index_kwargs(args: argparse.Namespace) -> dict:
    return dict(nlist=args.nlist, nprobe=args.nprobe, pq_m=args.pq_m, hnsw_m=args.hnsw_m, ef_search=args.ef_search)
