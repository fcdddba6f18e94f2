"""What every bottleneck pre-training model of the plugin shares.

The encoder is fairseq's own ``RobertaEncoder`` (its ``encoder.*`` keys are
RoBERTa's, so the result is an ordinary RoBERTa after pre-training); an
objective adds modules that exist only for pre-training (a decoder, a
bag-of-words head ...) and sees the encoder through ONE vector per text,
:meth:`BottleneckEncoderModel.bottleneck_vector`: the encoder's last-layer
features pooled as the task's ``--bottleneck-pooling`` says (``cls``, the papers'
[CLS] vector, by default; ``mean``, ``max``, ``mean_sqrt_len``, ``lasttoken``:
sentence-transformers' ``Pooling`` modes, :func:`pool`), L2-normalised when the
model's vectors are compared by cosine (``--retrieval-similarity cosine``, unless
``--bottleneck-unnormalized``).  The pooling is done here once, by the stateless
``bottleneck`` module (its output is what the diagnostics rotate across a batch);
no objective pools on its own.  :meth:`BottleneckEncoderModel.sentence_embedding`
is the same pooling as the model's representation is scored (the validation's
retrieval, the diagnostics).

Each model class DECLARES what is pre-training-only:

* ``pretraining_only_prefixes`` -- state-dict prefixes (``weak_decoder.`` for
  SEED); ``seed-drop-heads`` and the HuggingFace export drop exactly these;
* ``pretraining_only_config_prefixes`` -- model config keys that go with them;
* ``pretraining_inputs`` -- the ``net_input`` entries only pre-training passes.

and fills in three template methods of :class:`BottleneckEncoderModel`:

* ``prepare_args(args)`` -- its architecture defaults and option checks, run by
  ``build_model`` (which does fairseq's OmegaConf struct handling once);
* ``pretraining_forward(src_tokens, masked_tokens=None, return_all_hiddens=False,
  **inputs) -> (mlm_features, extra)`` -- what ``forward`` runs when any of
  ``pretraining_inputs`` is given (otherwise ``forward`` is RoBERTa's own).  A model
  returns FEATURES, never vocabulary logits: ``mlm_features`` is what the MLM head's
  vocabulary projection takes (``mlm_hidden(features, masked_tokens)``); a decoder
  side predicting the vocabulary puts what ITS projection takes in
  ``extra["decoder_features"]`` (None when the model has no decoder).  The
  projections are ``mlm_projection()`` and ``decoder_projection()``, each
  ``(weight, bias or None)``; the criterion alone decides how to turn features and
  projection into a loss (``criterions/vocab_loss.py``: the full logits, or a fused
  linear cross-entropy that never materialises them);
* ``add_args(parser)`` -- an override must call the base's (checked when the class
  is created: every option of the base must be on the subclass's parser).

Module names must not start with ``decoder``: RoBERTa's
``upgrade_state_dict_named`` renames every key starting with ``decoder`` (an
old RoBERTa naming) and would silently corrupt the checkpoint.
"""

import argparse
import logging
from collections.abc import Mapping
from typing import Dict, FrozenSet, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.models.roberta import RobertaModel
from fairseq.utils import safe_getattr

from ...base.errors import ConfigurationError
from ...base.representation import POOLING_MODES, SIMILARITIES, option_values
from ..checkpoint import EMBED_KEY, CheckpointError
from ..option_ranges import check_ranges

logger = logging.getLogger(__name__)


# sentence-transformers' Pooling modes (its spelling of mean_sqrt_len: "mean_sqrt_len_tokens")


def pool(features: torch.Tensor, padding_mask: torch.Tensor, mode: str = "cls") -> torch.Tensor:
    """``(batch, dim)``: ``features`` ``(batch, time, dim)`` pooled over the positions that are
    not padding (``padding_mask`` ``(batch, time)``, True at a pad), exactly as
    sentence-transformers' ``Pooling`` pools a model's token embeddings with the attention
    mask ``~padding_mask`` (every non-pad position, the special tokens included):

    * ``cls`` -- the first non-pad position (position 0, the [CLS] token, in fairseq's
      right-padded batches);
    * ``mean`` -- the mean over the non-pad positions (summed in fp32 for fp16/bf16
      features, returned in their dtype); ``mean_sqrt_len`` -- their sum / sqrt(count);
    * ``max`` -- the per-dimension maximum over the non-pad positions;
    * ``lasttoken`` -- the last non-pad position.
    """
    valid = ~padding_mask
    if mode == "cls":
        first = valid.to(torch.int).argmax(dim=1)
        return features.gather(1, first.view(-1, 1, 1).expand(-1, 1, features.size(-1))).squeeze(1)
    if mode in ("mean", "mean_sqrt_len"):
        accumulate = torch.float32 if features.dtype in (torch.float16, torch.bfloat16) else features.dtype
        mask = valid.unsqueeze(-1).to(features.dtype)
        total = (features * mask).sum(dim=1, dtype=accumulate)
        count = torch.clamp(mask.sum(dim=1, dtype=accumulate), min=1e-9)
        return (total / (count if mode == "mean" else torch.sqrt(count))).to(features.dtype)
    if mode == "max":
        return features.masked_fill(padding_mask.unsqueeze(-1), float("-inf")).max(dim=1).values
    if mode == "lasttoken":
        length = features.size(1)
        values, from_end = valid.flip(1).max(1)
        from_end = torch.where(values == 0, length - 1, from_end)
        last = (length - from_end - 1).view(-1, 1, 1).expand(-1, 1, features.size(-1))
        return (features * valid.unsqueeze(-1).to(features.dtype)).gather(1, last).squeeze(1)
    raise ValueError(f"unknown pooling {mode!r}; one of {', '.join(POOLING_MODES)}")


