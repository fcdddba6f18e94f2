"""Reading, checking and writing fairseq checkpoints safely.

Shared by ``fairseq-train`` (through ``compat``), ``seed-drop-decoder`` and the
HuggingFace export:

* :func:`read_checkpoint` -- one clear error for a file that is missing, not a
  checkpoint, or truncated;
* :func:`peek_checkpoint` -- the metadata of a checkpoint (config, task state,
  tensor shapes) without reading its tensors (memory-mapped);
* :func:`check_dictionary` -- the checkpoint's token embedding and recorded
  dictionary identity against a data folder's ``dict.txt``;
* :func:`newest_readable_checkpoint` -- what a restart falls back to when
  ``checkpoint_last.pt`` is missing or damaged;
* :func:`save_atomic` -- ``torch.save`` to a temporary name, fsync, rename.
"""

import argparse
import copy
import logging
import os
import re
from pathlib import Path
from typing import Any, List, Optional, Tuple, Union

import torch
from omegaconf import DictConfig, OmegaConf

from .dictionary import dictionary_sha256
from .fileio import atomic_path

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


def _torch_load(path: PathLike, mmap: bool) -> dict:
    # Only files the user pointed a checkpoint tool at, or that fairseq-train
    # wrote itself, are read here: trusted like fairseq's own loader.
    if mmap:
        try:
            return torch.load(str(path), map_location="cpu", weights_only=False, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):  # legacy (non-zip) format cannot be mapped
                raise
    return torch.load(str(path), map_location="cpu", weights_only=False)


def peek_checkpoint(path: PathLike) -> dict:
    """The checkpoint's dict with its tensors memory-mapped, not read: cheap even
    for a checkpoint of several GB.  Raises :class:`CheckpointError` when the
    file is missing, empty, truncated or not a fairseq checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(path, "checkpoint not found")
    if path.stat().st_size == 0:
        raise CheckpointError(path, "checkpoint file is empty (0 bytes; an interrupted write?)")
    try:
        state = _torch_load(path, mmap=True)
    except Exception as e:  # torch raises many kinds on a foreign or truncated file
        raise CheckpointError(path, f"not a readable fairseq checkpoint ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict) or "model" not in state or not ("cfg" in state or "args" in state):
        raise CheckpointError(path, "not a fairseq checkpoint (no 'model' and 'cfg' entries)")
    return state


def read_checkpoint(path: PathLike, arg_overrides: Optional[dict] = None) -> dict:
    """The checkpoint, read and upgraded by fairseq (after the checks of
    :func:`peek_checkpoint`), with ``arg_overrides`` applied to its config.

    The dictionary identity is resolved BEFORE the overrides (a ``data``
    override must not change what the checkpoint says it was trained with).
    """
    from fairseq import checkpoint_utils

    sha, source = recorded_dictionary(peek_checkpoint(path))
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(str(path), arg_overrides=arg_overrides)
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


def embedding_rows(state: dict) -> Optional[int]:
    weight = (state.get("model") or {}).get(EMBED_KEY)
    return None if weight is None else int(weight.shape[0])


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
    rows = embedding_rows(state)
    if rows is not None and rows != dictionary_size:
        raise CheckpointError(
            path,
            f"dictionary size mismatch: the checkpoint's token embedding has {rows} rows but "
            f"{dict_path} gives {dictionary_size} symbols (including specials and <mask>); "
            "use the data folder (dict.txt) the checkpoint was trained with",
        )
    recorded, source = recorded_dictionary(state)
    current = dictionary_sha256(dict_path)
    if recorded is None:
        logger.warning(
            f"{path}: the checkpoint does not record its dictionary ({source}); "
            f"cannot check that {dict_path} is the one it was trained with"
        )
        return
    if recorded != current:
        problem = (
            f"trained with a different dictionary than {dict_path} (same size, other symbols: "
            f"sha256 {recorded[:12]}... {source}, {current[:12]}... in the data); the token ids "
            "would not match the embeddings"
        )
        if not allow_change:
            raise CheckpointError(
                path,
                problem + f"; use the data folder it was trained on, or pass "
                f"{option} to change the vocabulary on purpose",
            )
        logger.warning(f"{path}: {problem}; continuing because of {option}")


# ---------------------------------------------------------------------------
# restarts
# ---------------------------------------------------------------------------


def checkpoint_candidates(save_dir: PathLike, suffix: str = "") -> List[Path]:
    """Every checkpoint fairseq-train may have written in ``save_dir`` with ``suffix``."""
    save_dir = Path(save_dir)
    if not save_dir.is_dir():
        return []
    pattern = re.compile(r"checkpoint(_last|_best|\d+|_\d+_\d+|\.best_.*)" + re.escape(suffix) + r"\.pt")
    return sorted(p for p in save_dir.iterdir() if pattern.fullmatch(p.name) and p.is_file())


def newest_readable_checkpoint(
    save_dir: PathLike, suffix: str = "", prefer: Optional[PathLike] = None
) -> Tuple[Optional[Path], List[str]]:
    """The readable checkpoint of ``save_dir`` with the most updates (``prefer``
    wins ties) and a list of the unreadable ones with their problems."""
    best, best_key, bad = None, None, []
    for p in checkpoint_candidates(save_dir, suffix):
        try:
            state = peek_checkpoint(p)
        except CheckpointError as e:
            bad.append(str(e))
            continue
        key = (num_updates(state), prefer is not None and p == Path(prefer), p.stat().st_mtime_ns)
        if best_key is None or key > best_key:
            best, best_key = p, key
    return best, bad


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------


def save_atomic(obj: Any, path: PathLike) -> Path:
    """``torch.save`` that leaves either the old file or the complete new one."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
    return Path(path)
