"""Condenser / coCondenser: a RoBERTa encoder with its MLM head, plus Condenser's head (Gao & Callan,
EMNLP 2021; coCondenser, ACL 2022), used only in pre-training.

The backbone is the encoder itself: its first ``--condenser-skip-from`` layers are the paper's early
backbone, the rest the late backbone.  The head (``--condenser-head-layers`` Transformer layers built
like the encoder's, ``modules/condenser_head.py``) reads the late [CLS] -- the bottleneck vector,
``bottleneck_vector`` (``--bottleneck-pooling``, [CLS] by default) -- followed by the early layer's
token states (the "short circuit"); its output goes through the encoder's MLM head (the paper's W,
shared, as in the authors' code), at the same masked positions as the backbone's own MLM.  The head
lives under ``condenser_head.*`` (declared pre-training-only: ``seed-drop-heads`` and the export drop
it; its options start with ``condenser_``).

One model for both objectives (``condenser_*`` and ``cocondenser_*`` archs are the same): given
``src_tokens_2`` (coCondenser's second spans) the two views run as one ``(2B, T)`` batch, padded to
the wider one; ``extra["bottleneck"]`` holds every view's bottleneck vector for the contrast.
"""

from typing import Tuple

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from fairseq.utils import safe_getattr

from ...base.errors import ConfigurationError
from ..modules.condenser_head import CondenserHead, stack_views
from .bottleneck import BottleneckEncoderModel, tiny_encoder


@register_model("condenser")
class CondenserModel(BottleneckEncoderModel):
    """RoBERTa encoder + MLM head, plus the Condenser head used only in pre-training."""

    pretraining_only_prefixes = ("condenser_head.",)
    pretraining_only_config_prefixes = ("condenser_",)
    # head_positions: the positions the head predicts (the criterion's masked ones); src_tokens_2:
    # coCondenser's second spans
    pretraining_inputs = ("head_positions", "src_tokens_2")

    @staticmethod
    def add_args(parser) -> None:
        BottleneckEncoderModel.add_args(parser)
        parser.add_argument(
            "--condenser-head-layers", type=int, metavar="N", help="Transformer layers of the Condenser head (paper: 2)"
        )
        parser.add_argument(
            "--condenser-skip-from",
            type=int,
            metavar="L",
            help="the early layer whose token states the head reads: the output of encoder layer L, 0 = the "
            "embeddings, at most the encoder's layers minus 1 (default: half of them, the paper's 6 of 12)",
        )

    @classmethod
    def prepare_args(cls, args) -> None:
        base_architecture(args)
        layers = int(args.encoder_layers)
        if args.condenser_head_layers is None or int(args.condenser_head_layers) < 1:
            raise ConfigurationError(f"--condenser-head-layers must be >= 1, got {args.condenser_head_layers}")
        skip = args.condenser_skip_from
        if skip is None or not 0 <= int(skip) < layers:
            raise ConfigurationError(
                f"--condenser-skip-from must be from 0 (the embeddings) to {layers - 1} (the encoder's layers "
                f"minus 1: the head must not read the last layer's token states), got {skip}"
            )

    def __init__(self, args, encoder):
        super().__init__(args, encoder)  # applies BERT init to the encoder
        self.skip_from = int(args.condenser_skip_from)
        self.condenser_head = self.build_condenser_head(args)

    def build_condenser_head(self, args) -> CondenserHead:
        layers = [self.encoder.sentence_encoder.build_encoder_layer(args) for _ in range(args.condenser_head_layers)]
        head = CondenserHead(layers)
        head.apply(init_bert_params)  # randomly initialised, as the authors' (BERT's init), not copied
        self.set_layer_norm_eps(head, safe_getattr(args, "encoder_layer_norm_eps", None))
        return head

    def pretraining_forward(
        self, src_tokens, masked_tokens=None, return_all_hiddens=False, head_positions=None, src_tokens_2=None, **unused
    ) -> Tuple[torch.Tensor, dict]:
        """``(mlm_features, extra)`` over the batch ``src_tokens`` (``(B, T)``), or ``[src_tokens;
        src_tokens_2]`` padded to one width (``(2B, T)``) when coCondenser's second spans are given;
        ``masked_tokens`` and ``head_positions`` are over that batch.  ``extra["decoder_features"]``:
        the head's MLM-head features at ``head_positions`` (every position when None);
        ``extra["bottleneck"]``: the ``(B or 2B, dim)`` bottleneck vectors."""
        pad = self.encoder.sentence_encoder.padding_idx
        tokens = src_tokens if src_tokens_2 is None else stack_views(src_tokens, src_tokens_2, pad)
        features, extra = self.encode(tokens, return_all_hiddens=True)
        vector = self.bottleneck_vector(features, tokens)
        early = extra["inner_states"][self.skip_from].transpose(0, 1)  # fairseq's T x B x C, after L layers
        head = self.condenser_head(vector, early, tokens.eq(pad))
        if not return_all_hiddens:
            extra["inner_states"] = None
        extra["bottleneck"] = vector
        extra["decoder_features"] = self.mlm_hidden(head, head_positions)
        return self.mlm_hidden(features, masked_tokens), extra


@register_model_architecture("condenser", "condenser")
def base_architecture(args) -> None:
    """BERT-base encoder (12 x 768, FFN 3072, 12 heads; the papers start from BERT-base) and a head of
    2 layers of the encoder's shape reading layer 6 (half the encoder's layers)."""
    roberta_base_architecture(args)
    args.condenser_head_layers = safe_getattr(args, "condenser_head_layers", 2)
    args.condenser_skip_from = safe_getattr(args, "condenser_skip_from", int(args.encoder_layers) // 2)


@register_model_architecture("condenser", "condenser_base")
def condenser_base(args) -> None:
    base_architecture(args)


@register_model_architecture("condenser", "cocondenser_base")
def cocondenser_base(args) -> None:
    base_architecture(args)


def _tiny(args):
    tiny_encoder(args)
    base_architecture(args)


@register_model_architecture("condenser", "condenser_tiny")
def condenser_tiny(args) -> None:
    """A small model for tests and CPU demos (2 x 128 encoder, 4 heads; a 2-layer head reading layer 1)."""
    _tiny(args)


@register_model_architecture("condenser", "cocondenser_tiny")
def cocondenser_tiny(args) -> None:
    """A small model for tests and CPU demos (2 x 128 encoder, 4 heads; a 2-layer head reading layer 1)."""
    _tiny(args)
