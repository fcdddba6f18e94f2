"""A toy eighth objective, defined outside the plugin: the proof that an objective is its
own files plus one description (``test_toy_objective.py`` runs the contract on it).

* task ``toy_pretrain``: the shared pipeline and nothing more (no input of its own);
  its one extra term ``bow`` averages over texts;
* model ``toy_encoder`` / arch ``toy_encoder_tiny``: the plugin's encoder plus one
  pre-training-only head ``toy_head.`` (a linear map from the bottleneck vector, [CLS] by
  default, to the vocabulary);
* criterion ``toy_pretrain``: MLM, plus the bag of words of each text (its ordinary
  tokens, repeats included) predicted from the [CLS] vector alone.

Importing this module registers the three with fairseq (a subprocess imports it
before the tool runs: ``Objective.preload``).
"""

# isort: off
# first: the plugin then registers when fairseq is imported, and undoes the logging setup that
# fairseq's import does (fairseq-train's own would be ignored: no training log lines)
import seed_fairseq  # noqa: F401

# isort: on
from dataclasses import dataclass, field
from typing import Dict

import torch
import torch.nn.functional as F
from fairseq.criterions import register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.tasks import register_task

from seed_fairseq.base.objectives import ObjectiveDescription
from seed_fairseq.pretrain.criterions.multi_term import MultiTermCriterion, Term
from seed_fairseq.pretrain.models.bottleneck import BottleneckEncoderModel
from seed_fairseq.pretrain.tasks.bottleneck_pretrain import BottleneckPretrainConfig, BottleneckPretrainTask

TOY = ObjectiveDescription(
    "toy",
    "toy_pretrain",
    title="Toy objective",
    card_text="MLM plus the bag of words of each text predicted from the [CLS] vector (a test's toy)",
    tag="toy",
    label="Toy",
    test_arch="toy_encoder_tiny",
    terms=("mlm", "bow"),
    bottleneck_terms=("bow",),
    heads=("toy_head.",),
)


def ordinary(tokens: torch.Tensor, task) -> torch.Tensor:
    return tokens.ge(task.source_dictionary.nspecial) & tokens.ne(task.mask_idx)


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


@register_model_architecture("toy_encoder", "toy_encoder_tiny")
def toy_encoder_tiny(args) -> None:
    roberta_base_architecture(args)  # the tests give the encoder's sizes


@dataclass
class ToyCriterionConfig(FairseqDataclass):
    bow_weight: float = field(default=1.0, metadata={"help": "weight of the bag-of-words term"})


@register_criterion("toy_pretrain", dataclass=ToyCriterionConfig)
class ToyCriterion(MultiTermCriterion):
    bottleneck_terms = ("bow",)

    def __init__(self, task, bow_weight=1.0):
        super().__init__(task, {"mlm": 1.0, "bow": bow_weight})

    def compute_terms(self, model, sample) -> Dict[str, Term]:
        pad = self.padding_idx
        src, target = sample["net_input"]["src_tokens"], sample["target"]
        masked = target.ne(pad)
        # the task gives no input of its own: RoBERTa's forward, features of every position
        features, _ = model(src, features_only=True)
        weight, bias = model.mlm_projection()
        logits = F.linear(model.mlm_hidden(features, masked), weight, bias).float()
        mlm = F.cross_entropy(logits, target[masked], reduction="sum")
        mlm_correct = logits.argmax(-1).eq(target[masked]).sum()
        # the bag of words of the unmasked text, from the bottleneck vector only
        tokens = torch.where(masked, target, src)
        bag = ordinary(tokens, self.task)
        log_probs = F.log_softmax(model.toy_head(model.bottleneck_vector(features, src)).float(), dim=-1)
        picked = log_probs.gather(1, tokens) * bag
        bow = -(picked.sum(1) / bag.sum(1).clamp(min=1)).sum()
        return {"mlm": Term(mlm, mlm_correct), "bow": Term(bow)}
