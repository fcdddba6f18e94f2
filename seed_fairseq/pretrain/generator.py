"""SimLM's frozen generator: a masked LM that fills masked positions with samples.

The paper borrows ELECTRA-base's released generator; nothing is downloaded
here, so the generator is any fairseq masked-LM checkpoint trained on the same
``dict.txt`` (``--generator-path``): typically a small ``seed_encoder_mlm_only``
trained with this plugin on the same data (docs/objectives/simlm.md, "The generator, and how to make one").

Frozen means: eval mode, ``requires_grad`` off, and NOT a submodule of the
model or the criterion.  fairseq saves ``model.state_dict()`` (and the
criterion's when it has parameters) and gives the optimizer every parameter
of both, so a plain attribute keeps the generator out of checkpoints and
optimizer state; checkpoints record its path and sha256 instead (task state).
The price: fairseq does not move it, so :meth:`FrozenGenerator.replace` puts
it on the device and dtype it is asked for.

Sampling is at temperature 1, by inverse CDF with uniform noise that the data
pipeline supplies per position (``data/replaced_lm_dataset.py``): the same
tokens however a batch is split over ``--update-freq`` and workers, and after
a resume.
"""

import logging
import os
from typing import Optional

import torch

from ..base.fileio import sha256_file
from ..base.vocabulary.dictionary import is_ordinary
from .checkpoint import CheckpointError, model_config, read_checkpoint
from .checkpoint_records import match_dictionary
from .data.replaced_lm_dataset import NOISE_BITS

logger = logging.getLogger(__name__)

SAMPLE_CHUNK = 1024  # masked positions sampled at once (bounds the fp32 rows x vocab temporaries)


def inverse_cdf_sample(logits: torch.Tensor, u: torch.Tensor, banned: torch.Tensor) -> torch.Tensor:
    """One sample per row of ``softmax(logits)`` (banned ids get probability 0).

    ``u`` holds one uniform number in ``[0, 1)`` per row; the sample is the
    first id whose cumulative probability exceeds ``u``.  The cumulative sums
    are normalised so that the last one is exactly 1, so every ``u < 1`` finds
    an id, and a zero-probability id is never the first to exceed ``u``.
    """
    cdf = torch.softmax(logits.float().masked_fill(banned, float("-inf")), dim=-1).cumsum_(dim=-1)
    cdf.div_(cdf[:, -1:].clone())
    ids = torch.searchsorted(cdf, u.float().unsqueeze(-1), right=True).squeeze(-1)
    return ids.clamp_(max=logits.size(-1) - 1)


def uniform_from_noise(noise: torch.Tensor) -> torch.Tensor:
    """The data pipeline's integer noise as float32 uniforms in [0, 1) (exact)."""
    return noise.float() * 2.0**-NOISE_BITS


