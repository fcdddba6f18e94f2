"""Bag-of-Word Prediction ("Drop your Decoder", Ma et al., SIGIR 2024): a RoBERTa encoder and
its MLM head, nothing else.  The bag of words is predicted from the bottleneck vector
(``bottleneck.py``; [CLS] by default) through the MLM head itself, so there is no
pre-training-only module: after pre-training the checkpoint is an ordinary RoBERTa
(``seed-drop-heads`` drops nothing).

The model remembers the update count the trainer hands it (``set_num_updates``, restored
on resume) for the criterion's optional decay of the bag-of-words weight.
"""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture

from .bottleneck import BottleneckEncoderModel, tiny_encoder


@register_model("bowpred")
class BowPredModel(BottleneckEncoderModel):
    """RoBERTa encoder + MLM head; the criterion reads the bottleneck vector through the MLM head."""

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        self.num_updates = 0

    def set_num_updates(self, num_updates) -> None:
        super().set_num_updates(num_updates)
        self.num_updates = int(num_updates)


@register_model_architecture("bowpred", "bowpred")
def base_architecture(args) -> None:
    """BERT-base's encoder (12 x 768, FFN 3072, 12 heads): the paper initialises from bert-base-uncased."""
    roberta_base_architecture(args)


@register_model_architecture("bowpred", "bowpred_base")
def bowpred_base(args) -> None:
    base_architecture(args)


@register_model_architecture("bowpred", "bowpred_tiny")
def bowpred_tiny(args) -> None:
    """A small model for tests and CPU demos (encoder 2 x 128, FFN 256, 4 heads)."""
    tiny_encoder(args)
    base_architecture(args)