class BottleneckPooling(torch.nn.Module):
    """The bottleneck: ``(features, padding_mask) -> (batch, dim)``, :func:`pool` then, with
    ``normalize``, L2 normalisation (sentence-transformers' ``Normalize``).  No weights (nothing
    in the state dict); a module so that a forward hook sees the vector every decoder reads."""

    def __init__(self, mode: str = "cls", normalize: bool = False):
        super().__init__()
        if mode not in POOLING_MODES:
            raise ValueError(f"unknown pooling {mode!r}; one of {', '.join(POOLING_MODES)}")
        self.mode = mode
        self.normalize = bool(normalize)

    def forward(self, features: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        vector = pool(features, padding_mask, self.mode)
        return F.normalize(vector, p=2, dim=-1) if self.normalize else vector

    def extra_repr(self) -> str:
        return f"mode={self.mode}, normalize={self.normalize}"


def vector_memory(vector: torch.Tensor) -> dict:
    """A decoder's whole view of the encoder as fairseq's encoder_out dict: one memory entry
    ``(1, batch, dim)``, the bottleneck vector ``(batch, dim)``, and no padding mask."""
    return {"encoder_out": [vector.unsqueeze(0)], "encoder_padding_mask": []}


def pooling_options(task_cfg) -> Tuple[str, str, bool]:
    """``(pooling, similarity, unnormalized)`` recorded in a task config (the task's ``cfg``, or a
    checkpoint's ``cfg["task"]``: a dict, an OmegaConf config or a Namespace); one without them
    (written before they existed, another task's) gives the papers' [CLS] and dot product
    (``base/representation.option_values``)."""
    values = option_values(task_cfg)
    get = task_cfg.get if isinstance(task_cfg, Mapping) else lambda key: safe_getattr(task_cfg, key, None)
    return str(values["bottleneck_pooling"]), str(values["retrieval_similarity"]), bool(get("bottleneck_unnormalized"))


def check_positions(args, task) -> None:
    """Refuse a model with fewer positions than the task's blocks, before it is built:
    fairseq would silently skip every longer block (nearly all of them in training)
    and stop on the first one in validation."""
    positions = safe_getattr(args, "max_positions", None)
    block = safe_getattr(getattr(task, "cfg", None), "tokens_per_sample", None)
    if positions is None or block is None or positions >= block:
        return
    raise ConfigurationError(
        f"--max-positions {positions} is below --tokens-per-sample {block}: blocks of {block} tokens do not fit "
        f"the model's {positions} positions; use --tokens-per-sample {positions} or less (an imported model's "
        "model_args.txt sets --max-positions to the number of positions it has)"
    )


def model_options(add_args, args) -> Dict[str, object]:
    """name -> value in ``args`` of every option ``add_args`` declares (the model's own options)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_args(parser)
    names = {action.dest for action in parser._actions if action.option_strings}
    return {name: safe_getattr(args, name, None) for name in sorted(names)}


def option_strings(add_args) -> FrozenSet[str]:
    """Every option string ``add_args`` puts on a fresh parser."""
    parser = argparse.ArgumentParser(add_help=False)
    add_args(parser)
    return frozenset(s for action in parser._actions for s in action.option_strings)


Projection = Tuple[torch.Tensor, Optional[torch.Tensor]]


class BottleneckEncoderModel(RobertaModel):
    """RoBERTa encoder + MLM head, plus modules used only in pre-training."""

    pretraining_only_prefixes: Tuple[str, ...] = ()
    pretraining_only_config_prefixes: Tuple[str, ...] = ()
    # given any of these (not None), forward is pretraining_forward
    pretraining_inputs: Tuple[str, ...] = ()

    @staticmethod
    def add_args(parser) -> None:
        """RoBERTa's options plus what every bottleneck model's encoder shares."""
        RobertaModel.add_args(parser)
        parser.add_argument(
            "--encoder-layer-norm-eps",
            type=float,
            metavar="EPS",
            help="epsilon of the encoder's LayerNorms (default: fairseq's 1e-5); 1e-12 continues a "
            "BERT model imported with examples/import_from_hf.py exactly",
        )

    @classmethod
    def prepare_args(cls, args) -> None:
        """Fill in the model's architecture defaults and check its options (``args`` is writable)."""

    @classmethod
    def build_model(cls, args, task) -> "BottleneckEncoderModel":
        from omegaconf import OmegaConf

        # every float option of the model finite, every dropout a probability (option_ranges.py)
        check_ranges(model_options(cls.add_args, args))
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)
        cls.prepare_args(args)
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)
        check_positions(args, task)
        # RobertaModel.build_model builds the encoder; the subclass's __init__ adds its modules.
        model = super().build_model(args, task)
        model.set_pooling(*pooling_options(getattr(task, "cfg", None)))
        return model

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        self.set_layer_norm_eps(self.encoder, safe_getattr(args, "encoder_layer_norm_eps", None))
        self.set_pooling()  # build_model sets the task's

    @staticmethod
    def set_layer_norm_eps(module: torch.nn.Module, eps: Optional[float]) -> None:
        """``--encoder-layer-norm-eps`` on every LayerNorm of ``module`` (the encoder, and a head built
        like its layers); None: fairseq's 1e-5.  fairseq builds every LayerNorm with eps 1e-5 and has no
        option for it (apex's FusedLayerNorm, used when installed, also reads .eps)."""
        if eps is None:
            return
        for m in module.modules():
            if "LayerNorm" in type(m).__name__ and hasattr(m, "eps"):
                m.eps = float(eps)

    def set_pooling(self, pooling: str = "cls", similarity: str = "dot", unnormalized: bool = False) -> None:
        """How the encoder's features become one vector per text: ``pooling`` (:func:`pool`) for
        the bottleneck and the representation; ``similarity`` how representations are compared
        (``cosine``: L2-normalised); the bottleneck reads the normalised vector with cosine
        unless ``unnormalized``."""
        if similarity not in SIMILARITIES:
            raise ValueError(f"unknown similarity {similarity!r}; one of {', '.join(SIMILARITIES)}")
        self.bottleneck = BottleneckPooling(pooling, normalize=similarity == "cosine" and not unnormalized)
        self.similarity = similarity

    @property
    def pooling(self) -> str:
        return self.bottleneck.mode

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for prefix in cls.pretraining_only_prefixes:
            if prefix.startswith("decoder") or not prefix.endswith("."):
                raise TypeError(
                    f"{cls.__name__}: pre-training-only prefix {prefix!r} must end with '.' and "
                    "must not start with 'decoder' (RoBERTa's upgrade code renames such keys)"
                )
        if "add_args" in cls.__dict__:
            # fairseq calls only the model's own add_args: one that skips its base's
            # rejects the base's options (--encoder-layer-norm-eps of an imported model)
            missing = option_strings(super(cls, cls).add_args) - option_strings(cls.add_args)
            if missing:
                raise TypeError(f"{cls.__name__}.add_args must call its base's add_args: it lacks {sorted(missing)}")

    def forward(
        self,
        src_tokens,
        features_only=False,
        return_all_hiddens=False,
        classification_head_name=None,
        **kwargs,
    ) -> Tuple[torch.Tensor, dict]:
        """RoBERTa's forward, or, given any of ``pretraining_inputs``, ``pretraining_forward``."""
        inputs = {name: kwargs.pop(name) for name in self.pretraining_inputs if name in kwargs}
        if all(value is None for value in inputs.values()):
            return super().forward(src_tokens, features_only, return_all_hiddens, classification_head_name, **kwargs)
        if features_only or classification_head_name is not None:
            raise ValueError(
                f"{type(self).__name__}: features_only / classification_head_name are RoBERTa's forward's; "
                f"not with the pre-training inputs {sorted(inputs)}"
            )
        return self.pretraining_forward(src_tokens, return_all_hiddens=return_all_hiddens, **inputs, **kwargs)

    def pretraining_forward(
        self, src_tokens, masked_tokens=None, return_all_hiddens=False, **inputs
    ) -> Tuple[torch.Tensor, dict]:
        """``(mlm_features, extra)``: the MLM head's features before its vocabulary projection
        at ``masked_tokens`` (every position when None) and the objective's outputs."""
        raise NotImplementedError(f"{type(self).__name__} declares no pre-training forward")

    def bottleneck_vector(self, features: torch.Tensor, src_tokens: torch.Tensor) -> torch.Tensor:
        """``(batch, dim)``: what every decoder and bottleneck head reads of the encoder, the
        last-layer ``features`` of ``src_tokens`` through the ``bottleneck`` module (pooled as
        ``--bottleneck-pooling``, normalised with ``--retrieval-similarity cosine``)."""
        return self.bottleneck(features, src_tokens.eq(self.encoder.sentence_encoder.padding_idx))

    def sentence_embedding(self, features: torch.Tensor, src_tokens: torch.Tensor) -> torch.Tensor:
        """``(batch, dim)``: the model's representation of ``src_tokens`` as it is scored (the
        validation's retrieval, the diagnostics): pooled like the bottleneck, L2-normalised when
        the similarity is cosine (then the inner product is the cosine)."""
        vector = pool(features, src_tokens.eq(self.encoder.sentence_encoder.padding_idx), self.pooling)
        return F.normalize(vector, p=2, dim=-1) if self.similarity == "cosine" else vector

    def encode(self, src_tokens, return_all_hiddens=False) -> Tuple[torch.Tensor, dict]:
        """Last-layer encoder features ``(batch, time, dim)`` and fairseq's extra dict."""
        return self.encoder.extract_features(src_tokens, return_all_hiddens=return_all_hiddens)

    def mlm_logits(self, features, masked_tokens=None) -> torch.Tensor:
        return self.encoder.output_layer(features, masked_tokens=masked_tokens)

    def mlm_hidden(self, features, masked_tokens=None) -> torch.Tensor:
        """RoBERTa's LM head up to its vocabulary projection (dense, activation, LayerNorm).

        ``F.linear(mlm_hidden(f, m), weight) + bias == mlm_logits(f, m)`` with
        ``weight, bias = mlm_projection()``.
        """
        head = self.encoder.lm_head
        if masked_tokens is not None:
            features = features[masked_tokens, :]
        return head.layer_norm(head.activation_fn(head.dense(features)))

    def mlm_projection(self) -> Projection:
        """(weight, bias) of the LM head's vocabulary projection (the weight is tied to the token embeddings)."""
        return self.encoder.lm_head.weight, self.encoder.lm_head.bias

    def decoder_projection(self) -> Projection:
        """(weight, bias or None) of the vocabulary projection ``extra["decoder_features"]`` goes
        through; a decoder that predicts through the MLM head (the default) shares ``mlm_projection()``."""
        return self.mlm_projection()

    def pretraining_only_modules(self) -> Dict[str, torch.nn.Module]:
        """name -> module for every declared pre-training-only prefix that exists."""
        return {
            p[:-1]: getattr(self, p[:-1])
            for p in self.pretraining_only_prefixes
            if getattr(self, p[:-1], None) is not None
        }

    def upgrade_state_dict_named(self, state_dict, name) -> None:
        prefix = name + "." if name != "" else ""
        embed = state_dict.get(prefix + EMBED_KEY)
        n_symbols = len(self.encoder.dictionary)
        if embed is not None and embed.size(0) != n_symbols:
            raise CheckpointError(
                "the checkpoint",
                f"dictionary size mismatch: the checkpoint's token embedding has "
                f"{embed.size(0)} rows but the data's dict.txt gives {n_symbols} symbols "
                "(including specials and <mask>); train/load with the dict.txt the "
                "checkpoint was trained with",
            )
        if embed is not None:
            for module_name, module in self.pretraining_only_modules().items():
                head = prefix + module_name + "."
                if not any(k.startswith(head) for k in state_dict):
                    # An encoder-only checkpoint (seed-drop-heads, an imported
                    # model) initialising a full model: keep the fresh weights.
                    logger.warning(
                        f"checkpoint has no {module_name} weights; keeping the freshly initialised {module_name} "
                        "(--freeze-encoder-updates N trains the fresh heads alone first: docs/hf.md)"
                    )
                    for k, v in module.state_dict().items():
                        state_dict[head + k] = v
        super().upgrade_state_dict_named(state_dict, name)


def tiny_encoder(args) -> None:
    """The encoder of every ``*_tiny`` architecture (tests and CPU demos): 2 x 128, FFN 256, 4 heads;
    anything set on the command line wins."""
    args.encoder_layers = safe_getattr(args, "encoder_layers", 2)
    args.encoder_embed_dim = safe_getattr(args, "encoder_embed_dim", 128)
    args.encoder_ffn_embed_dim = safe_getattr(args, "encoder_ffn_embed_dim", 256)
    args.encoder_attention_heads = safe_getattr(args, "encoder_attention_heads", 4)
