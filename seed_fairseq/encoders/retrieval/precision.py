"""Encoding precision (``--precision``): autocast contexts and dynamic int8 quantisation."""

import contextlib
import copy
import warnings
from typing import TYPE_CHECKING, ContextManager

import torch

from .index import SearchError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

# --precision: what encoding computes in (training's own precision is FinetuneConfig's business)
PRECISIONS = ("fp32", "fp16", "bf16", "int8")


def autocast(device: str, precision: str) -> ContextManager:
    """The autocast context of ``precision`` on ``device``.

    CUDA: fp16 / bf16 autocast. CPU: bf16 autocast (matmuls in bfloat16, which CPUs
    with AVX512-BF16 / AMX run several times faster; softmax and LayerNorm stay fp32);
    fp16 runs fp32 on the CPU (no fast fp16 matmul there). fp32 and int8: none.
    """
    device = str(device)
    if precision == "bf16" and device.startswith("cpu"):
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if precision not in ("fp16", "bf16") or not device.startswith("cuda"):
        return contextlib.nullcontext()
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return torch.autocast("cuda", dtype=dtype)


def quantized_int8(model: "SentenceTransformer") -> "SentenceTransformer":
    """A copy of ``model`` whose Linear layers are dynamically quantised to int8 (CPU only).

    ``torch.ao.quantization.quantize_dynamic``: int8 weights, activations quantised
    per batch on the fly; embeddings, LayerNorm and attention softmax stay fp32.
    """
    if model.device.type != "cpu":
        raise SearchError(
            f"--precision int8 (dynamic int8 quantisation) runs on the CPU only, the model is on {model.device}; "
            "use fp16 or bf16 there"
        )
    was_training = model.training
    copy_ = copy.deepcopy(model).eval()
    model.train(was_training)
    with warnings.catch_warnings():
        # torch >= 2.10 deprecates eager quantized tensors (torchao is the successor); they still work
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
        return torch.ao.quantization.quantize_dynamic(copy_, {torch.nn.Linear}, dtype=torch.qint8)
