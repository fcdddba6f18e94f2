"""The checks that are not in-process training: the real ``fairseq-train`` (one process with
``--update-freq 2``, two data-parallel processes), the HuggingFace export, corpus encoding and
faiss search.

The data-parallel check is the contract test's (``tests/test_contract.py``,
``check_split_invariance``): ``--curriculum 1`` keeps the batch order, so 1 process x
(B + B) with ``--update-freq 2`` and 2 processes x B see the same blocks, and one plain
SGD step with learning rate 1 (the weight change IS the gradient) must leave the same
weights.  The one-process run's checkpoint is also the one exported.
"""

import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

from ..kit.argv import SGD_ONE_STEP, command, fairseq_bin
from ..kit.interrupt import run_child
from ..kit.tools import child_env


class CheckFailed(Exception):
    """A check ran and its result is wrong (``str()`` says what)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_program() -> str:
    """The ``fairseq-train`` beside this interpreter (the venv's; a test puts another in its place)."""
    return fairseq_bin("fairseq-train")


def fairseq_train(
    data, save_dir: Path, args: List[str], log_file: Path, say: Callable[[str], None], launcher=()
) -> Path:
    """``fairseq-train DATA --save-dir SAVE_DIR ARGS`` (under ``launcher``), its output in ``log_file``.

    Run as the comparison runs its tools (``compare.interrupt.run_child``): in a process group of
    its own, which is stopped whole (``torchrun`` and its workers) when gpu_check is interrupted or
    its time budget runs out (``budget.OutOfTime``, raised during the wait), and asked to stop
    when gpu_check dies."""
    cmd = command(data, args, save_dir=save_dir, launcher=launcher, program=train_program())
    say(" ".join(shlex.quote(str(c)) for c in cmd))
    with open(log_file, "w", encoding="utf-8") as f:
        code = run_child([str(c) for c in cmd], f, child_env())
    if code != 0:
        tail = Path(log_file).read_text(encoding="utf-8", errors="replace").splitlines()[-5:]
        raise CheckFailed(f"fairseq-train failed (exit {code}; {log_file}): {' | '.join(tail)}")
    return save_dir / "checkpoint_last.pt"


def one_update_args(args: List[str], batch: int) -> List[str]:
    """One plain SGD step of ``batch`` blocks, batches in order (the data-parallel check's runs)."""
    return [*args, *SGD_ONE_STEP, "--curriculum", "1", "--batch-size", str(batch), "--max-update", "1"]


def one_process(data, work: Path, args: List[str], batch: int, say: Callable[[str], None]) -> Path:
    """``fairseq-train``: one update of 1 process x ``batch`` x ``--update-freq 2``; its checkpoint."""
    cmd = [*one_update_args(args, batch), "--update-freq", "2"]
    return fairseq_train(data, work / "freq2", cmd, work / "freq2.log", say)


def two_processes_equal(
    data,
    work: Path,
    args: List[str],
    batch: int,
    reference: Path,
    backend: str,
    ddp_backend: str,
    say: Callable[[str], None],
    atol: float,
    rtol: float,
) -> Dict[str, float]:
    """One update of 2 processes x ``batch`` (``torchrun``) leaves the weights of ``reference`` (1 process x
    ``--update-freq 2``): the largest excess of ``|difference| - rtol * |w|`` (CheckFailed above ``atol``)."""
    from ...pretrain.checkpoint import load_torch_file

    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
    ]
    extra = ["--distributed-world-size", "2", "--distributed-backend", backend, "--ddp-backend", ddp_backend]
    cmd = [*one_update_args(args, batch), *extra]
    two = fairseq_train(data, work / "two", cmd, work / "two.log", say, launcher=launcher)
    w_one = load_torch_file(reference)["model"]
    w_two = load_torch_file(two)["model"]
    worst, worst_name = 0.0, ""
    for name, value in w_one.items():
        diff = (w_two[name].float() - value.float()).abs()
        excess = float((diff - rtol * value.float().abs()).max())
        if excess > worst:
            worst, worst_name = excess, name
    if worst > atol:
        raise CheckFailed(
            f"2 processes differ from 1 process x --update-freq 2 in {worst_name} by {worst:.3g} > {atol:g}"
        )
    return {"max_excess": worst}


