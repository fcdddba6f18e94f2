"""``simlm_pretrain``: SimLM's data and its frozen generator (Wang et al., 2022).

On top of the shared pipeline (``bottleneck_pretrain.py``), every block
``[CLS] x1 .. xn`` gets, from ``(seed, epoch, index)``
(``data/replaced_lm_dataset.py``):

    src_tokens   the block with <mask> at the encoder's masked set (--mask-prob, 30%)
    dec_tokens   the block with <mask> at the decoder's masked set (--decoder-mask-prob, 50%) ⊇ the encoder's
    target       the original token at every non-special position
    enc_noise, dec_noise   the uniform noise with which the generator samples

The criterion has the frozen generator (loaded here, ``--generator-path``)
fill the masks (``replaced_inputs``) and trains encoder and decoder to predict
``target``.  The generator's path and sha256 travel with every checkpoint
(task state); a resume with another generator is refused.
"""

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Optional, Tuple

import torch
from fairseq.data import RightPadDataset
from fairseq.tasks import register_task

from ...base.objectives import ObjectiveDescription
from ..checkpoint import CheckpointError
from ..data.replaced_lm_dataset import FieldDataset, ReplacedLMNoiseDataset
from ..models.simlm import SimLMModel
from .bottleneck_pretrain import BottleneckPretrainTask
from .config import BottleneckPretrainConfig

if TYPE_CHECKING:
    from fairseq.criterions import FairseqCriterion

    from ..generator import FrozenGenerator

logger = logging.getLogger(__name__)

GENERATOR_PATH = "generator_path"
GENERATOR_SHA256 = "generator_sha256"


@dataclass
class SimLMPretrainConfig(BottleneckPretrainConfig):
    mask_prob: float = field(
        default=0.3,
        metadata={"help": "encoder replace rate: the share of maskable units the generator replaces (paper: 30%)"},
    )
    decoder_mask_prob: float = field(
        default=0.5,
        metadata={
            "help": "decoder replace rate (paper: 50%); the decoder's masked set contains the encoder's, "
            "so it must be >= --mask-prob"
        },
    )
    # the generator sees <mask> at every masked position (paper: Mask(x, p);
    # reference script: --all_use_mask_token True): no 80/10/10
    leave_unmasked_prob: float = field(default=0.0, metadata={"help": "must be 0 for simlm_pretrain"})
    random_token_prob: float = field(default=0.0, metadata={"help": "must be 0 for simlm_pretrain"})
    generator_path: Optional[str] = field(
        default=None,
        metadata={
            "help": "the frozen generator: a masked-LM checkpoint trained on the same dict.txt (e.g. "
            "--arch seed_encoder_mlm_only with a small encoder; see docs/objectives/simlm.md); required for training. "
            "Loaded like every checkpoint: refused if it holds more than the types fairseq checkpoints hold, "
            "unless --trust-checkpoint"
        },
    )
    allow_generator_change: bool = field(
        default=False,
        metadata={
            "help": "restore a checkpoint trained with another generator (different sha256); without it "
            "such a restore is refused"
        },
    )


SIMLM = ObjectiveDescription(
    "simlm",
    "simlm_pretrain",
    title="SimLM",
    card_text="replaced language modelling with a frozen generator, plus a shallow decoder that sees the "
    "encoder only through [CLS] (SimLM, Wang et al., 2022)",
    tag="simlm",
    paper="Wang et al., 'SimLM: Pre-training with Representation Bottleneck for Dense Passage Retrieval', ACL 2023",
    paper_url="https://arxiv.org/abs/2207.02578",
    doc="docs/objectives/simlm.md",
    heads_text="2 bidirectional layers copied from the encoder; a frozen generator replaces tokens",
    label="SimLM",
    arch="simlm_base",
    needs_generator=True,
    notes="replaced LM with a frozen generator (30% / 50%), 2-layer decoder copied from the encoder",
    masking="30% (50% for the decoder) replaced by its generator",
    order=30,
    test_arch="simlm_tiny",
    terms=("enc", "dec"),
    bottleneck_terms=("dec",),
    heads=("simlm_decoder.",),
)


