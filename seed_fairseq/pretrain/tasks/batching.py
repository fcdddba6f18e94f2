"""Batching: the global-count lookahead of ``--update-freq`` micro-batches, fairseq's dummy batch,
and the refusals of a split that would give no batch or fewer validation blocks than the probe needs."""

import inspect
from typing import Any, Dict, Tuple

import torch

from ...base.errors import ConfigurationError
from .. import diagnostics
from ..data.update_counts import UPDATE_COUNTS, UpdateCountsEpochBatchIterator

# set on fairseq's dummy batch (see BottleneckPretrainTask.train_step)
DUMMY_BATCH = "dummy_batch"


class Batching:
    """The task's batch iterator and its checks."""

    def get_batch_iterator(self, dataset, *args, **kwargs) -> UpdateCountsEpochBatchIterator:
        options = inspect.signature(super().get_batch_iterator).bind(dataset, *args, **kwargs)
        options.apply_defaults()
        max_tokens = options.arguments["max_tokens"]
        if max_tokens is not None and max_tokens < self.cfg.tokens_per_sample:
            raise ConfigurationError(
                f"--max-tokens {max_tokens} is below --tokens-per-sample {self.cfg.tokens_per_sample}: "
                "a full block would not fit in any batch; raise --max-tokens or lower --tokens-per-sample"
            )
        epoch_iter = super().get_batch_iterator(dataset, *args, **kwargs)
        split = next((name for name, d in self.datasets.items() if d is dataset), None)
        if split is not None:
            self.check_batches(split, len(epoch_iter.frozen_batches), options.arguments["required_batch_size_multiple"])
        try:
            update_freq = [int(u) for u in self.cfg.update_freq]  # a ListConfig in fairseq-train
        except (TypeError, ValueError):
            update_freq = [1]  # the task built outside fairseq-train: no interpolation
        return UpdateCountsEpochBatchIterator(epoch_iter, update_freq, self.term_counts)

    def check_batches(self, split: str, batches: int, required_batch_size_multiple: int) -> None:
        """Refuse, before training, a split that gives no batch and a probe larger than the
        validation split (what fairseq would report as "The dataset is empty", or never)."""
        split_file = self._split_path(split) + ".bin"
        blocks = len(self.datasets[split])
        if batches == 0:
            if split == "train":
                what, fix = "training would have no batch", "use more training text, or pass"
            else:
                what = "validation would be empty"
                fix = "hold out more documents (preprocess.build --valid-docs), pass --disable-validation, or"
            default = " (fairseq's default)" if required_batch_size_multiple == 8 else ""
            raise ConfigurationError(
                f"{what}: the '{split}' split has {blocks} blocks of up to {self.cfg.tokens_per_sample} tokens "
                "and fairseq drops the last batch of a split whose size is not a multiple of "
                f"--required-batch-size-multiple {required_batch_size_multiple}{default}, which leaves no batch; "
                f"{fix} --required-batch-size-multiple 1",
                split_file,
            )
        size = self.cfg.retrieval_probe_size
        if split == "valid" and size > 0 and not self.cfg.no_diagnostics:
            d = self.source_dictionary
            pairs = len(diagnostics.probe_pairs(self.unmasked_blocks[split], size, d.bos(), d.eos(), d.pad()))
            if pairs < size:
                raise ConfigurationError(
                    f"--retrieval-probe-size {size} needs {size} validation blocks of at least 4 tokens, the "
                    f"'valid' split has {pairs}: lower --retrieval-probe-size or hold out more documents "
                    "(preprocess.build --valid-docs)",
                    split_file,
                )

    def train_step(
        self, sample, model, criterion, optimizer, update_num, ignore_grad=False
    ) -> Tuple[torch.Tensor, Any, Dict[str, Any]]:
        if ignore_grad:
            # fairseq's dummy batch (a copy of an earlier one, used when this worker ran out of
            # data): marked DUMMY_BATCH for the criterion (CPDAE's views must not become the other
            # workers' negatives) and adding nothing to the update's counts
            sample = dict(sample)
            sample[DUMMY_BATCH] = True
            if UPDATE_COUNTS in sample:
                sample[UPDATE_COUNTS] = {
                    k: torch.zeros_like(torch.as_tensor(v)) for k, v in sample[UPDATE_COUNTS].items()
                }
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
