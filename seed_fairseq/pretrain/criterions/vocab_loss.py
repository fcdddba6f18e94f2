"""How criterions compute a loss over the vocabulary: options shared by every objective.

A criterion config that subclasses :class:`VocabLossConfig` gets

* ``--vocab-loss chunked`` (default): ``linear_cross_entropy`` from
  ``seed_fairseq/pretrain/modules/linear_cross_entropy.py``; the full logits are never
  materialised (chunks of positions, gradients computed in forward);
* ``--vocab-loss recompute``: the same with each chunk's logits recomputed in
  backward (the least memory, one extra projection matmul);
* ``--vocab-loss plain``: the full logits then ``F.cross_entropy`` (the reference,
  and what every run before this option computed);
* ``--vocab-loss liger`` / ``cce``: the fused CUDA kernels of ``liger-kernel`` /
  ``cut-cross-entropy`` when installed (never required);
* ``--vocab-loss-chunk-size N``: positions per chunk (0: about 2**24 logits per chunk).

and, through :class:`VocabLossMixin`, turns a model's features and a vocabulary
projection into a :class:`~.multi_term.Term`.  The models never see the option:
they return the features before their projections (``pretraining_forward``) and
expose the projections (``mlm_projection()``, ``decoder_projection()``); this
module alone decides how the two become a loss.
"""

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from ..modules.linear_cross_entropy import DEFAULT_IMPLEMENTATION, IMPLEMENTATIONS, linear_cross_entropy
from ..option_ranges import Range
from .multi_term import Term

VOCAB_LOSS_CHOICES = ChoiceEnum(list(IMPLEMENTATIONS))


@dataclass
class VocabLossConfig(FairseqDataclass):
    vocab_loss: VOCAB_LOSS_CHOICES = field(
        default=DEFAULT_IMPLEMENTATION,
        metadata={
            "help": "how cross-entropy over the vocabulary is computed: chunked (no full logits, gradients computed "
            "chunk by chunk in forward; the default), recompute (logits recomputed in backward: least memory, one "
            "extra projection matmul), plain (full logits, the reference), liger or cce (their fused CUDA kernels, "
            "when installed). Same loss and gradients up to floating-point summation order"
        },
    )
    vocab_loss_chunk_size: int = field(
        default=0,
        metadata={
            "help": "positions per chunk of --vocab-loss chunked/recompute (0: about 2**24 logits per chunk)",
            "range": Range(0, note=" (0: about 2**24 logits per chunk)"),
        },
    )


def check_vocab_loss(implementation: str, chunk_size: int) -> None:
    """One clear error for an option that cannot work, raised when the criterion is built."""
    if chunk_size < 0:
        raise ValueError(f"--vocab-loss-chunk-size must be >= 0, got {chunk_size}")
    module = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}.get(str(implementation))
    if module is not None:
        import importlib.util

        if importlib.util.find_spec(module) is None:
            raise ValueError(f"--vocab-loss {implementation} needs the {module} package, which is not installed")


def vocab_term(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    pad: int,
    bias: Optional[torch.Tensor] = None,
    implementation: str = DEFAULT_IMPLEMENTATION,
    chunk_size: int = 0,
) -> Term:
    """The summed NLL (fp32) and correct count of predicting ``target`` (``pad`` ignored)
    from ``hidden @ weight.T + bias``."""
    nll, correct = linear_cross_entropy(
        hidden,
        weight,
        target,
        bias=bias,
        ignore_index=pad,
        chunk_size=chunk_size or None,
        implementation=str(implementation),
    )
    return Term(nll, correct)


def token_nll(logits: torch.Tensor, target: torch.Tensor, pad: int) -> Term:
    """(summed NLL in fp32, number correct) over the positions where target != pad, from full logits."""
    logits = logits.float().view(-1, logits.size(-1))
    target = target.reshape(-1)
    nll = F.cross_entropy(logits, target, ignore_index=pad, reduction="sum")
    correct = (logits.argmax(-1).eq(target) & target.ne(pad)).sum()
    return Term(nll, correct)


class VocabLossMixin:
    """For a criterion whose config subclasses :class:`VocabLossConfig`: call
    ``set_vocab_loss(cfg)`` in ``__init__`` and turn each vocabulary prediction of the
    model into a term with ``vocabulary_term(features, projection, target)``, e.g.
    ``vocabulary_term(mlm_features, model.mlm_projection(), gold)``."""

    def set_vocab_loss(self, cfg: VocabLossConfig) -> None:
        check_vocab_loss(cfg.vocab_loss, cfg.vocab_loss_chunk_size)
        self.vocab_loss = str(cfg.vocab_loss)
        self.vocab_loss_chunk_size = int(cfg.vocab_loss_chunk_size)

    @property
    def fused(self) -> bool:
        """Whether the loss is fused with the projection (no full logits): every option but ``plain``."""
        return self.vocab_loss != "plain"

    def vocabulary_term(self, features: torch.Tensor, projection, target: torch.Tensor) -> Term:
        """The term of predicting ``target`` (pads ignored) from ``features`` through
        ``projection = (weight, bias or None)``, computed as ``--vocab-loss`` says."""
        weight, bias = projection
        if not self.fused:  # the full logits, exactly as RoBERTa's LM head / a fairseq decoder computes them
            logits = F.linear(features, weight)
            return token_nll(logits + bias if bias is not None else logits, target, self.padding_idx)
        return vocab_term(
            features,
            weight,
            target,
            self.padding_idx,
            bias=bias,
            implementation=self.vocab_loss,
            chunk_size=self.vocab_loss_chunk_size,
        )
