"""A toy eighth objective, defined outside the plugin: the proof that an objective is its
own files plus one description (``test_toy_objective.py`` runs the contract on it).

* task ``toy_pretrain``: the shared pipeline and nothing more (no input of its own);
  its one extra term ``bow`` averages over texts;
* model ``toy_encoder`` / arch ``toy_encoder_tiny``: the plugin's encoder plus one
  pre-training-only head ``toy_head.`` (a linear map from the bottleneck vector, [CLS] by
  default, to the vocabulary);
* criterion ``toy_pretrain``: MLM (through ``--vocab-loss``, as every objective's), plus
  the bag of words of each text (its ordinary tokens, repeats included) predicted from
  the bottleneck vector alone.

It keeps CONTRIBUTING's rules ("Adding a pre-training objective"): the criterion's
config subclasses ``VocabLossConfig`` and its ``__init__`` takes ``(cfg, task)`` as
fairseq's ``masked_lm``; vocabulary predictions go through ``vocabulary_term``; the
ordinary-token rule is the plugin's (``is_ordinary``).

Importing this module registers the three with fairseq (a subprocess imports it
before the tool runs: ``Objective.preload``; fairseq-train loads it with
``--user-dir tests/toy_user_dir``, its description's ``user_dir``, which is how the
workflows run it).
"""

# isort: off
# first: the plugin then registers when fairseq is imported, and undoes the logging setup that
# fairseq's import does (fairseq-train's own would be ignored: no training log lines)
import seed_fairseq  # noqa: F401

# isort: on
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict

import torch
import torch.nn.functional as F
from fairseq.criterions import register_criterion
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.tasks import register_task

from seed_fairseq.base.objectives import ObjectiveDescription
from seed_fairseq.base.vocabulary.dictionary import is_ordinary
from seed_fairseq.pretrain.criterions.multi_term import MultiTermCriterion, Term
from seed_fairseq.pretrain.criterions.vocab_loss import VocabLossConfig, VocabLossMixin
from seed_fairseq.pretrain.models.bottleneck import BottleneckEncoderModel
from seed_fairseq.pretrain.tasks.bottleneck_pretrain import BottleneckPretrainTask
from seed_fairseq.pretrain.tasks.config import BottleneckPretrainConfig

TOY = ObjectiveDescription(
    "toy",
    "toy_pretrain",
    title="Toy objective",
    card_text="MLM plus the bag of words of each text predicted from the [CLS] vector (a test's toy)",
    tag="toy",
    heads_text="a linear map from the bottleneck vector to the vocabulary",
    label="Toy",
    arch="toy_encoder_base",
    masking="15% (a toy's)",
    user_dir=str(Path(__file__).resolve().parent / "toy_user_dir"),
    test_arch="toy_encoder_tiny",
    terms=("mlm", "bow"),
    bottleneck_terms=("bow",),
    heads=("toy_head.",),
)


@dataclass
class ToyPretrainConfig(BottleneckPretrainConfig):
    pass


@register_task("toy_pretrain", dataclass=ToyPretrainConfig)
class ToyPretrainTask(BottleneckPretrainTask):
    objectives = (TOY,)

    def term_counts(self, sample) -> Dict[str, torch.Tensor]:
        counts = super().term_counts(sample)
        counts["bow"] = torch.tensor(sample["net_input"]["src_tokens"].size(0))
        return counts


@register_model("toy_encoder")
class ToyModel(BottleneckEncoderModel):
    pretraining_only_prefixes = ("toy_head.",)

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        self.toy_head = torch.nn.Linear(args.encoder_embed_dim, len(encoder.dictionary))


@register_model_architecture("toy_encoder", "toy_encoder_base")
def toy_encoder_base(args) -> None:
    roberta_base_architecture(args)  # RoBERTa-base's encoder, or the sizes given


@register_model_architecture("toy_encoder", "toy_encoder_tiny")
def toy_encoder_tiny(args) -> None:
    roberta_base_architecture(args)  # the tests give the encoder's sizes


@dataclass
class ToyCriterionConfig(VocabLossConfig):
    mlm_weight: float = field(default=1.0, metadata={"help": "weight of the MLM term"})
    bow_weight: float = field(default=1.0, metadata={"help": "weight of the bag-of-words term"})


@register_criterion("toy_pretrain", dataclass=ToyCriterionConfig)
class ToyCriterion(VocabLossMixin, MultiTermCriterion):
    bottleneck_terms = ("bow",)

    def __init__(self, cfg: ToyCriterionConfig, task):
        super().__init__(task, {"mlm": cfg.mlm_weight, "bow": cfg.bow_weight})
        self.set_vocab_loss(cfg)

    def compute_terms(self, model, sample) -> Dict[str, Term]:
        src, target = sample["net_input"]["src_tokens"], sample["target"]
        masked = target.ne(self.padding_idx)
        # the task gives no input of its own: RoBERTa's forward, features of every position
        features, _ = model(src, features_only=True)
        mlm = self.vocabulary_term(model.mlm_hidden(features, masked), model.mlm_projection(), target[masked])
        # the bag of words of the unmasked text, from the bottleneck vector only
        tokens = torch.where(masked, target, src)
        bag = is_ordinary(tokens, self.task.source_dictionary.nspecial, self.task.mask_idx)
        log_probs = F.log_softmax(model.toy_head(model.bottleneck_vector(features, src)).float(), dim=-1)
        picked = log_probs.gather(1, tokens) * bag
        bow = -(picked.sum(1) / bag.sum(1).clamp(min=1)).sum()
        return {"mlm": mlm, "bow": Term(bow)}
