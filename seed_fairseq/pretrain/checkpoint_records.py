"""What a fairseq checkpoint records: the encoder's architecture, the task's representation (and its
switches), the dictionary's identity (checked against a data folder's ``dict.txt``)."""

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ..base import representation
from ..base.vocabulary.dictionary import dictionary_sha256
from .checkpoint import (
    EMBED_KEY,
    CheckpointError,
    PathLike,
    plain_config,
    recorded_dictionary,
    task_config,
)

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# the encoder's architecture, as the checkpoint records it
# ---------------------------------------------------------------------------

# fairseq builds every LayerNorm of its RoBERTa encoder (and MLM head) with this eps and has no
# option for another; the plugin's models record theirs (--encoder-layer-norm-eps: 1e-12 in an
# import of BERT, models/bottleneck.py applies it)
FAIRSEQ_LAYER_NORM_EPS = 1e-5


@dataclass(frozen=True)
class EncoderArchitecture:
    """What the encoder of a checkpoint computes, as the checkpoint's config records it.

    The one reading of these facts for every tool that rebuilds the encoder outside the
    model class that trained it: ``seed-drop-heads`` (the encoder-only config), the
    HuggingFace export (its ``config.json``) and DupMAE's exported head.  An import
    (``hf/import_.py``) records each of them (``model_args.txt``: layers, sizes, positions,
    activation, LayerNorm eps); what it folds into the weights instead (BERT's token-type
    row, the position offset, the id order) needs no fact.  Defaults are fairseq's own
    (``roberta``'s base architecture), never a tool's."""

    layers: int
    embed_dim: int
    ffn_embed_dim: int
    attention_heads: int
    max_positions: int
    activation_fn: str
    layer_norm_eps: float

    def beyond_roberta(self) -> Dict[str, Any]:
        """The config entries stock fairseq's ``roberta`` cannot build (it ignores them);
        {} when ``roberta`` computes this encoder exactly."""
        if self.layer_norm_eps == FAIRSEQ_LAYER_NORM_EPS:
            return {}
        return {"encoder_layer_norm_eps": self.layer_norm_eps}


# field -> (cfg.model key, fairseq's default: None = the config must name it, type)
_ARCHITECTURE_KEYS = {
    "layers": ("encoder_layers", None, int),
    "embed_dim": ("encoder_embed_dim", None, int),
    "ffn_embed_dim": ("encoder_ffn_embed_dim", None, int),
    "attention_heads": ("encoder_attention_heads", None, int),
    "max_positions": ("max_positions", 512, int),
    "activation_fn": ("activation_fn", "gelu", str),
    "layer_norm_eps": ("encoder_layer_norm_eps", FAIRSEQ_LAYER_NORM_EPS, float),
}


def encoder_architecture(model_cfg: Any, path: PathLike = "the checkpoint") -> EncoderArchitecture:
    """The :class:`EncoderArchitecture` of a checkpoint's ``cfg.model`` (a dict, Namespace or
    DictConfig); :class:`CheckpointError` naming ``path`` for an entry missing or of the wrong type."""
    cfg = plain_config(model_cfg)
    if not isinstance(cfg, dict):
        raise CheckpointError(path, f"its model config is a {type(cfg).__name__}, not a mapping")
    facts = {}
    for name, (key, default, kind) in _ARCHITECTURE_KEYS.items():
        value = cfg.get(key)
        if value is None:
            if default is None:
                raise CheckpointError(path, f"its model config has no {key!r}")
            value = default
        numeric = kind in (int, float) and not isinstance(value, bool) and isinstance(value, (int, float))
        if not (numeric or isinstance(value, kind)) or (kind is int and value != int(value)):
            wanted = {int: "an integer", float: "a number", str: "a string"}[kind]
            raise CheckpointError(path, f"its model config has {key}={value!r}, not {wanted}")
        facts[name] = kind(value)
    return EncoderArchitecture(**facts)


# The task options that say which vector the model is scored and pre-trained on: the model's
# representation (base/representation.py: --bottleneck-pooling, --retrieval-similarity,
# --retrieval-max-length, --retrieval-raw-vectors) and what the bottleneck reads of it
# (--bottleneck-unnormalized, models/bottleneck.py)
REPRESENTATION_OPTIONS = (*representation.OPTIONS, "bottleneck_unnormalized")


