"""Retrieval representations: what a model folder turns a text into, and how it is searched.

``cls`` (the [CLS] vector, dot product, ``search.DenseRetriever``) is built in:
``search.py`` registers it.  Another representation registers itself with
:func:`register` when its module is imported (DupMAE's: ``seed_fairseq/dupmae/retriever.py``)
and is found without this package importing it: a name this registry does not know, or a
question about a folder or a loaded model, first loads the ``seed_fairseq.representations``
entry points (``setup.py``; each names an object :func:`register` takes).
"""

from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Optional, Protocol, Tuple

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

ENTRY_POINTS = "seed_fairseq.representations"
BUILT_IN = "cls"


class Retriever(Protocol):
    """A corpus encoded and indexed by one model (``search.DenseRetriever``'s interface)."""

    def retrieve(self, queries: Dict[str, str], k: int = 1000) -> Dict[str, Dict[str, float]]: ...


@dataclass(frozen=True)
class Representation:
    """One representation; ``load`` and ``save`` work on sentence-transformers models.

    * ``declared_by(folder)``: does a model folder declare it (the default of ``--representation``)
    * ``load(cls_model, folder, sparse_top_k)``: the folder's model (loaded with [CLS] pooling)
      in this representation; :class:`~seed_fairseq.retrieval.data.DataFormatError` naming the file
    * ``owns(model)``: is a loaded model one of this representation
    * ``retriever(model, corpus, **kwargs)``: corpus encoded and indexed, with ``retrieve(queries, k)``
    * ``save(model, folder)``: a loaded model written back as a folder of this representation
    * ``mark_finetuned(model, tool)``: note in the model's own files that ``tool`` fine-tuned it
    """

    name: str
    declared_by: Callable[[Path], bool]
    load: Callable[["SentenceTransformer", Path, Optional[int]], "SentenceTransformer"]
    owns: Callable[["SentenceTransformer"], bool]
    retriever: Callable[..., Retriever]
    save: Callable[["SentenceTransformer", Path], None]
    mark_finetuned: Callable[["SentenceTransformer", str], None] = lambda model, tool: None


_REGISTRY: Dict[str, Representation] = {}
_discovered = False


def register(representation: Representation) -> Representation:
    """Add ``representation`` (again: replaced); returns it."""
    _REGISTRY[representation.name] = representation
    return representation


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    for ep in sorted(entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        found = ep.load()
        if isinstance(found, Representation):
            register(found)


def names() -> Tuple[str, ...]:
    """Every representation's name, ``cls`` first (the ``--representation`` choices)."""
    _discover()
    return (BUILT_IN, *sorted(n for n in _REGISTRY if n != BUILT_IN))


def get(name: str) -> Representation:
    """The representation called ``name``; ValueError naming the choices otherwise."""
    if name not in _REGISTRY:
        _discover()
    if name not in _REGISTRY:
        raise ValueError(f"representation must be one of {names()}, got {name!r}")
    return _REGISTRY[name]


def _others():
    _discover()
    return [r for n, r in sorted(_REGISTRY.items()) if n != BUILT_IN]


def of_folder(folder: Path) -> Representation:
    """What a model folder declares (``cls`` unless another representation's files are there)."""
    return next((r for r in _others() if r.declared_by(Path(folder))), get(BUILT_IN))


def of_model(model: "SentenceTransformer") -> Representation:
    """The representation a loaded model is in (``cls`` unless another one owns it)."""
    return next((r for r in _others() if r.owns(model)), get(BUILT_IN))
