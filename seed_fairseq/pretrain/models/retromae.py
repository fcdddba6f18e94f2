"""RetroMAE / DupMAE: a RoBERTa encoder with its MLM head, plus RetroMAE's enhanced
decoder (one transformer layer, used only in pre-training).

One model for both objectives: DupMAE's bag-of-words decoder has no weights of
its own -- its "linear projection unit" (d x |V|, Eq. 6) is the encoder's tied
MLM head, as in the reference code -- so ``retromae_*`` and ``dupmae_*`` archs
build the same model and the criterion decides whether the bag-of-words term
is computed.  The enhanced decoder reuses the encoder's embedding module
(token + position embeddings, LayerNorm) for its two input streams and the MLM
head for its predictions; its own layer lives under ``enhanced_decoder.*``
(declared pre-training-only).  Where the paper's decoder reads the [CLS] vector h_X
(both streams' sentence slot), it reads the bottleneck vector (``--bottleneck-pooling``,
``bottleneck.py``; [CLS] by default).
"""

import logging
from typing import Tuple

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from fairseq.utils import safe_getattr

from ..modules.enhanced_decoder import EnhancedDecoderLayer
from ..modules.vocab_pool import vocab_max_pool
from .bottleneck import BottleneckEncoderModel, tiny_encoder

logger = logging.getLogger(__name__)


@register_model("retromae")
class RetroMAEModel(BottleneckEncoderModel):
    """RoBERTa encoder + MLM head, plus the enhanced decoder used only in pre-training."""

    pretraining_only_prefixes = ("enhanced_decoder.",)
    pretraining_only_config_prefixes = ("decoder_",)
    pretraining_inputs = ("dec_tokens", "dec_hidden")

    @staticmethod
    def add_args(parser) -> None:
        BottleneckEncoderModel.add_args(parser)
        parser.add_argument(
            "--decoder-attention-heads", type=int, metavar="H", help="enhanced decoder heads (default: the encoder's)"
        )
        parser.add_argument(
            "--decoder-ffn-embed-dim", type=int, metavar="N", help="enhanced decoder FFN size (default: the encoder's)"
        )
        parser.add_argument(
            "--decoder-query-layernorm",
            action="store_true",
            help="pass the query stream [CLS] + position through the embedding LayerNorm and dropout, as the "
            "reference code v2 (default: the paper's plain sum, Eq. 2)",
        )

    @classmethod
    def prepare_args(cls, args) -> None:
        base_architecture(args)

    def __init__(self, args, encoder):
        super().__init__(args, encoder)  # applies BERT init to the encoder
        self.enhanced_decoder = self.build_enhanced_decoder(args)

    def build_enhanced_decoder(self, args) -> EnhancedDecoderLayer:
        layer = EnhancedDecoderLayer(
            args.encoder_embed_dim,
            args.decoder_attention_heads,
            args.decoder_ffn_embed_dim,
            activation_fn=args.activation_fn,
            dropout=args.dropout,
            attention_dropout=args.attention_dropout,
            activation_dropout=args.activation_dropout,
        )
        layer.apply(init_bert_params)  # randomly initialised, as the reference (not copied from the encoder)
        return layer

    # -- the two streams -------------------------------------------------------------------

    def decoder_streams(self, vector: torch.Tensor, dec_tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(query, content), each (batch, T, dim), from the bottleneck vector and the unmasked tokens."""
        embed = self.encoder.sentence_encoder
        content, _ = embed.forward_embedding(dec_tokens)  # LN(e_x + p) + dropout, the encoder's own
        content = torch.cat([vector.unsqueeze(1).to(content.dtype), content[:, 1:]], dim=1)
        query = vector.unsqueeze(1).expand(-1, dec_tokens.size(1), -1)
        if safe_getattr(self.args, "decoder_query_layernorm", False):
            query, _ = embed.forward_embedding(dec_tokens, token_embedding=query)
        else:
            query = query + embed.embed_positions(dec_tokens)
        return query, content

    def decode(self, vector: torch.Tensor, dec_tokens: torch.Tensor, dec_hidden: torch.Tensor) -> torch.Tensor:
        """The enhanced decoder's output features (batch, T, dim) from the bottleneck vector (batch, dim)."""
        query, content = self.decoder_streams(vector, dec_tokens)
        return self.enhanced_decoder(query, content, dec_hidden)

    def vocabulary_pool(self, features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """DupMAE's max-pooled vocabulary vector (batch, vocab) over ``positions`` (Eq. 6-7),
        through the encoder's MLM head (dense, activation, LayerNorm, tied projection)."""
        mu, _ = vocab_max_pool(self.mlm_hidden(features), *self.mlm_projection(), positions)
        return mu

    def pretraining_forward(
        self,
        src_tokens,
        masked_tokens=None,
        return_all_hiddens=False,
        dec_tokens=None,
        dec_hidden=None,
        dec_positions=None,
        bow_positions=None,
        **unused,
    ) -> Tuple[torch.Tensor, dict]:
        """``(mlm_features, extra)``: ``extra["decoder_features"]`` the enhanced decoder's
        MLM-head features at ``dec_positions`` (n, dim), or at every position (batch, T, dim)
        without them (projection: ``decoder_projection()``, the MLM head's);
        ``extra["bow_logits"]`` the pooled vocabulary vector over ``bow_positions``
        (batch, vocab), or None."""
        if dec_tokens is None or dec_hidden is None:
            raise ValueError("the enhanced decoder needs both dec_tokens and dec_hidden (its attention masks)")
        features, extra = self.encode(src_tokens, return_all_hiddens=return_all_hiddens)
        decoded = self.decode(self.bottleneck_vector(features, src_tokens), dec_tokens, dec_hidden)
        extra["decoder_features"] = self.mlm_hidden(decoded, dec_positions)
        extra["bow_logits"] = self.vocabulary_pool(features, bow_positions) if bow_positions is not None else None
        return self.mlm_hidden(features, masked_tokens), extra


# ---------------------------------------------------------------------------
# Architectures: retromae_* and dupmae_* are the same model (see the module docstring)
# ---------------------------------------------------------------------------


@register_model_architecture("retromae", "retromae")
def base_architecture(args) -> None:
    """BERT-base encoder (12 x 768, FFN 3072, 12 heads) + a 1-layer enhanced decoder of the same width."""
    args.decoder_query_layernorm = safe_getattr(args, "decoder_query_layernorm", False)
    roberta_base_architecture(args)
    args.decoder_attention_heads = safe_getattr(args, "decoder_attention_heads", args.encoder_attention_heads)
    args.decoder_ffn_embed_dim = safe_getattr(args, "decoder_ffn_embed_dim", args.encoder_ffn_embed_dim)


@register_model_architecture("retromae", "retromae_base")
def retromae_base(args) -> None:
    base_architecture(args)


@register_model_architecture("retromae", "dupmae_base")
def dupmae_base(args) -> None:
    base_architecture(args)


def _tiny(args):
    tiny_encoder(args)
    base_architecture(args)


@register_model_architecture("retromae", "retromae_tiny")
def retromae_tiny(args) -> None:
    """A small model for tests and CPU demos (2 x 128 encoder, 4 heads, 1-layer decoder)."""
    _tiny(args)


@register_model_architecture("retromae", "dupmae_tiny")
def dupmae_tiny(args) -> None:
    """A small model for tests and CPU demos (2 x 128 encoder, 4 heads, 1-layer decoder)."""
    _tiny(args)