def representation_options(state: dict) -> Dict[str, Any]:
    """The model's representation options as the checkpoint records them: its task config's, or,
    in an encoder-only checkpoint of ``seed-drop-heads`` (whose task config is stock
    ``masked_lm``'s, which has no such option), ``extra_state["seed_fairseq"]["representation_options"]``.
    Options a checkpoint does not record are left out (``base.representation.option_values``
    gives the papers' [CLS] and dot product for them)."""
    extra = (state.get("extra_state") or {}).get("seed_fairseq") or {}
    kept = extra.get("representation_options") if isinstance(extra, dict) else None
    source = kept if isinstance(kept, dict) else task_config(state)
    return {k: source[k] for k in REPRESENTATION_OPTIONS if source.get(k) is not None}


# where a checkpoint's task state lists the switches of those options in its lineage, oldest first: each
# {"update": N, "checkpoint": FILE continued, "from": {option: value}, "to": {option: value}}
# (--allow-representation-change, tasks/representation.py)
REPRESENTATION_CHANGES = "representation_changes"


def representation_changes(state: dict, path: PathLike = "the checkpoint") -> List[Dict[str, Any]]:
    """The switches of the representation options a checkpoint records ([] for none);
    :class:`CheckpointError` naming ``path`` when the entry is not a list of records."""
    changes = (state.get("task_state") or {}).get(REPRESENTATION_CHANGES)
    if changes is None:
        return []
    if not isinstance(changes, list) or not all(isinstance(c, dict) for c in changes):
        raise CheckpointError(path, f"its task state's {REPRESENTATION_CHANGES!r} is not a list of records")
    return [dict(c) for c in changes]


def embedding_rows(state: dict) -> Optional[int]:
    weight = (state.get("model") or {}).get(EMBED_KEY)
    return None if weight is None else int(weight.shape[0])


@dataclass(frozen=True)
class DictionaryMatch:
    """How a checkpoint's vocabulary compares with a data folder's ``dict.txt``: the one
    decision every tool takes before loading, exporting or resuming (their messages differ)."""

    rows: Optional[int]  # the checkpoint's token-embedding rows (None: it has no embedding)
    size: int  # symbols of the dictionary, specials and <mask> included
    recorded: Optional[str]  # the dictionary_sha256 the checkpoint records (None: not recorded)
    current: str  # dictionary_sha256 of dict.txt (computed only when the sizes agree)
    source: str  # where ``recorded`` came from

    @property
    def size_differs(self) -> bool:
        return self.rows is not None and self.rows != self.size

    @property
    def symbols_differ(self) -> bool:
        return not self.size_differs and self.recorded is not None and self.recorded != self.current


def match_dictionary(state: dict, dict_path: PathLike, dictionary_size: int) -> DictionaryMatch:
    rows = embedding_rows(state)
    if rows is not None and rows != dictionary_size:
        return DictionaryMatch(rows, dictionary_size, None, "", "not compared")
    recorded, source = recorded_dictionary(state)
    return DictionaryMatch(rows, dictionary_size, recorded, dictionary_sha256(dict_path), source)


def check_dictionary(
    state: dict,
    path: PathLike,
    dict_path: PathLike,
    dictionary_size: int,
    allow_change: bool = False,
    option: str = "--allow-dictionary-change",
) -> None:
    """Refuse a checkpoint trained with another dictionary than ``dict_path``.

    ``dictionary_size`` counts every symbol the model embeds (specials and
    ``<mask>`` included).  A size mismatch is always an error (the weights
    cannot be loaded); same size with other symbols is an error unless
    ``allow_change`` (a deliberate vocabulary change: ids keep their rows).
    """
    match = match_dictionary(state, dict_path, dictionary_size)
    if match.size_differs:
        raise CheckpointError(
            path,
            f"dictionary size mismatch: the checkpoint's token embedding has {match.rows} rows but "
            f"{dict_path} gives {dictionary_size} symbols (including specials and <mask>); "
            "use the data folder (dict.txt) the checkpoint was trained with",
        )
    if match.recorded is None:
        logger.warning(
            f"{path}: the checkpoint does not record its dictionary ({match.source}); "
            f"cannot check that {dict_path} is the one it was trained with"
        )
        return
    if match.symbols_differ:
        problem = (
            f"trained with a different dictionary than {dict_path} (same size, other symbols: "
            f"sha256 {match.recorded[:12]}... {match.source}, {match.current[:12]}... in the data); the token ids "
            "would not match the embeddings"
        )
        if not allow_change:
            raise CheckpointError(
                path,
                problem + f"; use the data folder it was trained on, or pass "
                f"{option} to change the vocabulary on purpose",
            )
        logger.warning(f"{path}: {problem}; continuing because of {option}")
