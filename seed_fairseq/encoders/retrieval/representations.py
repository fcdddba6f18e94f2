"""Retrieval representations: what a model folder turns a text into, and how it is searched.

Two are built in (``search.py`` registers them; both search with ``search.DenseRetriever``):
``own``, the default of a folder that declares no other, is the model as its folder says
(its sentence-transformers modules as written: its pooling, its ``Normalize``) compared by
its similarity (``hf/sentence.declared_similarity``; cosine: unit vectors, so the
inner-product index ranks by cosine); ``cls``, chosen explicitly, is the papers' [CLS]
vector compared by dot product, whatever the folder's pooling.  Another representation registers itself with
:func:`register` when its module is imported (DupMAE's: ``seed_fairseq/encoders/dupmae/retriever.py``)
and is found without this package importing it: a name this registry does not know, or a
question about a folder or a loaded model, first loads the ``seed_fairseq.representations``
entry points (``setup.py``; each names an object :func:`register` takes).
"""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Optional, Protocol

from ...base.extensions import Extensions

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

ENTRY_POINTS = "seed_fairseq.representations"
BUILT_IN = "own"


class Retriever(Protocol):
    """A corpus encoded and indexed by one model (``search.DenseRetriever``'s interface)."""

    def retrieve(self, queries: Dict[str, str], k: int = 1000) -> Dict[str, Dict[str, float]]: ...


@dataclass(frozen=True)
class Representation:
    """One representation; ``load`` and ``save`` work on sentence-transformers models.

    * ``declared_by(folder)``: does a model folder declare it (the default of ``--representation``)
    * ``load(st_model, folder, sparse_top_k)``: the folder's model (as sentence-transformers loads
      it: its own modules) in this representation; :class:`~seed_fairseq.base.retrieval_data.DataFormatError`
      naming the file
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


_EXTENSIONS: Extensions[Representation] = Extensions(ENTRY_POINTS, Representation, BUILT_IN)
register = _EXTENSIONS.register
names = _EXTENSIONS.names


def get(name: str) -> Representation:
    """The representation called ``name``; ValueError naming the choices otherwise."""
    found = _EXTENSIONS.find(name)
    if found is None:
        raise ValueError(f"representation must be one of {names()}, got {name!r}")
    return found


def _others():
    return _EXTENSIONS.others()


def of_folder(folder: Path) -> Representation:
    """What a model folder declares (``own`` unless another representation's files are there)."""
    return next((r for r in _others() if r.declared_by(Path(folder))), get(BUILT_IN))


def of_model(model: "SentenceTransformer") -> Representation:
    """The representation a loaded model is in (``own`` unless another one owns it)."""
    return next((r for r in _others() if r.owns(model)), get(BUILT_IN))
