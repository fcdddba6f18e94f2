"""SimLM (Wang et al., 2022): a deep encoder and a shallow bidirectional decoder
joined only through the encoder's [CLS] vector, both trained with replaced
language modelling (the bottleneck vector: ``--bottleneck-pooling``, ``bottleneck.py``;
[CLS] by default, h_cls below).

    encoder: replaced x_enc            -> h (B x T x C);  h_cls = h[:, 0]
    decoder: embed(replaced x_dec), slot 0 := h_cls -> 2 bidirectional layers
    both:    the SHARED MLM head predicts the original token at every
             non-special position

The decoder's layers are copies of the encoder's last layers (fairseq's own
``TransformerEncoderLayer``: post-LN, like BERT), made when the model is built
and, when training starts from an encoder-only checkpoint (the paper starts
from BERT-base), from that checkpoint's last layers.  Its input embedding is
the encoder's embedding module (token + position + LayerNorm + dropout), as in
the reference code.  The decoder lives under ``simlm_decoder.*``, declared
pre-training-only, so ``seed-drop-heads`` and the HuggingFace export keep the
encoder alone.  The generator is not part of the model (see ``generator.py``).

Memory: each decoder layer runs under ``torch.utils.checkpoint`` (non-reentrant: the
recomputed dropout masks are the forward's, so loss and gradients are bitwise those of
keeping the activations).  The decoder's backward comes first, while every encoder
activation is still alive: recomputed layer by layer, only one decoder layer's
activations join them at a time, for one extra forward of the decoder (about 3% of the
step's FLOPs at base shape).
"""

import copy
import logging
from typing import Tuple

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.utils import safe_getattr
from torch.utils.checkpoint import checkpoint

from .bottleneck import BottleneckEncoderModel, tiny_encoder

logger = logging.getLogger(__name__)

ENCODER_LAYERS = "encoder.sentence_encoder.layers."


@register_model("simlm")
class SimLMModel(BottleneckEncoderModel):
    """RoBERTa encoder + MLM head, plus a shallow decoder used only in pre-training."""

    pretraining_only_prefixes = ("simlm_decoder.",)
    pretraining_only_config_prefixes = ("decoder_",)
    pretraining_inputs = ("dec_tokens",)

    @staticmethod
    def add_args(parser) -> None:
        BottleneckEncoderModel.add_args(parser)
        parser.add_argument(
            "--decoder-layers",
            type=int,
            metavar="L",
            help="decoder layers, copies of the encoder's last L layers when training starts (paper: 2); "
            "0 builds no decoder (replaced language modelling on the encoder alone)",
        )

    @classmethod
    def prepare_args(cls, args) -> None:
        base_architecture(args)
        if not 0 <= args.decoder_layers <= args.encoder_layers:
            raise ValueError(
                f"--decoder-layers must be between 0 and --encoder-layers ({args.encoder_layers}): the decoder "
                f"copies the encoder's last layers; got {args.decoder_layers}"
            )
        if args.encoder_layers_to_keep:
            raise ValueError("simlm does not support --encoder-layers-to-keep")

    def __init__(self, args, encoder):
        super().__init__(args, encoder)  # applies BERT init to the encoder
        layers = encoder.sentence_encoder.layers
        n = args.decoder_layers
        self.simlm_decoder = copy.deepcopy(layers[len(layers) - n :]) if n > 0 else None
        self.recompute_decoder = True  # off: keep the decoder layers' activations (tests compare the paths)

    def decode(self, vector: torch.Tensor, dec_tokens: torch.Tensor) -> torch.Tensor:
        """Decoder features ``(batch, time, dim)`` from the encoder's bottleneck vector ``(batch, dim)``
        and the decoder's input tokens (slot 0, the [CLS] token, is replaced by the vector)."""
        embed = self.encoder.sentence_encoder
        padding = dec_tokens.eq(embed.padding_idx)
        has_pads = bool(padding.any())
        x, _ = embed.forward_embedding(dec_tokens)
        x = torch.cat([vector.unsqueeze(1).to(x.dtype), x[:, 1:]], dim=1)
        if has_pads:
            x = x * (1 - padding.unsqueeze(-1).type_as(x))
        x = x.transpose(0, 1)
        recompute = self.recompute_decoder and torch.is_grad_enabled()
        for layer in self.simlm_decoder:
            if recompute:
                x = checkpoint(layer, x, padding if has_pads else None, use_reentrant=False)
            else:
                x = layer(x, encoder_padding_mask=padding if has_pads else None)
            if isinstance(x, tuple):  # layers built with return_fc
                x = x[0]
        return x.transpose(0, 1)

    def pretraining_forward(
        self, src_tokens, masked_tokens=None, return_all_hiddens=False, dec_tokens=None, **unused
    ) -> Tuple[torch.Tensor, dict]:
        """``(encoder's mlm_features, extra)`` with ``extra["decoder_features"]`` the decoder's
        (through the shared MLM head up to its projection, ``decoder_projection()``), both at
        ``masked_tokens`` (all positions when None); None without a decoder (--decoder-layers 0)."""
        if dec_tokens.shape != src_tokens.shape:
            raise ValueError(f"decoder input {tuple(dec_tokens.shape)} != encoder input {tuple(src_tokens.shape)}")
        features, extra = self.encode(src_tokens, return_all_hiddens=return_all_hiddens)
        extra["decoder_features"] = None
        if self.simlm_decoder is not None:
            dec_features = self.decode(self.bottleneck_vector(features, src_tokens), dec_tokens)
            extra["decoder_features"] = self.mlm_hidden(dec_features, masked_tokens)
        return self.mlm_hidden(features, masked_tokens), extra

    def upgrade_state_dict_named(self, state_dict, name) -> None:
        prefix = name + "." if name != "" else ""
        head = prefix + "simlm_decoder."
        if self.simlm_decoder is not None and not any(k.startswith(head) for k in state_dict):
            # An encoder-only checkpoint (seed-drop-heads, an imported BERT/RoBERTa)
            # initialising SimLM: the decoder starts as ITS last layers, as the
            # paper's starts as BERT-base's.
            n_enc = len(self.encoder.sentence_encoder.layers)
            n_dec = len(self.simlm_decoder)
            copied = 0
            for i in range(n_dec):
                source = f"{prefix}{ENCODER_LAYERS}{n_enc - n_dec + i}."
                for key in [k for k in state_dict if k.startswith(source)]:
                    state_dict[f"{head}{i}.{key[len(source) :]}"] = state_dict[key].clone()
                    copied += 1
            if copied:
                logger.info(f"simlm_decoder initialised from the checkpoint's last {n_dec} encoder layers")
        super().upgrade_state_dict_named(state_dict, name)


# ---------------------------------------------------------------------------
# Architectures
# ---------------------------------------------------------------------------


@register_model_architecture("simlm", "simlm")
def base_architecture(args) -> None:
    """BERT-base encoder (12 x 768, 12 heads, 3072 FFN) + a 2-layer decoder."""
    args.decoder_layers = safe_getattr(args, "decoder_layers", 2)
    roberta_base_architecture(args)


@register_model_architecture("simlm", "simlm_base")
def simlm_base(args) -> None:
    base_architecture(args)


@register_model_architecture("simlm", "simlm_tiny")
def simlm_tiny(args) -> None:
    """A small model for tests and CPU demos (2 x 128 encoder, 4 heads; the decoder copies both layers)."""
    tiny_encoder(args)
    base_architecture(args)
