"""What an export writes for a retrieval representation, beside the encoder folder.

Two are built in, and write nothing beyond the sentence-transformers folder: ``own``, whose
modules are the model's own representation as the checkpoint records it (its pooling,
``Normalize`` when it compares by cosine, and that similarity: the task options
``--bottleneck-pooling`` / ``--retrieval-similarity``, ``sentence.py``), and ``cls``, the
papers' [CLS] vector and dot product whatever the checkpoint records.
Another representation's exporter registers itself with :func:`register` when its
module is imported (DupMAE's: ``seed_fairseq/encoders/dupmae/export.py``) and is found
without this package importing it, through the ``seed_fairseq.exporters`` entry
points (``setup.py``; each names an :class:`Exporter` instance).

``export.export`` asks the chosen exporter, in this order: :meth:`Exporter.refuse`
(before anything is read), :meth:`Exporter.check` (its options, once the
checkpoint is read), :meth:`Exporter.build` (once the encoder is verified; a
:class:`Built` or None), then, in the staging folder, ``Built.save``, ``Built.card``
and ``Built.verify`` (the written files, reloaded).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence

from ...base.extensions import Extensions
from ...base.representation import PAPERS, Representation

ENTRY_POINTS = "seed_fairseq.exporters"


class ExportError(ValueError):
    pass


@dataclass
class ExportJob:
    """What the export has at hand once the encoder is verified equal to fairseq."""

    checkpoint: Path
    data: Path
    state: dict
    model_cfg: dict
    dictionary: Any  # fairseq Dictionary
    fs_model: Any
    hf_model: Any
    tokenizer: Any
    texts: List[str]
    max_len: int
    atol: float
    activation: str  # the HF name of the encoder's activation
    # every fact of the encoder as the checkpoint records it (checkpoint_records.EncoderArchitecture):
    # what a representation's own modules must compute with (LayerNorm eps 1e-12 after BERT)
    architecture: Any
    # the fairseq id of each tokenizer id (None: the same ids); an import of BERT reorders them
    # (vocabulary/tokenizer.py), and the exported folder speaks the tokenizer's ids
    hf_to_fairseq: Optional[Sequence[int]]


class Built(Protocol):
    def save(self, folder: Path) -> None: ...

    def card(self) -> str: ...

    def verify(self, folder: Path) -> None: ...


class Exporter:
    """The built-in ``own`` exporter (nothing beside the encoder folder, whose sentence-transformers
    modules are the checkpoint's representation); subclasses add files."""

    name = "own"
    label = "model's own"  # in messages: "exports the model's own representation"
    options: Mapping[str, str] = {}  # export() keyword -> its command-line flag

    def sentence_representation(self, recorded: Representation) -> Representation:
        """The representation the folder's sentence-transformers modules compute, given the one the
        checkpoint records (``recorded``)."""
        return recorded

    def refuse(self, with_lm_head: bool) -> Optional[str]:
        """Why this representation cannot be exported with these settings (None: it can)."""
        return None

    def is_default(self, cfg: dict) -> bool:
        """Is this the representation of a checkpoint trained with ``cfg`` (exported without the MLM head)?"""
        return False

    def check(self, checkpoint: Path, state: dict, model_cfg: dict, dictionary, options: Dict[str, Any]) -> dict:
        """The options with their defaults; ValueError naming the option or the checkpoint file."""
        return {}

    def build(self, job: ExportJob, options: dict) -> Optional[Built]:
        """The representation's files to write, checked against fairseq; ValueError if they cannot be built."""
        return None


class ClsExporter(Exporter):
    """``cls``: the papers' [CLS] vector and dot product, whatever the checkpoint records."""

    name = "cls"
    label = "[CLS]"

    def sentence_representation(self, recorded: Representation) -> Representation:
        return PAPERS


OWN = Exporter()
CLS = ClsExporter()
_EXTENSIONS: Extensions[Exporter] = Extensions(ENTRY_POINTS, Exporter, OWN.name)
register = _EXTENSIONS.register
names = _EXTENSIONS.names
register(OWN)
register(CLS)


def get(name: str) -> Exporter:
    """The exporter called ``name``; :class:`ExportError` naming the choices otherwise."""
    found = _EXTENSIONS.find(name)
    if found is None:
        choices = names()
        listed = f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else choices[0]
        raise ExportError(f"--representation must be {listed}, got {name!r}")
    return found


def default_for(cfg: dict) -> Exporter:
    """The representation a checkpoint trained with ``cfg`` declares (``own`` unless another claims it)."""
    return next((e for e in _EXTENSIONS.others() if e.is_default(cfg)), OWN)


def owner_of(option: str) -> Optional[Exporter]:
    """The exporter an ``export()`` keyword belongs to."""
    return next((e for e in (OWN, *_EXTENSIONS.others()) if option in e.options), None)
