"""``cpdae_pretrain``: CPDAE's data (Xu et al., CIKM 2022, Sec. 3.1.1).

On top of the shared pipeline (``bottleneck_pretrain.py``: blocks, [CLS], the
encoder's MLM view) each text gets a SECOND, independently masked view
(``mask_view`` with another seed; the paper: "randomly mask its several tokens
twice") and its unmasked tokens, from which the criterion builds the multi-hot
bag-of-words target:

    s = [CLS] x1 .. xn  (unmasked)  ->  src_tokens,   target     (view 1, the base task's MLM view)
                                        src_tokens_2, target_2   (view 2)
                                        bow_tokens = s           (NOT a model input)

Both masks are drawn from ``(seed, epoch, index)`` (view 2 from ``seed +
VIEW_2_SEED_OFFSET``), so the views do not depend on the batch split and a
resumed run sees the same ones.
"""

from dataclasses import dataclass
from typing import Dict

import torch
from fairseq.data import RightPadDataset
from fairseq.distributed import utils as distributed_utils
from fairseq.tasks import register_task

from ...base.objectives import ObjectiveDescription
from .bottleneck_pretrain import BottleneckPretrainTask
from .config import BottleneckPretrainConfig

# any constant works: fairseq hashes (seed, epoch, index) into the mask generator's seed
VIEW_2_SEED_OFFSET = 7919


def has_negatives(sample, gathered: bool) -> bool:
    """Does the contrastive loss of this batch have a negative?  Not for a batch of one
    text contrasted on its own (``gathered``: over several workers, in training)."""
    return gathered or sample["bow_tokens"].size(0) >= 2


@dataclass
class CpdaePretrainConfig(BottleneckPretrainConfig):
    pass


CPDAE = ObjectiveDescription(
    "cpdae",
    "cpdae_pretrain",
    title="CPDAE",
    card_text="MLM plus a bag-of-words decoder on [CLS] and a contrast of the word distributions of two "
    "masked views (CPDAE, Xu et al., CIKM 2022)",
    tag="cpdae",
    paper="Xu et al., 'Contrastive Pre-training of a Discriminative Autoencoder for Dense Retrieval', CIKM 2022",
    paper_url="https://doi.org/10.1145/3511808.3557527",
    doc="docs/objectives/cpdae.md",
    heads_text="MLP from [CLS] to word occurrence; two views contrasted",
    label="CPDAE",
    arch="cpdae_base",
    texts_per_update_factor=0.5,
    texts_per_update_reason="encodes two masked views of every text",
    notes="MLM on two views + bag-of-words MLP decoder + JS contrast (lambda 0.1); half the texts "
    "per update (two views each)",
    order=40,
    test_arch="cpdae_tiny",
    terms=("mlm", "bow", "cl"),
    bottleneck_terms=("bow", "cl"),
    heads=("bow_decoder.",),
    in_batch_terms=("cl",),
)


@register_task("cpdae_pretrain", dataclass=CpdaePretrainConfig)
class CpdaePretrainTask(BottleneckPretrainTask):
    """MLM on two masked views + bag-of-words reconstruction + contrast of the views (CPDAE)."""

    cfg: CpdaePretrainConfig
    objectives = (CPDAE,)

    def extra_inputs(self, split, blocks, src, target) -> Dict:
        pad = self.source_dictionary.pad()
        src_2, target_2 = self.mask_view(blocks, seed=self.cfg.seed + VIEW_2_SEED_OFFSET)
        return {
            "net_input": {"src_tokens_2": RightPadDataset(src_2, pad_idx=pad)},
            "target_2": RightPadDataset(target_2, pad_idx=pad),
            "bow_tokens": RightPadDataset(blocks, pad_idx=pad),
        }

    def term_counts(self, sample) -> Dict[str, torch.Tensor]:
        pad = self.source_dictionary.pad()
        views = torch.tensor(2 * sample["bow_tokens"].size(0))
        # several workers: training gathers the negatives, validation's units are not summed over workers
        gathered = distributed_utils.get_data_parallel_world_size() > 1
        return {
            # MLM over the masked tokens of BOTH views
            "mlm": sample["target"].ne(pad).sum() + sample["target_2"].ne(pad).sum(),
            # bag-of-words reconstruction and contrast: one unit per view (none for a
            # contrast without negatives, which the criterion skips)
            "bow": views,
            "cl": views.clone() if has_negatives(sample, gathered) else torch.zeros_like(views),
        }