@register_task("simlm_pretrain", dataclass=SimLMPretrainConfig)
class SimLMPretrainTask(BottleneckPretrainTask):
    """Replaced language modelling with a frozen generator (SimLM)."""

    cfg: SimLMPretrainConfig
    objectives = (SIMLM,)

    def __init__(self, cfg: SimLMPretrainConfig, dictionary=None):
        unsupported = {
            "--leave-unmasked-prob": cfg.leave_unmasked_prob != 0,
            "--random-token-prob": cfg.random_token_prob != 0,
            "--freq-weighted-replacement": cfg.freq_weighted_replacement,
            "--mask-multiple-length": cfg.mask_multiple_length != 1,
            "--mask-stdev": cfg.mask_stdev != 0,
        }
        bad = [option for option, used in unsupported.items() if used]
        if bad:
            raise ValueError(
                f"simlm_pretrain does not support {', '.join(bad)}: the generator sees <mask> at every "
                "masked position and replaces all of them"
            )
        if not 0.0 <= cfg.mask_prob <= cfg.decoder_mask_prob <= 1.0:
            raise ValueError(
                f"need 0 <= --mask-prob ({cfg.mask_prob}) <= --decoder-mask-prob ({cfg.decoder_mask_prob}) <= 1: "
                "the decoder's masked set contains the encoder's"
            )
        super().__init__(cfg, dictionary)
        self.generator = None  # loaded by build_criterion (training), not by tools that only read a model
        self.trust_generator = False  # --trust-checkpoint of the command that runs (setup_task)

    @classmethod
    def setup_task(cls, cfg: SimLMPretrainConfig, **kwargs) -> "SimLMPretrainTask":
        task = super().setup_task(cfg, **kwargs)
        # A task set up from a checkpoint's saved config (load_model_ensemble_and_task,
        # e.g. fairseq-validate, which then builds the criterion) never trusts: that
        # config is the checkpoint's word, not the user's.
        task.trust_generator = not kwargs.get("from_checkpoint", False) and bool(cfg.trust_checkpoint)
        return task

    # -- data -----------------------------------------------------------------------------

    def mask_view(self, blocks, seed: int, mask_prob: float = None) -> Tuple[FieldDataset, FieldDataset]:
        """(encoder view: <mask> at the encoder's masked set, RLM target); the view carries
        the joint draw (``.joint``) from which ``extra_inputs`` takes the decoder's side."""
        if mask_prob is not None:
            raise ValueError("simlm_pretrain draws its masked sets jointly; mask_prob is --mask-prob")
        joint = ReplacedLMNoiseDataset(
            blocks,
            self.source_dictionary,
            self.mask_idx,
            seed=seed,
            enc_prob=self.cfg.mask_prob,
            dec_prob=self.cfg.decoder_mask_prob,
            word_starts=self.whole_word_mask() if self.cfg.mask_whole_words else None,
        )
        src = FieldDataset(joint, "enc")
        src.joint = joint
        return src, FieldDataset(joint, "target")

    def extra_inputs(self, split, blocks, src, target) -> Dict:
        pad = self.source_dictionary.pad()
        joint = src.joint
        return {
            "net_input": {"dec_tokens": RightPadDataset(FieldDataset(joint, "dec"), pad_idx=pad)},
            "enc_noise": RightPadDataset(FieldDataset(joint, "enc_noise"), pad_idx=0),
            "dec_noise": RightPadDataset(FieldDataset(joint, "dec_noise"), pad_idx=0),
        }

    def term_counts(self, sample) -> Dict[str, torch.Tensor]:
        n = sample["target"].ne(self.source_dictionary.pad()).sum()
        return {"enc": n, "dec": n.clone()}

    # -- the generator --------------------------------------------------------------------

    def load_generator(self) -> "FrozenGenerator":
        if self.generator is None:
            from ..generator import FrozenGenerator

            self.generator = FrozenGenerator.load(self.cfg.generator_path, self, trust=self.trust_generator)
        return self.generator

    def build_criterion(self, cfg, from_checkpoint=False) -> "FairseqCriterion":
        # Only training and validation compute the loss; tools that load a
        # SimLM checkpoint to export or drop heads never need the generator.
        self.load_generator()
        return super().build_criterion(cfg, from_checkpoint)

    def replaced_inputs(self, sample, dtype: torch.dtype = torch.float32) -> Tuple[torch.Tensor, torch.Tensor]:
        """(encoder input, decoder input): the masked views with the generator's samples."""
        generator = self.generator
        if generator is None:
            raise RuntimeError("the generator is not loaded (task.load_generator(), done by build_criterion)")
        net_input = sample["net_input"]
        enc = generator.replace(net_input["src_tokens"], sample["enc_noise"], dtype)
        dec = generator.replace(net_input["dec_tokens"], sample["dec_noise"], dtype)
        return enc, dec

    # -- the generator identity travels with every checkpoint -----------------------------

    def state_dict(self) -> Dict[str, str]:
        state = super().state_dict()
        if self.generator is not None:
            state.update({GENERATOR_PATH: self.generator.path, GENERATOR_SHA256: self.generator.sha256})
        return state

    def check_checkpoint(self, state, filename) -> None:
        super().check_checkpoint(state, filename)
        recorded = (state.get("task_state") or {}).get(GENERATOR_SHA256)
        if self.generator is None or recorded is None:
            return  # no generator here (a tool reading the model) or none recorded there
        if not any(k.startswith(SimLMModel.pretraining_only_prefixes) for k in state.get("model") or {}):
            return  # an encoder-only checkpoint (seed-drop-heads keeps the task state) starting a new run
        if recorded != self.generator.sha256:
            recorded_path = state["task_state"].get(GENERATOR_PATH)
            problem = (
                f"trained with another generator ({recorded_path}, sha256 {recorded[:12]}...) than "
                f"--generator-path {self.generator.path} (sha256 {self.generator.sha256[:12]}...)"
            )
            if not self.cfg.allow_generator_change:
                raise CheckpointError(
                    filename, problem + "; pass the generator it was trained with, or --allow-generator-change"
                )
            logger.warning(f"{filename}: {problem}; continuing because of --allow-generator-change")
        elif os.path.abspath(state["task_state"].get(GENERATOR_PATH, "")) != self.generator.path:
            logger.info(f"{filename}: same generator (sha256) at a new path {self.generator.path}")