def export_and_compare(
    checkpoint: Path, data, out: Path, device: str, texts: List[str], atol: float
) -> Dict[str, float]:
    """The HF export of ``checkpoint`` (it checks fairseq vs HF on the CPU itself), then both models
    on ``device``: the largest difference of their last hidden states on ``texts``."""
    import torch
    from fairseq import checkpoint_utils
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from ...encoders.hf.export import export

    hf_logging.disable_progress_bar()
    export(checkpoint, data, out, force=True, atol=max(atol, 1e-5))
    tokenizer = AutoTokenizer.from_pretrained(out)
    hf = AutoModel.from_pretrained(out).eval().to(device)
    (fs,), _ = checkpoint_utils.load_model_ensemble([str(checkpoint)], arg_overrides={"data": str(data)})
    fs = fs.eval().to(device)
    batch = tokenizer(texts, truncation=True, max_length=hf.config.max_position_embeddings - 2, padding=True)
    ids = torch.as_tensor(batch["input_ids"], device=device)
    mask = torch.as_tensor(batch["attention_mask"], device=device).bool()
    with torch.no_grad():
        fs_features, _ = fs(ids, features_only=True)
        hf_features = hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state
    diff = float((fs_features - hf_features).abs()[mask].max())
    if not diff <= atol:
        raise CheckFailed(f"on {device}, HF outputs differ from fairseq's by {diff:.3g} > {atol:g}")
    return {"max_abs_diff": diff}


def encode_corpus(folder: Path, device: str, texts: List[str], precision: str, batch_size: int) -> Dict[str, object]:
    """Documents per second of the retrieval library's encoding (``retrieval.search.encode``)."""
    from ...encoders.retrieval.search import encode, load_model

    model = load_model(str(folder), device=device)
    encode(model, texts[: min(len(texts), batch_size)], batch_size=batch_size, precision=precision, show_progress=False)
    start = time.perf_counter()
    emb = encode(model, texts, batch_size=batch_size, precision=precision, show_progress=False)
    seconds = time.perf_counter() - start
    if not np.isfinite(emb).all():
        raise CheckFailed(f"{precision} encoding gave non-finite embeddings")
    return {"docs_per_second": len(texts) / seconds, "docs": len(texts), "embeddings": emb}


def faiss_equal(emb: np.ndarray, use_gpu: bool, k: int = 10, queries: int = 32) -> Dict[str, float]:
    """A flat inner-product index searched on faiss-gpu (``use_gpu``) or a second faiss-cpu copy, against
    faiss-cpu: the same neighbours and scores within 1e-3."""
    import faiss

    from ...encoders.retrieval.index import build_index, search

    cpu = build_index(emb, "flat")
    if use_gpu:
        resources = faiss.StandardGpuResources()
        other = faiss.index_cpu_to_gpu(resources, 0, cpu)
    else:
        other = faiss.clone_index(cpu)
    q = np.ascontiguousarray(emb[:queries])
    s_cpu, i_cpu = search(cpu, q, k)
    s_other, i_other = search(other, q, k)
    score_diff = float(np.abs(s_cpu - s_other).max())
    same = float((i_cpu == i_other).mean())  # ids may swap between tied scores: 99% must agree
    if score_diff > 1e-3:
        raise CheckFailed(f"faiss scores differ by {score_diff:.3g} > 1e-3")
    if same < 0.99:
        raise CheckFailed(f"faiss neighbours differ: {same:.1%} of ids equal (< 99%)")
    return {"score_max_abs_diff": score_diff, "ids_equal": same, "queries": len(q), "k": k}


def faiss_cpu_available() -> Optional[str]:
    """None when faiss can be imported here, else why not."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        return "faiss is not installed"
    return None


def faiss_gpu_available() -> Optional[str]:
    """None when faiss-gpu can search on a GPU here, else why not."""
    try:
        import faiss
    except ImportError:
        return "faiss is not installed"
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1:
        return "faiss-gpu is not installed (faiss-cpu only)"
    return None
