"""Reading and checking fairseq checkpoints safely.

Shared by ``fairseq-train`` (through ``fairseq_patches``), ``seed-drop-decoder`` and the
HuggingFace export:

* :func:`load_torch_file` -- ``torch.load`` that runs no code from the file:
  torch's ``weights_only`` unpickler with an allowlist of the types fairseq
  checkpoints hold (:data:`CHECKPOINT_TYPES`); a file needing anything else is
  refused in one line naming the type, unless the user trusts it
  (``--trust-checkpoint``: :func:`trusting`).  fairseq's own checkpoint code
  loads through it too (``fairseq_patches.checkpoint_loading``);
* :func:`read_checkpoint` -- one clear error for a file that is missing, not a
  checkpoint, or truncated;
* :func:`peek_checkpoint` -- the metadata of a checkpoint (config, task state,
  tensor shapes) without reading its tensors (memory-mapped), its entries checked
  (:func:`check_entries`: one ``FILE: problem`` for a wrongly typed one;
  :func:`check_encoder_entries`: no token embedding, no model config);

Beside it, ``checkpoint_records.py`` reads what a checkpoint records (:func:`encoder_architecture`
for every tool that rebuilds the encoder, the task's representation options, and
:func:`check_dictionary`: the token embedding and recorded dictionary identity against a data
folder's ``dict.txt``), and ``checkpoint_files.py`` handles a save folder's files
(:func:`newest_readable_checkpoint`: what a restart falls back to when ``checkpoint_last.pt`` is
missing or damaged; :func:`save_atomic`: ``torch.save`` to a temporary name, fsync, rename).
"""

import _compat_pickle
import argparse
import contextlib
import contextvars
import copy
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional, Tuple, Union

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from ..base.vocabulary.dictionary import dictionary_sha256

logger = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]