class FrozenGenerator:
    """A fairseq RoBERTa-style masked LM used only to sample replacements."""

    def __init__(self, model: torch.nn.Module, path: str, sha256: str, banned: torch.Tensor, mask_idx: int):
        self.model = model.eval().requires_grad_(False)
        self.path = path
        self.sha256 = sha256
        self.banned = banned
        self.mask_idx = mask_idx

    @classmethod
    def load(cls, path: Optional[str], task, trust: bool = False) -> "FrozenGenerator":
        """Read ``path`` and check it against ``task``'s dictionary: clear errors naming the file.

        Loaded without running code from it unless ``trust`` (``--trust-checkpoint``;
        ``checkpoint.load_torch_file``)."""
        from fairseq import models
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf
        from fairseq.models.roberta import RobertaModel

        if not path:
            raise ValueError(
                "--generator-path is required: a masked-LM checkpoint trained on the same dict.txt "
                "(e.g. --arch seed_encoder_mlm_only with a small encoder; see docs/objectives/simlm.md)"
            )
        path = os.path.abspath(path)
        try:
            state = read_checkpoint(path, trust=trust)
        except CheckpointError as e:  # missing, empty, truncated, not a checkpoint, untrusted types
            raise CheckpointError(path, f"--generator-path: {e.problem}") from None
        cfg = state["cfg"] if state.get("cfg") is not None else convert_namespace_to_omegaconf(state["args"])
        model_cfg = model_config(state)
        name = model_cfg.get("_name") or model_cfg.get("arch")
        model_class = models.MODEL_REGISTRY.get(models.ARCH_MODEL_NAME_REGISTRY.get(name, name))
        if not (isinstance(model_class, type) and issubclass(model_class, RobertaModel)):
            raise CheckpointError(
                path,
                f"--generator-path: not a masked language model (model {name!r}); the generator must be a "
                "RoBERTa-style masked LM with its MLM head, e.g. a checkpoint of --arch seed_encoder_mlm_only",
            )
        cls._check_dictionary(state, path, task)
        cls._check_trained_head(state, path)
        try:
            model = models.build_model(cfg.model, task)
            model.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
        except Exception as e:
            problem = f"--generator-path: cannot build the masked LM ({type(e).__name__}: {e})"
            raise CheckpointError(path, problem) from e
        if model.max_positions() < task.cfg.tokens_per_sample:
            raise CheckpointError(
                path,
                f"--generator-path: the generator has {model.max_positions()} positions, fewer than "
                f"--tokens-per-sample {task.cfg.tokens_per_sample}",
            )
        ids = torch.arange(len(task.source_dictionary))
        banned = ~is_ordinary(ids, task.source_dictionary.nspecial, task.mask_idx)
        sha = sha256_file(path)
        n_params = sum(p.numel() for p in model.parameters())
        logger.info(f"generator: {path} ({name}, {n_params} parameters, sha256 {sha[:12]}...), frozen")
        return cls(model, path, sha, banned, task.mask_idx)

    @staticmethod
    def _check_trained_head(state: dict, path: str) -> None:
        """An import of a HuggingFace model saved without its MLM head (``import_from_hf.py``
        records ``mlm_head: fresh``) has a random head: its samples would be noise."""
        source = (state.get("extra_state") or {}).get("seed_fairseq") or {}
        if source.get("source") == "import_from_hf" and source.get("mlm_head") == "fresh":
            raise CheckpointError(
                path,
                "--generator-path: an import whose MLM head is freshly initialised (the HuggingFace model "
                f"{source.get('model', '')} has none); its samples would be random tokens. Train the head first "
                "(continue the import with --arch seed_encoder_mlm_only, then pass that checkpoint) or import "
                "the model with its MLM head (a *ForMaskedLM folder); see docs/hf.md",
            )

    @staticmethod
    def _check_dictionary(state: dict, path: str, task) -> None:
        match = match_dictionary(state, task.dict_path, len(task.source_dictionary))
        if match.rows is None:
            raise CheckpointError(path, "--generator-path: not a masked language model (no token embedding)")
        if match.size_differs:
            raise CheckpointError(
                path,
                f"--generator-path: dictionary mismatch: the generator embeds {match.rows} symbols but "
                f"{task.dict_path} gives {match.size} (with specials and <mask>); train the generator on this data",
            )
        if match.recorded is None:
            logger.warning(f"{path}: the generator does not record its dictionary; cannot check {task.dict_path}")
        elif match.symbols_differ:
            raise CheckpointError(
                path,
                f"--generator-path: dictionary mismatch: trained with other symbols than {task.dict_path} "
                f"(same size; sha256 {match.recorded[:12]}... {match.source}); its token ids would mean other pieces",
            )

    def _place(self, device: torch.device, dtype: torch.dtype) -> None:
        weight = next(self.model.parameters())
        if weight.device != device or weight.dtype != dtype:
            self.model.to(device=device, dtype=dtype)
        if self.model.training:  # nothing but this class should touch it; stay safe
            self.model.eval()

    @torch.no_grad()
    def replace(self, masked: torch.Tensor, noise: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``masked`` with every ``<mask>`` replaced by a sample from the generator given ``masked``."""
        positions = masked.eq(self.mask_idx)
        out = masked.clone()
        if not positions.any():
            return out
        self._place(masked.device, dtype)
        logits, _ = self.model.encoder(masked, masked_tokens=positions)  # (masked positions, vocab)
        u = uniform_from_noise(noise[positions])
        banned = self.banned.to(logits.device)
        # in row chunks: the fp32 distributions of a whole batch (rows x vocab) would dwarf the model
        samples = [
            inverse_cdf_sample(logits[i : i + SAMPLE_CHUNK], u[i : i + SAMPLE_CHUNK], banned)
            for i in range(0, logits.size(0), SAMPLE_CHUNK)
        ]
        out[positions] = torch.cat(samples)
        return out
