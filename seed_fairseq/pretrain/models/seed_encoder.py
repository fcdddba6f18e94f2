"""SEED-Encoder: a RoBERTa-style encoder pre-trained with MLM plus a weak decoder
that reconstructs the input from the encoder's [CLS] vector alone (the bottleneck
vector: ``--bottleneck-pooling``, ``bottleneck.py``; [CLS] by default).

The encoder is fairseq's own ``RobertaEncoder`` (so the ``encoder.*`` keys are
exactly RoBERTa's and map one to one onto the authors' released encoder
weights and onto HuggingFace's RoBERTa classes).  The weak decoder lives under
``weak_decoder.*`` (declared pre-training-only: see ``bottleneck.py``).
"""

import argparse
import logging
from typing import TYPE_CHECKING, Optional, Tuple

from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.models.transformer import transformer_legacy
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from fairseq.utils import safe_getattr

from ..modules.windowed_decoder import FULL, WindowedTransformerDecoder, parse_window
from .bottleneck import BottleneckEncoderModel, tiny_encoder, vector_memory

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def _window_arg(value):
    try:
        return parse_window(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


@register_model("seed_encoder")
class SeedEncoderModel(BottleneckEncoderModel):
    """RoBERTa encoder + MLM head, plus a weak decoder used only in pre-training."""

    pretraining_only_prefixes = ("weak_decoder.",)
    pretraining_only_config_prefixes = ("decoder_",)
    pretraining_inputs = ("prev_output_tokens",)

    @staticmethod
    def add_args(parser) -> None:
        BottleneckEncoderModel.add_args(parser)
        parser.add_argument(
            "--decoder-layers",
            type=int,
            metavar="L",
            help="weak decoder layers (paper: 3); 0 builds no decoder (MLM-only baseline)",
        )
        parser.add_argument(
            "--decoder-attention-window",
            type=_window_arg,
            metavar="K",
            help="weak decoder self-attention window k: position i sees i-k+1..i and "
            "position 0 (paper: 2); 'full' = ordinary causal attention",
        )
        parser.add_argument(
            "--decoder-attention-impl",
            choices=("banded", "masked"),
            help="how a restricted window is computed: banded (default; only the 1 + k allowed scores "
            "per query) or masked (fairseq's n x n attention with a mask: the same values, and the "
            "random stream of attention dropout of seed_fairseq 0.1, for a bit-identical resume of its runs)",
        )
        parser.add_argument(
            "--decoder-attention-heads",
            type=int,
            metavar="H",
            help="weak decoder attention heads (default: same as the encoder)",
        )
        parser.add_argument(
            "--decoder-ffn-embed-dim",
            type=int,
            metavar="N",
            help="weak decoder FFN dimension (default: same as the encoder)",
        )
        parser.add_argument(
            "--decoder-scale-embedding",
            action="store_true",
            help="scale decoder token embeddings by sqrt(dim) like a vanilla Transformer "
            "(default: off, as in the encoder)",
        )

    @classmethod
    def prepare_args(cls, args) -> None:
        base_architecture(args)
        args.decoder_attention_window = parse_window(args.decoder_attention_window)
        if args.decoder_layers < 0:
            raise ValueError(f"--decoder-layers must be >= 0, got {args.decoder_layers}")

    def __init__(self, args, encoder):
        super().__init__(args, encoder)  # applies BERT init to the encoder
        self.weak_decoder = self.build_weak_decoder(args, encoder)

    def build_weak_decoder(self, args, encoder) -> Optional[WindowedTransformerDecoder]:
        if args.decoder_layers == 0:
            return None
        dec_args = argparse.Namespace(
            encoder_embed_dim=args.encoder_embed_dim,
            decoder_embed_dim=args.encoder_embed_dim,
            decoder_ffn_embed_dim=args.decoder_ffn_embed_dim,
            decoder_layers=args.decoder_layers,
            decoder_attention_heads=args.decoder_attention_heads,
            decoder_normalize_before=True,  # pre-LN layers + final LayerNorm
            layernorm_embedding=True,
            decoder_learned_pos=True,
            no_scale_embedding=not args.decoder_scale_embedding,
            share_decoder_input_output_embed=True,  # tied, no bias
            max_target_positions=args.max_positions,
            activation_fn=args.activation_fn,
            dropout=args.dropout,
            attention_dropout=args.attention_dropout,
            activation_dropout=args.activation_dropout,
        )
        transformer_legacy.base_architecture(dec_args)
        embed_tokens = encoder.sentence_encoder.embed_tokens  # shared with the encoder
        decoder = WindowedTransformerDecoder(
            dec_args,
            encoder.dictionary,
            embed_tokens,
            args.decoder_attention_window,
            banded=safe_getattr(args, "decoder_attention_impl", "banded") == "banded",
        )
        # BERT initialisation for everything the decoder owns; the shared token
        # table (and the output projection tied to it) stays as the encoder set
        # it, padding row included.
        decoder.layers.apply(init_bert_params)
        decoder.embed_positions.apply(init_bert_params)
        return decoder

    def pretraining_forward(
        self, src_tokens, masked_tokens=None, return_all_hiddens=False, prev_output_tokens=None, **unused
    ) -> Tuple["torch.Tensor", dict]:
        """``(mlm_features, extra)`` with ``extra["decoder_features"]`` the weak decoder's last
        features ``(batch, tgt_len, dim)``, None without a decoder (the MLM-only baseline);
        its projection is ``decoder_projection()`` (tied to the token embeddings, no bias).
        The decoder's one memory entry is the bottleneck vector of ``src_tokens``."""
        features, extra = self.encode(src_tokens, return_all_hiddens=return_all_hiddens)
        extra["decoder_features"] = None
        if self.weak_decoder is not None:
            memory = vector_memory(self.bottleneck_vector(features, src_tokens))
            extra["decoder_features"], _ = self.weak_decoder(prev_output_tokens, encoder_out=memory, features_only=True)
        return self.mlm_hidden(features, masked_tokens), extra

    def decoder_projection(self) -> Tuple["torch.Tensor", None]:
        """The weak decoder's output projection: (weight tied to the token embeddings, no bias)."""
        return self.weak_decoder.output_projection.weight, None


# ---------------------------------------------------------------------------
# Architectures
# ---------------------------------------------------------------------------


@register_model_architecture("seed_encoder", "seed_encoder")
def base_architecture(args) -> None:
    """BERT-base encoder (12 heads, as in the released weights) + 3-layer k=2 decoder."""
    args.decoder_layers = safe_getattr(args, "decoder_layers", 3)
    args.decoder_attention_window = safe_getattr(args, "decoder_attention_window", 2)
    args.decoder_scale_embedding = safe_getattr(args, "decoder_scale_embedding", False)
    args.decoder_attention_impl = safe_getattr(args, "decoder_attention_impl", "banded")
    roberta_base_architecture(args)
    args.decoder_attention_heads = safe_getattr(args, "decoder_attention_heads", args.encoder_attention_heads)
    args.decoder_ffn_embed_dim = safe_getattr(args, "decoder_ffn_embed_dim", args.encoder_ffn_embed_dim)


@register_model_architecture("seed_encoder", "seed_encoder_base")
def seed_encoder_base(args) -> None:
    base_architecture(args)


@register_model_architecture("seed_encoder", "seed_encoder_mlm_only")
def seed_encoder_mlm_only(args) -> None:
    """Same encoder and data pipeline, no decoder: the MLM-only baseline."""
    args.decoder_layers = safe_getattr(args, "decoder_layers", 0)
    base_architecture(args)


@register_model_architecture("seed_encoder", "seed_encoder_tiny")
def seed_encoder_tiny(args) -> None:
    """A small model for tests and CPU demos (2 x 128 encoder, 3-layer k=2 decoder)."""
    tiny_encoder(args)
    base_architecture(args)


# The paper's decoder ablation (EMNLP'21 Fig. 3 / preprint Fig. 5-6): decoder
# depth 1/3/5 x attention window 2 / 8 / full, all on the BERT-base encoder.
ABLATION_WINDOWS = {"k2": 2, "k8": 8, "full": FULL}
ABLATION_LAYERS = (1, 3, 5)


def _register_ablation(name, layers, window):
    def arch(args):
        args.decoder_layers = safe_getattr(args, "decoder_layers", layers)
        args.decoder_attention_window = safe_getattr(args, "decoder_attention_window", window)
        base_architecture(args)

    arch.__doc__ = f"BERT-base encoder + {layers}-layer weak decoder, attention window {window}."
    register_model_architecture("seed_encoder", name)(arch)


for _layers in ABLATION_LAYERS:
    for _suffix, _window in ABLATION_WINDOWS.items():
        _register_ablation(f"weak_decoder_l{_layers}_{_suffix}", _layers, _window)
# Short names for the 3-layer decoders.
for _suffix, _window in ABLATION_WINDOWS.items():
    _register_ablation(f"weak_decoder_{_suffix}", 3, _window)
