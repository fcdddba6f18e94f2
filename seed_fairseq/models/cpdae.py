"""CPDAE: a RoBERTa encoder pre-trained with MLM plus a bag-of-words MLP decoder on its
[CLS] vector, whose word distributions are contrasted across two masked views of each
text (Xu et al., "Contrastive Pre-training of a Discriminative Autoencoder for Dense
Retrieval", CIKM 2022).

The encoder is fairseq's own ``RobertaEncoder`` (``encoder.*`` keys are RoBERTa's);
the MLP decoder lives under ``bow_decoder.*``, declared pre-training-only, so
``seed-drop-heads`` and the HuggingFace export leave it out.
"""

from typing import Tuple

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture

from ..modules.bow_decoder import BowMLPDecoder
from .bottleneck import BottleneckEncoderModel, tiny_encoder


@register_model("cpdae")
class CpdaeModel(BottleneckEncoderModel):
    """RoBERTa encoder + MLM head, plus the bag-of-words MLP decoder used only in pre-training."""

    pretraining_only_prefixes = ("bow_decoder.",)
    pretraining_inputs = ("src_tokens_2",)

    def __init__(self, args, encoder):
        super().__init__(args, encoder)  # applies BERT init to the encoder
        self.bow_decoder = BowMLPDecoder(args.encoder_embed_dim, len(encoder.dictionary))

    def pretraining_forward(
        self, src_tokens, masked_tokens=None, return_all_hiddens=False, src_tokens_2=None, **unused
    ) -> Tuple[torch.Tensor, dict]:
        """Both views go through the encoder as ONE batch ``[view 1; view 2]`` (one forward,
        so DDP sees one forward per backward); ``masked_tokens`` is over that ``(2B, T)``
        batch.  ``extra["cls"]``: the ``(2B, dim)`` [CLS] vectors; ``extra["bow_logits"]``:
        the bag-of-words decoder's ``(2B, |V|)`` logits."""
        if src_tokens_2.shape != src_tokens.shape:
            raise ValueError(
                f"the two views must have the same shape, got {tuple(src_tokens.shape)} and {tuple(src_tokens_2.shape)}"
            )
        features, extra = self.encode(torch.cat([src_tokens, src_tokens_2]), return_all_hiddens=return_all_hiddens)
        extra["cls"] = self.cls_vector(features)
        extra["bow_logits"] = self.bow_decoder(extra["cls"])
        return self.mlm_hidden(features, masked_tokens), extra


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
