"""A loss made of named terms, each a mean over its own units in the WHOLE update.

    loss = sum_t  w_t * loss_sum_t / N_t

``loss_sum_t`` is a term's loss summed over its units in one micro-batch (the
masked tokens of MLM, the decoder's targets, the sequences of a per-sequence
term ...) and ``N_t`` is the number of those units in the whole update: every
``--update-freq`` micro-batch (counted ahead by the task's batch iterator,
``data/update_counts.py``) and every data-parallel worker (all-reduced here).
The task defines the units (``task.term_counts(sample)``), so the counts the
lookahead sums and the counts the criterion logs are one function.

The loss handed to fairseq is already normalised, and ``sample_size = 0`` makes
fairseq's trainer only undo DDP's averaging (it multiplies the gradients by
``world_size / (sample_size or 1)``).  A term that is a per-unit quantity
(``loss_sum_t = sum_i l_i``) therefore contributes ``w_t * mean_i l_i`` over the
global update, whatever the split across micro-batches and workers.

A term whose per-unit loss depends on the other units of its batch (a
contrastive InfoNCE over in-batch negatives) is normalised the same way, by its
global unit count; what stays split-invariant then is stated by the objective
(e.g. CPDAE gathers the negatives over workers, so the worker split does not
matter, while ``--update-freq`` micro-batches see fewer negatives).

Logged for every term ``t``: ``t_loss`` (base 2, like fairseq: bits per unit),
``t_acc`` (%, when the term reports correct predictions) and ``t_ntokens``
(its units); plus ``loss`` (the weighted sum) and ``mlm_ppl``.  This is the
pattern of fairseq's ``criterions/model_criterion.py`` (named losses, a
weights dict, automatic logging) with the global-count normalisation added.
"""

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch
from fairseq import metrics
from fairseq.criterions import FairseqCriterion
from fairseq.distributed import utils as distributed_utils

from ..data.update_counts import UPDATE_COUNTS
from ..option_ranges import check_ranges

LN2 = math.log(2)


@dataclass
class Term:
    """One loss term of a micro-batch: its loss summed over its units (fp32) and,
    when it predicts something, the number of correct predictions."""

    loss: torch.Tensor
    correct: Optional[torch.Tensor] = None


def global_counts(sample: dict, local: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Each term's unit count over the whole update (all micro-batches, all workers)."""
    counts = sample.get(UPDATE_COUNTS)
    if counts is None:  # no lookahead iterator: this micro-batch is the update
        counts = local
    names = sorted(counts)
    # a fresh tensor: the lookahead shares one dict of counts across a group
    stacked = torch.stack([torch.as_tensor(counts[n]).long() for n in names]).to(
        next(iter(local.values())).device if local else "cpu"
    )
    if distributed_utils.get_data_parallel_world_size() > 1:
        distributed_utils.all_reduce(stacked, group=distributed_utils.get_data_parallel_group())
    return dict(zip(names, stacked.unbind()))


def _ppl(meters) -> float:
    # a log interval whose batches had no masked token has an mlm_loss meter
    # without a value (avg None): no perplexity then, not a crash
    avg = meters["mlm_loss"].avg if "mlm_loss" in meters else None
    return 2**avg if avg is not None else float("nan")


class MultiTermCriterion(FairseqCriterion):
    """Base of every pre-training criterion of the plugin.

    Subclasses set ``self.weights`` (term -> weight) and implement
    ``compute_terms(model, sample) -> Dict[str, Term]``.  A term the task counts
    but the model does not produce (the decoder of an MLM-only baseline) is
    logged with 0 units and weight 0.  ``bottleneck_terms`` names the terms
    that may depend on the encoder only through its bottleneck vector (the
    [CLS] vector, or the ``--bottleneck-pooling`` one; checked by the contract tests).
    Its config's options are checked against their ranges when fairseq builds it
    (:meth:`build_criterion`): a weight option named ``*_weight`` is a finite number >= 0 without
    a check of the subclass's own.
    """

    bottleneck_terms = ()

    @classmethod
    def build_criterion(cls, cfg, task):
        """fairseq's builder, after every option of ``cfg`` was checked against its range
        (``option_ranges.py``: every loss weight finite and >= 0, temperatures > 0 ..., for every
        objective alike)."""
        check_ranges(cfg)
        return super().build_criterion(cfg, task)

    def __init__(self, task, weights: Dict[str, float]):
        super().__init__(task)
        self.weights = dict(weights)

    def compute_terms(self, model, sample) -> Dict[str, Term]:
        raise NotImplementedError

    def forward(self, model, sample, reduce=True) -> Tuple[torch.Tensor, int, Dict[str, Any]]:
        terms = self.compute_terms(model, sample)
        local = self.task.term_counts(sample)
        unknown = sorted(set(terms) - set(local))
        if unknown:
            raise KeyError(f"terms {unknown} are not counted by task {type(self.task).__name__}.term_counts")
        denominators = global_counts(sample, local) if model.training else local

        loss = None
        logging_output = {}
        for name in local:
            term = terms.get(name)
            weight = self.weights.get(name, 1.0) if term is not None else 0.0
            if term is not None and weight:
                part = weight * term.loss / denominators[name].clamp(min=1)
                loss = part if loss is None else loss + part
            logging_output[f"{name}_loss_sum"] = term.loss.data if term is not None else 0.0
            logging_output[f"{name}_ntokens"] = int(local[name]) if term is not None else 0
            if term is not None and term.correct is not None:
                logging_output[f"{name}_correct"] = int(term.correct)
            # summed over micro-batches and workers like everything else, so
            # reduce_metrics recovers the weights as weight_sum / nlogs
            logging_output[f"{name}_weight"] = weight
        if loss is None:  # no term with a weight: keep the graph (and DDP) intact
            loss = sum(t.loss for t in terms.values()) * 0.0
        logging_output.update(
            loss=loss.data,
            ntokens=sample["ntokens"],
            nsentences=sample["nsentences"],
            sample_size=0,
            nlogs=1,
        )
        return loss, 0, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        def total(key):
            return sum(float(log.get(key, 0)) for log in logging_outputs)

        names = []
        for log in logging_outputs:
            for key in log:
                if key.endswith("_loss_sum") and key[: -len("_loss_sum")] not in names:
                    names.append(key[: -len("_loss_sum")])
        counts = {name: total(f"{name}_ntokens") for name in names}
        for name in names:
            metrics.log_scalar_sum(f"{name}_ntokens", counts[name])
        metrics.log_scalar_sum("ntokens", total("ntokens"))
        metrics.log_scalar_sum("nsentences", total("nsentences"))
        # per-unit means in base 2 (like fairseq), weighted by their unit counts
        # so that averages over a log interval stay exact
        for name in names:
            n = counts[name]
            if n > 0:
                metrics.log_scalar(f"{name}_loss", total(f"{name}_loss_sum") / n / LN2, n, round=3)
                if any(f"{name}_correct" in log for log in logging_outputs):
                    metrics.log_scalar(f"{name}_acc", 100.0 * total(f"{name}_correct") / n, n, round=2)
        nlogs = total("nlogs")
        if nlogs > 0:
            loss = sum(
                total(f"{name}_weight") / nlogs * total(f"{name}_loss_sum") / counts[name]
                for name in names
                if counts[name] > 0
            )
            metrics.log_scalar("loss", loss / LN2, 1, round=3)
        if "mlm" in names:
            metrics.log_derived("mlm_ppl", _ppl)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
