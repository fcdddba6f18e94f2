"""CPDAE: a RoBERTa encoder pre-trained with MLM plus a bag-of-words MLP decoder on its
[CLS] vector, whose word distributions are contrasted across two masked views of each
text (Xu et al., "Contrastive Pre-training of a Discriminative Autoencoder for Dense
Retrieval", CIKM 2022).  The vector is the bottleneck vector (``--bottleneck-pooling``,
``bottleneck.py``; [CLS] by default), each view's own.

The encoder is fairseq's own ``RobertaEncoder`` (``encoder.*`` keys are RoBERTa's);
the MLP decoder lives under ``bow_decoder.*``, declared pre-training-only, so
``seed-drop-heads`` and the HuggingFace export leave it out.

Memory: the two views of a batch of B texts are 2B sequences.  Run as one ``(2B, T)``
batch, the encoder's activations are twice ``masked_lm``'s (1.84x its peak memory at base
shape, 8 x 512).  By default the views take two encoder calls and the FIRST is wrapped in
``torch.utils.checkpoint`` (non-reentrant: the RNG state is replayed, so the recomputed
dropout masks are the ones of the forward): autograd runs the backward of the later-built
view 2 first, freeing its activations, and only then recomputes view 1's.  One view's
activations are alive at a time, for one extra encoder forward of B sequences (about 1/6
of the encoders' FLOPs: the FLOP ratio to ``masked_lm`` goes from 2.00 to 2.32 at base
shape, counted by ``benchmarks/step_time.py``; the peak of live tensor memory goes from 1.85x
``masked_lm``'s to 1.08x).  It is still ONE forward of the model, so
DDP sees one forward per backward, and each parameter's gradient reaches its hook once
(autograd sums both views' contributions first; tested under torch's DDP on gloo).
``--cpdae-views-in-one-batch`` restores the single ``(2B, T)`` batch (no recomputation,
twice the activations; the dropout masks are drawn differently, so the two paths agree
exactly only without dropout).
"""

from typing import Tuple

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.utils import safe_getattr
from torch.utils.checkpoint import checkpoint

from ..modules.bow_decoder import BowMLPDecoder
from .bottleneck import BottleneckEncoderModel, tiny_encoder


@register_model("cpdae")
class CpdaeModel(BottleneckEncoderModel):
    """RoBERTa encoder + MLM head, plus the bag-of-words MLP decoder used only in pre-training."""

    pretraining_only_prefixes = ("bow_decoder.",)
    pretraining_only_config_prefixes = ("cpdae_",)
    pretraining_inputs = ("src_tokens_2",)

    @staticmethod
    def add_args(parser) -> None:
        BottleneckEncoderModel.add_args(parser)
        parser.add_argument(
            "--cpdae-views-in-one-batch",
            action="store_true",
            help="run both views through the encoder as one (2B, T) batch: no recomputation, but twice the "
            "activation memory (1.84x masked_lm's peak at base shape); by default view 1's encoder pass is "
            "recomputed in backward so that one view's activations are alive at a time",
        )

    def __init__(self, args, encoder):
        super().__init__(args, encoder)  # applies BERT init to the encoder
        self.bow_decoder = BowMLPDecoder(args.encoder_embed_dim, len(encoder.dictionary))
        self.views_in_one_batch = bool(safe_getattr(args, "cpdae_views_in_one_batch", False))
        self.recompute_view_1 = True  # off: two encoder calls, both kept (tests compare the paths)

    def pretraining_forward(
        self, src_tokens, masked_tokens=None, return_all_hiddens=False, src_tokens_2=None, **unused
    ) -> Tuple[torch.Tensor, dict]:
        """Features of the batch ``[view 1; view 2]`` (``(2B, T, dim)``; two encoder calls,
        view 1's recomputed in backward, or one with ``--cpdae-views-in-one-batch``: see the
        module docstring); ``masked_tokens`` is over that ``(2B, T)`` batch.
        ``extra["bottleneck"]``: the ``(2B, dim)`` bottleneck vectors (``bottleneck_vector``);
        ``extra["bow_logits"]``: the bag-of-words decoder's ``(2B, |V|)`` logits."""
        if src_tokens_2.shape != src_tokens.shape:
            raise ValueError(
                f"the two views must have the same shape, got {tuple(src_tokens.shape)} and {tuple(src_tokens_2.shape)}"
            )
        if self.views_in_one_batch:
            features, extra = self.encode(torch.cat([src_tokens, src_tokens_2]), return_all_hiddens)
        else:
            features, extra = self.encode_views(src_tokens, src_tokens_2, return_all_hiddens)
        extra["bottleneck"] = self.bottleneck_vector(features, torch.cat([src_tokens, src_tokens_2]))
        extra["bow_logits"] = self.bow_decoder(extra["bottleneck"])
        return self.mlm_hidden(features, masked_tokens), extra

    def encode_views(self, view_1, view_2, return_all_hiddens=False) -> Tuple[torch.Tensor, dict]:
        """``encode(cat([view_1, view_2]))`` as two calls, the first checkpointed when autograd
        records: built first, its backward runs last (autograd runs the later nodes first), so
        its activations are recomputed after view 2's are freed."""
        if self.recompute_view_1 and torch.is_grad_enabled():
            first = checkpoint(self.encode, view_1, return_all_hiddens, use_reentrant=False)
        else:
            first = self.encode(view_1, return_all_hiddens)
        second = self.encode(view_2, return_all_hiddens)
        (f1, e1), (f2, e2) = first, second
        extra = dict(e2)
        if e1.get("inner_states") is not None:  # fairseq's (T, B, C) per layer
            extra["inner_states"] = [torch.cat([a, b], dim=1) for a, b in zip(e1["inner_states"], e2["inner_states"])]
        return torch.cat([f1, f2]), extra


@register_model_architecture("cpdae", "cpdae")
def base_architecture(args) -> None:
    """BERT-base encoder (12 x 768, FFN 3072, 12 heads): the paper initialises from BERT-base."""
    roberta_base_architecture(args)


@register_model_architecture("cpdae", "cpdae_base")
def cpdae_base(args) -> None:
    base_architecture(args)


@register_model_architecture("cpdae", "cpdae_tiny")
def cpdae_tiny(args) -> None:
    """A small model for tests and CPU demos (encoder 2 x 128, FFN 256, 4 heads)."""
    tiny_encoder(args)
    base_architecture(args)
