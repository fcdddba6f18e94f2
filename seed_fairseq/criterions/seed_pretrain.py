"""MLM + weak-decoder reconstruction loss (SEED-Encoder, Eq. 10).

    loss = w_mlm * L_MLM + w_dec * L_dec

Each term is a per-token mean over its own tokens (masked positions for MLM,
every non-pad decoder target for reconstruction).  During training both means
divide by the GLOBAL count of their tokens in the whole update: all
micro-batches of ``--update-freq`` (counted ahead by the task's iterator,
see ``seed_fairseq/data/update_counts.py``) and all data-parallel workers
(all-reduced here).  The loss handed to fairseq is therefore already
normalised, and we report ``sample_size = 0`` so that fairseq's trainer only
undoes DDP's averaging (it multiplies by ``world_size / (sample_size or 1)``).
Gradients do not depend on how the batch is split.
"""

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.distributed import utils as distributed_utils

from ..data.update_counts import UPDATE_COUNTS, local_counts


@dataclass
class SeedPretrainCriterionConfig(FairseqDataclass):
    mlm_weight: float = field(
        default=0.5,
        metadata={
            "help": "weight of the MLM mean loss. 0.5/0.5 is the authors' code; the "
            "paper's Eq. 10 is a plain sum (1/1), which differs only by a factor 2 "
            "(relevant with gradient clipping)"
        },
    )
    decoder_weight: float = field(
        default=0.5,
        metadata={"help": "weight of the weak decoder's reconstruction mean loss (see --mlm-weight)"},
    )


def _global_counts(sample, pad):
    counts = sample.get(UPDATE_COUNTS)
    if counts is None:  # no lookahead iterator: this micro-batch is the update
        counts = local_counts(sample, pad)
    counts = counts.clone()  # the lookahead shares one tensor across a group
    if distributed_utils.get_data_parallel_world_size() > 1:
        distributed_utils.all_reduce(counts, group=distributed_utils.get_data_parallel_group())
    return counts


def _ppl(meters):
    # a log interval whose batches had no masked token has an mlm_loss meter
    # without a value (avg None): no perplexity then, not a crash
    avg = meters["mlm_loss"].avg if "mlm_loss" in meters else None
    return 2 ** avg if avg is not None else float("nan")


@register_criterion("seed_pretrain", dataclass=SeedPretrainCriterionConfig)
class SeedPretrainCriterion(FairseqCriterion):
    def __init__(self, task, mlm_weight=0.5, decoder_weight=0.5):
        super().__init__(task)
        self.mlm_weight = mlm_weight
        self.decoder_weight = decoder_weight

    def forward(self, model, sample, reduce=True):
        pad = self.padding_idx
        mlm_target = sample["target"]
        masked_tokens = mlm_target.ne(pad)
        mlm_logits, extra = model(**sample["net_input"], masked_tokens=masked_tokens)
        mlm_target = mlm_target[masked_tokens]

        # losses in fp32 whatever the model's precision
        mlm_nll = F.cross_entropy(mlm_logits.float(), mlm_target, reduction="sum")
        mlm_correct = (mlm_logits.argmax(-1) == mlm_target).sum()
        n_mlm, n_dec = local_counts(sample, pad)

        dec_logits = extra.get("decoder_out")
        if dec_logits is not None:
            dec_target = sample["dec_target"]
            dec_nll = F.cross_entropy(
                dec_logits.float().view(-1, dec_logits.size(-1)),
                dec_target.view(-1),
                ignore_index=pad,
                reduction="sum",
            )
            keep = dec_target.ne(pad)
            dec_correct = (dec_logits.argmax(-1).eq(dec_target) & keep).sum()
            dec_weight = self.decoder_weight
        else:  # MLM-only baseline (no decoder)
            dec_nll = mlm_nll.new_zeros(())
            dec_correct = n_dec = torch.zeros_like(n_mlm)
            dec_weight = 0.0

        if model.training:
            denom_mlm, denom_dec = _global_counts(sample, pad).unbind()
        else:
            denom_mlm, denom_dec = n_mlm, n_dec
        loss = self.mlm_weight * mlm_nll / denom_mlm.clamp(min=1)
        if dec_weight:
            loss = loss + dec_weight * dec_nll / denom_dec.clamp(min=1)

        logging_output = {
            "loss": loss.data,
            "mlm_nll": mlm_nll.data,
            "dec_nll": dec_nll.data,
            "mlm_ntokens": n_mlm.item(),
            "dec_ntokens": int(n_dec),
            "mlm_correct": mlm_correct.item(),
            "dec_correct": int(dec_correct),
            "ntokens": sample["ntokens"],
            "nsentences": sample["nsentences"],
            "sample_size": 0,
            # summed over micro-batches and workers like everything else, so
            # reduce_metrics recovers the weights as weight_sum / nlogs
            "mlm_weight": self.mlm_weight,
            "dec_weight": dec_weight,
            "nlogs": 1,
        }
        return loss, 0, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        def total(key):
            return sum(float(log.get(key, 0)) for log in logging_outputs)

        n_mlm, n_dec = total("mlm_ntokens"), total("dec_ntokens")
        metrics.log_scalar_sum("mlm_ntokens", n_mlm)
        metrics.log_scalar_sum("dec_ntokens", n_dec)
        metrics.log_scalar_sum("ntokens", total("ntokens"))
        metrics.log_scalar_sum("nsentences", total("nsentences"))
        # per-token means in base 2 (like fairseq), weighted by their token
        # counts so that averages over a log interval stay exact
        if n_mlm > 0:
            metrics.log_scalar("mlm_loss", total("mlm_nll") / n_mlm / math.log(2), n_mlm, round=3)
            metrics.log_scalar("mlm_acc", 100.0 * total("mlm_correct") / n_mlm, n_mlm, round=2)
        if n_dec > 0:
            metrics.log_scalar("dec_loss", total("dec_nll") / n_dec / math.log(2), n_dec, round=3)
            metrics.log_scalar("dec_acc", 100.0 * total("dec_correct") / n_dec, n_dec, round=2)
        nlogs = total("nlogs")
        if nlogs > 0:
            loss = 0.0
            if n_mlm > 0:
                loss += total("mlm_weight") / nlogs * total("mlm_nll") / n_mlm
            if n_dec > 0:
                loss += total("dec_weight") / nlogs * total("dec_nll") / n_dec
            metrics.log_scalar("loss", loss / math.log(2), 1, round=3)
        metrics.log_derived("mlm_ppl", _ppl)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
