"""What the workflows check before their first stage, with ``--out`` untouched: a model folder's
positions and files, ``--gpu``, and flags whose value is a list of another program's options.

Each check refuses with one ``error:`` line (a ValueError whose text is ``FILE: problem``) what
would otherwise fail only after the data, the generator and pre-training had run.  The held-out
set is planned in heldout.py.
"""

from pathlib import Path
from typing import List, Optional, Sequence

from ...encoders.hf.folder import read_config
from ...encoders.hf.import_keymap import FAMILIES, position_offset


def init_positions(init: Path) -> Optional[int]:
    """Tokens the position embeddings of the HuggingFace model folder ``init`` take (RoBERTa-style
    models lose pad + 1 rows); None when its config does not say (the import stage then refuses it)."""
    cfg = read_config(init)  # HFFolderError: not JSON, not an object
    family = FAMILIES.get(cfg.get("model_type"))
    rows = cfg.get("max_position_embeddings")
    if family is None or not isinstance(rows, int):
        return None
    pad = cfg.get("pad_token_id")
    return rows - position_offset(family, pad if isinstance(pad, int) else 1)


def check_gpu(gpu: bool) -> None:
    """--gpu on a machine where torch sees no CUDA device: refused now, not after the data and the
    pre-training ran (fairseq-train would then fail, or the evaluation would)."""
    if gpu:
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--gpu: torch sees no CUDA device on this machine; run without --gpu (on the CPU)")


def check_model_folder(folder: Path, flag: str) -> None:
    """A HuggingFace folder a stage will import: weights, tokenizer and vocabulary checked from
    their headers (``hf.import_.check_source``), before --out is created."""
    from ...encoders.hf.import_ import HFImportError, check_source

    try:
        check_source(folder)
    except HFImportError as e:
        raise ValueError(f"{e} ({flag})") from None


def glue_option_values(argv: Sequence[str], flags: Sequence[str]) -> List[str]:
    """``argv`` with ``FLAG VALUE`` written ``FLAG=VALUE`` for the ``flags`` whose value is a list of
    options of another program (``--fairseq-args "--fp16"``): argparse would read the value as an
    option of its own and refuse it."""
    out: List[str] = []
    it = iter(argv)
    for a in it:
        if a in flags:
            value = next(it, None)
            out.append(a if value is None else f"{a}={value}")
        else:
            out.append(a)
    return out