EMBED_KEY = "encoder.sentence_encoder.embed_tokens.weight"
# where a checkpoint records the identity of the dictionary it was trained with
DICTIONARY_SHA256 = "dictionary_sha256"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used as asked; ``str()`` is ``FILE: problem``."""

    def __init__(self, path: PathLike, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def plain_config(cfg: Any) -> Any:
    """Config -> plain dicts/lists (fairseq keeps argparse models' config as a Namespace)."""
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    if isinstance(cfg, argparse.Namespace):
        cfg = vars(cfg)
    if isinstance(cfg, dict):
        return {k: plain_config(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [plain_config(v) for v in cfg]
    return copy.deepcopy(cfg)


# ---------------------------------------------------------------------------
# loading without running code
# ---------------------------------------------------------------------------

TRUST_OPTION = "--trust-checkpoint"

try:  # numpy >= 2 (numpy 1.26 has the alias too)
    from numpy._core.multiarray import scalar as _numpy_scalar
except ImportError:  # older numpy
    from numpy.core.multiarray import scalar as _numpy_scalar

# What fairseq checkpoints hold besides tensors and plain containers (dict, list,
# tuple, set, str, numbers, OrderedDict, torch.Size: torch's weights_only
# unpickler accepts those by itself).  Found by listing the globals
# (``torch.serialization.get_unsafe_globals_in_checkpoint``) of real checkpoints
# of every kind this project meets: fairseq-train checkpoints of every objective
# and of stock ``masked_lm``/``roberta`` (with validation, --keep-best-checkpoints,
# --tensorboard-logdir, --store-ema), the 0.1 fixture, seed-drop-heads and
# import_from_hf outputs, the SimLM generator; ``tests/test_faults_trust.py``
# keeps loading one of each.  Plain data only: classes whose unpickling sets
# attributes, numpy's scalar constructor -- never a function that acts.
# (name the pickle gives it, the object, where it comes from)
CHECKPOINT_TYPES: Tuple[Tuple[str, Any, str], ...] = (
    (
        "argparse.Namespace",
        argparse.Namespace,
        "fairseq's 'args' (argparse-era checkpoints: the 0.1 fixture) and 'cfg.model' of every architecture "
        "registered with register_model_architecture (every plugin model, stock roberta)",
    ),
    (
        "numpy._core.multiarray.scalar",
        _numpy_scalar,
        "numpy scalars: a meter fed a numpy number keeps it through fairseq's safe_round, and so do "
        "extra_state 'val_loss'/'best' and the lr scheduler's 'best' (pickled by numpy >= 2)",
    ),
    ("numpy.core.multiarray.scalar", _numpy_scalar, "the same, pickled by numpy 1"),
    ("numpy.dtype", np.dtype, "the dtype of a numpy scalar"),
)
# numpy 2 rebuilds a scalar's dtype as an instance of its dtype class (numpy.dtypes.Float64DType ...):
# bool, integers, floats and complex numbers; never object, string or void dtypes
NUMPY_SCALAR_CODES = "?bBhHiIlLqQefdgFDG"

_ALLOWED = [(obj, name) for name, obj, _ in CHECKPOINT_TYPES] + [type(np.dtype(c)) for c in NUMPY_SCALAR_CODES]

# torch names the global its unpickler refuses (builtins without their module)
# or the class it will not build
_REFUSED_TYPE = re.compile(r"GLOBAL (\S+) (?:was not an allowed global|whose module)|but got <class '([^']+)'>")

_trusted = contextvars.ContextVar("seed_fairseq_trust_checkpoint", default=False)


class UntrustedCheckpointError(CheckpointError):
    """The file holds a pickled object of a type outside :data:`CHECKPOINT_TYPES`."""

    def __init__(self, path: PathLike, type_name: str):
        self.type_name = type_name
        super().__init__(
            path,
            f"holds a pickled {type_name!r} object, not one of the types a fairseq checkpoint holds; loading "
            f"it could run code. Pass {TRUST_OPTION} if you trust this file",
        )


@contextlib.contextmanager
def trusting(trust: Optional[bool]) -> Iterator[None]:
    """Inside, checkpoint loads that do not decide themselves (``trust=None``, and
    fairseq's own through ``fairseq_patches``) use the full unpickler if ``trust``; None
    keeps the enclosing decision."""
    token = _trusted.set(_trusted.get() if trust is None else bool(trust))
    try:
        yield
    finally:
        _trusted.reset(token)


def refused_type(message: str) -> Optional[str]:
    """The type named by torch's weights_only ``UnpicklingError`` message, if any, as
    Python's unpickler would import it (``torch.save`` writes protocol 2, whose
    Python 2 names, e.g. ``commands.call`` for ``subprocess.call``, pickle maps back)."""
    m = _REFUSED_TYPE.search(message)
    if m is None:
        return None
    module, _, name = (m.group(1) or m.group(2)).rpartition(".")
    module = module or "builtins"
    fixed = (_compat_pickle.IMPORT_MAPPING.get(module, module), name)
    return ".".join(_compat_pickle.NAME_MAPPING.get((module, name), fixed))


def unpickler_reason(message: str) -> str:
    """torch's paragraphs of advice around a weights_only failure -> the unpickler's own reason."""
    for line in message.split("WeightsUnpickler error:")[-1].splitlines():
        line = line.strip()
        if line and not line.startswith(("Weights only load failed", "Check the documentation")):
            return line
    return "not a pickle torch can read"


def load_torch_file(
    f: Union[PathLike, BinaryIO], map_location: Any = "cpu", mmap: bool = False, trust: Optional[bool] = None
) -> Any:
    """``torch.load`` of a checkpoint that runs no code from it.

    ``weights_only`` with :data:`CHECKPOINT_TYPES` allowed while this call
    loads (``safe_globals`` as a context: torch's allowlist is not widened for
    the rest of the process), unless ``trust`` (None: as the enclosing :func:`trusting` says,
    untrusted by default).  Raises :class:`UntrustedCheckpointError` naming the
    type for a file that holds anything else; other unpickling failures as a
    one-line ``pickle.UnpicklingError``.  ``mmap`` needs a path.
    """
    trust = _trusted.get() if trust is None else trust
    extra = {"mmap": True} if mmap else {}
    if trust:
        # Trusted file: reached only when the user passed --trust-checkpoint for this run or
        # tool (``trusting``), i.e. vouched for the file; the default is the allowlist below.
        return torch.load(f, map_location=map_location, weights_only=False, **extra)  # trusted by the user
    try:
        with torch.serialization.safe_globals(_ALLOWED):
            return torch.load(f, map_location=map_location, weights_only=True, **extra)
    except pickle.UnpicklingError as e:
        name = refused_type(str(e))
        if name is not None:
            path = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", "the checkpoint")
            raise UntrustedCheckpointError(path, name) from None
        raise pickle.UnpicklingError(unpickler_reason(str(e))) from None


def _load_mapped(path: Path) -> Any:
    try:
        return load_torch_file(path, mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):  # legacy (non-zip) format cannot be mapped
            raise
    return load_torch_file(path)


def peek_checkpoint(path: PathLike, trust: Optional[bool] = None) -> dict:
    """The checkpoint's dict with its tensors memory-mapped, not read: cheap even
    for a checkpoint of several GB.  Raises :class:`CheckpointError` when the
    file is missing, empty, truncated or not a fairseq checkpoint, and
    :class:`UntrustedCheckpointError` (``trust``: see :func:`load_torch_file`)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "checkpoint not found")
    if path.stat().st_size == 0:
        raise CheckpointError(path, "checkpoint file is empty (0 bytes; an interrupted write?)")
    try:
        with trusting(trust):
            state = _load_mapped(path)
    except CheckpointError:
        raise
    except Exception as e:  # torch raises many kinds on a foreign or truncated file
        raise CheckpointError(path, f"not a readable fairseq checkpoint ({type(e).__name__}: {e})") from e
    check_entries(state, path)
    return state


# the token embedding under the name fairseq's RoBERTa upgrade renames (old checkpoints, fairseq's hub)
EMBED_KEYS = (EMBED_KEY, "decoder.sentence_encoder.embed_tokens.weight")
# config sections a model and its task are rebuilt from (the others may be None)
_REQUIRED_SECTIONS = ("model", "task")


def _kind(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def check_entries(state: Any, path: PathLike) -> None:
    """The entries of a loaded checkpoint have the types fairseq and the tools read them as,
    without running anything: :class:`CheckpointError` naming ``path`` and the first entry
    that does not (instead of a traceback wherever it is first used).

    A dict with ``model`` (parameter names -> tensors), ``cfg`` (a mapping of sections, each a
    mapping or Namespace; ``model`` and ``task`` never None) or, from fairseq's argparse era,
    ``args`` (a Namespace); ``optimizer_history`` a non-empty list of mappings, ``extra_state``
    and ``task_state`` mappings, when present.  What loading the model needs besides:
    :func:`check_encoder_entries`."""
    from collections.abc import Mapping

    sections = (Mapping, argparse.Namespace)
    if not isinstance(state, dict):
        raise CheckpointError(path, f"not a fairseq checkpoint (it holds {_kind(state)}, not a dict of entries)")
    if "model" not in state or not ("cfg" in state or "args" in state):
        raise CheckpointError(path, "not a fairseq checkpoint (no 'model' and 'cfg' entries)")
    model = state["model"]
    if not isinstance(model, Mapping):
        raise CheckpointError(path, f"its 'model' entry is {_kind(model)}, not a mapping of parameter names to tensors")
    for key, value in model.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise CheckpointError(path, f"its 'model' entry maps {key!r} to {_kind(value)}, not a name to a tensor")
    cfg, args = state.get("cfg"), state.get("args")
    if args is not None and not isinstance(args, argparse.Namespace):
        raise CheckpointError(path, f"its 'args' entry is {_kind(args)}, not a Namespace")
    if cfg is None:
        if not isinstance(args, argparse.Namespace):
            raise CheckpointError(path, f"its 'cfg' entry is None and its 'args' entry {_kind(args)}, not a Namespace")
    else:
        if not isinstance(cfg, Mapping):
            raise CheckpointError(path, f"its 'cfg' entry is {_kind(cfg)}, not a mapping of config sections")
        for name, value in cfg.items():
            if str(name).startswith("_"):  # _name: the config's own name, not a section
                continue
            required = name in _REQUIRED_SECTIONS
            if not (isinstance(value, sections) or (value is None and not required)):
                raise CheckpointError(path, f"its config section 'cfg.{name}' is {_kind(value)}, not a mapping")
    history = state.get("optimizer_history", [{}])
    if not isinstance(history, list) or not history or not all(isinstance(h, Mapping) for h in history):
        raise CheckpointError(path, f"its 'optimizer_history' entry is {_kind(history)}, not a list of mappings")
    updates = history[-1].get("num_updates", 0)
    if isinstance(updates, bool) or not isinstance(updates, (int, np.integer)):
        raise CheckpointError(path, f"its update count (optimizer_history num_updates) is {updates!r}, not an integer")
    # mappings when present, and what the tools read in them
    nested = {
        "extra_state": ("train_iterator", "seed_fairseq"),
        "task_state": (),
    }
    for name, inner in nested.items():
        entry = state.get(name)
        if entry is None:
            continue
        if not isinstance(entry, Mapping):
            raise CheckpointError(path, f"its '{name}' entry is {_kind(entry)}, not a mapping")
        for key in inner:
            if not isinstance(entry.get(key), (Mapping, type(None))):
                raise CheckpointError(path, f"its '{name}.{key}' entry is {_kind(entry[key])}, not a mapping")
    sha = (state.get("task_state") or {}).get(DICTIONARY_SHA256)
    if sha is not None and not isinstance(sha, str):
        raise CheckpointError(
            path, f"its recorded dictionary identity ({DICTIONARY_SHA256}) is {_kind(sha)}, not a string"
        )


def check_encoder_entries(state: dict, path: PathLike) -> None:
    """What rebuilding and loading the model needs beyond :func:`check_entries` (a checkpoint
    whose entries have the right types): the token embedding of a RoBERTa-style encoder, and the
    config's ``model`` and ``task`` sections (or fairseq's argparse-era ``args``).
    :class:`CheckpointError` naming ``path`` otherwise.  :func:`read_checkpoint` and
    ``fairseq-train``'s restores (``fairseq_patches.restarts``) check it."""
    model = state["model"]
    embed = next((model[k] for k in EMBED_KEYS if k in model), None)
    if embed is None or embed.dim() != 2:
        found = "none" if embed is None else f"a {embed.dim()}-d tensor"
        raise CheckpointError(path, f"its 'model' entry has no token embedding ({EMBED_KEY}: {found})")
    cfg = state.get("cfg")
    if cfg is not None and state.get("args") is None:
        missing = [name for name in _REQUIRED_SECTIONS if name not in cfg]
        if missing:
            raise CheckpointError(path, f"its 'cfg' entry has no {' or '.join(repr(m) for m in missing)} section")


def read_checkpoint(path: PathLike, arg_overrides: Optional[dict] = None, trust: Optional[bool] = None) -> dict:
    """The checkpoint, read and upgraded by fairseq (after the checks of
    :func:`peek_checkpoint`), with ``arg_overrides`` applied to its config;
    ``trust``: see :func:`load_torch_file`.

    The dictionary identity is resolved BEFORE the overrides (a ``data``
    override must not change what the checkpoint says it was trained with).
    """
    from fairseq import checkpoint_utils

    with trusting(trust):
        peeked = peek_checkpoint(path)
        check_encoder_entries(peeked, path)
        sha, source = recorded_dictionary(peeked)
        try:
            state = checkpoint_utils.load_checkpoint_to_cpu(str(path), arg_overrides=arg_overrides)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(path, f"not a readable fairseq checkpoint ({type(e).__name__}: {e})") from e
    task_state = dict(state.get("task_state") or {})
    if sha and not task_state.get(DICTIONARY_SHA256):
        # upgrade of a checkpoint written before the identity was recorded
        task_state.update({DICTIONARY_SHA256: sha, DICTIONARY_SHA256 + "_source": source})
    state["task_state"] = task_state
    return state


def num_updates(state: dict) -> int:
    history = state.get("optimizer_history") or [{}]
    return int(history[-1].get("num_updates", 0) or 0)


def model_config(state: dict) -> dict:
    cfg = state.get("cfg")
    if cfg is None and state.get("args") is not None:
        return plain_config(state["args"])
    return plain_config((cfg or {}).get("model") or {})


def task_config(state: dict) -> dict:
    cfg = state.get("cfg")
    if cfg is None and state.get("args") is not None:
        return plain_config(state["args"])
    return plain_config((cfg or {}).get("task") or {})


def recorded_data_dir(state: dict) -> Optional[Path]:
    """The (first) data folder the checkpoint was trained on, as its config names it."""
    data = task_config(state).get("data")
    if not data:
        return None
    return Path(str(data).split(os.pathsep)[0])


def recorded_dictionary(state: dict) -> Tuple[Optional[str], str]:
    """(sha256 of the checkpoint's dictionary, where it comes from).

    Checkpoints record it in their task state; checkpoints written before that
    (seed_fairseq 0.1) are identified by the ``dict.txt`` of the data folder
    their config names, when it still exists.
    """
    task_state = state.get("task_state") or {}
    sha = task_state.get(DICTIONARY_SHA256)
    if sha:
        return sha, task_state.get(DICTIONARY_SHA256 + "_source", "recorded in the checkpoint")
    data = recorded_data_dir(state)
    if data is not None and (data / "dict.txt").is_file():
        return dictionary_sha256(data / "dict.txt"), f"from {data / 'dict.txt'}, named by its config"
    return None, "not recorded"
