"""The model's representation: how one vector per text is made and compared (no torch, no fairseq).

One definition for every layer: the task options that pre-train and validate the vector
(``pretrain/tasks/config.py``), the bottleneck that pools it (``pretrain/models/bottleneck.py``),
what a checkpoint records and a continued run checks (``pretrain/checkpoint_records.py``,
``pretrain/tasks/representation.py``), the import that reads it from a sentence-transformers folder
and the export that writes it back (``encoders/hf/sentence.py``), and the retrieval tools.

    pooling      cls (the papers'), mean, max, mean_sqrt_len, lasttoken: sentence-transformers'
                 ``Pooling`` modes under the plugin's names (:data:`ST_POOLING` maps them)
    similarity   dot (the papers') or cosine
    max_length   the longest text, in tokens, the model's users encode (sentence-transformers'
                 ``max_seq_length``); 0: the model's positions
    raw_vectors  with cosine: the model's vectors are not unit vectors (no ``Normalize`` module)
"""

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping

# the plugin's pooling modes -> sentence-transformers' names (``Pooling(pooling_mode=...)``)
ST_POOLING = {"cls": "cls", "mean": "mean", "max": "max", "mean_sqrt_len": "mean_sqrt_len_tokens",
              "lasttoken": "lasttoken"}  # fmt: skip
POOLING_MODES = tuple(ST_POOLING)
SIMILARITIES = ("dot", "cosine")
DEFAULT_POOLING, DEFAULT_SIMILARITY = "cls", "dot"  # the papers' [CLS] vector and dot product

# the task options that hold a representation (fairseq-train's --bottleneck-pooling, ...), in the
# order of :class:`Representation`'s fields
OPTIONS = ("bottleneck_pooling", "retrieval_similarity", "retrieval_max_length", "retrieval_raw_vectors")


@dataclass(frozen=True)
class Representation:
    """One vector per text: the encoder's last-layer vectors pooled (``pooling``, the plugin's
    name), compared by ``similarity``; with ``cosine`` the model's vectors are L2-normalised (its
    ``Normalize`` module: then the inner product is the cosine, what a faiss inner-product index
    ranks by) unless ``raw_vectors`` (no ``Normalize`` module: the cosine compares them as they are)."""

    pooling: str = DEFAULT_POOLING
    similarity: str = DEFAULT_SIMILARITY
    # the longest text in tokens (sentence-transformers' max_seq_length: all-MiniLM-L6-v2 cuts at 256 of
    # its 512 positions); 0: the model's positions
    max_length: int = 0
    raw_vectors: bool = False  # with cosine: no Normalize module (--retrieval-raw-vectors)

    @property
    def normalize(self) -> bool:
        """Does the model's last module L2-normalise its vectors (a ``Normalize`` module)?"""
        return self.similarity == "cosine" and not self.raw_vectors

    def seq_length(self, positions: int) -> int:
        """The tokens a text keeps: :attr:`max_length`, at most the model's ``positions``."""
        return min(self.max_length, positions) if self.max_length > 0 else positions

    def within(self, positions: int) -> "Representation":
        """This representation on a model of ``positions`` positions: a cut at or beyond them is no cut
        of its own (``max_length`` 0, the positions), as the task options and the export record it."""
        return replace(self, max_length=0) if self.max_length >= positions else self

    @property
    def st_pooling(self) -> str:
        """sentence-transformers' name of the pooling (``Pooling(pooling_mode=...)``)."""
        return ST_POOLING[self.pooling]

    def task_args(self) -> List[str]:
        """The fairseq-train options that make every objective pre-train and validate this vector."""
        length = ["--retrieval-max-length", str(self.max_length)] if self.max_length > 0 else []
        raw = ["--retrieval-raw-vectors"] if self.raw_vectors else []
        return ["--bottleneck-pooling", self.pooling, "--retrieval-similarity", self.similarity, *length, *raw]

    def options(self) -> Dict[str, Any]:
        """The task options' values (:data:`OPTIONS`)."""
        return dict(zip(OPTIONS, (self.pooling, self.similarity, self.max_length, self.raw_vectors)))

    def record(self) -> Dict[str, Any]:
        """What the import's and the export's records say of it."""
        length = {"max_seq_length": self.max_length} if self.max_length > 0 else {}
        return {"pooling": self.pooling, "normalize": self.normalize, "similarity": self.similarity, **length}

    def describe(self) -> str:
        """``mean pooling, normalised, cosine`` / ``[CLS] vector, dot product`` / ``max pooling, cosine``."""
        what = "[CLS] vector" if self.pooling == "cls" else f"{self.st_pooling} pooling"
        how = "normalised, cosine" if self.normalize else "cosine" if self.similarity == "cosine" else "dot product"
        return f"{what}, {how}"


PAPERS = Representation()  # the papers' [CLS] vector and dot product: a model built from scratch


def from_options(pooling: str, similarity: str, max_length: int = 0, raw_vectors: bool = False) -> Representation:
    """The representation of the task options ``--bottleneck-pooling`` / ``--retrieval-similarity`` /
    ``--retrieval-max-length`` / ``--retrieval-raw-vectors``; ValueError for a value the tools cannot
    write back."""
    if pooling not in ST_POOLING:
        raise ValueError(f"bottleneck_pooling {pooling!r} is not one of {', '.join(ST_POOLING)}")
    if similarity not in SIMILARITIES:
        raise ValueError(f"retrieval_similarity {similarity!r} is not one of {', '.join(SIMILARITIES)}")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 0:
        raise ValueError(f"retrieval_max_length {max_length!r} is not a whole number >= 0")
    return Representation(pooling, similarity, max_length, bool(raw_vectors) and similarity == "cosine")


def option_values(options: Any) -> Dict[str, Any]:
    """The representation options a task config holds (the run's ``cfg``, a checkpoint's task config: a
    mapping, an OmegaConf config or a Namespace), their defaults for those it lacks (a config written
    before they existed, another task's: the papers' [CLS], dot product, the model's positions)."""
    defaults = PAPERS.options()

    def get(name: str) -> Any:
        value = options.get(name) if isinstance(options, Mapping) else getattr(options, name, None)
        return defaults[name] if value is None else value

    return {name: get(name) for name in OPTIONS}


def of_options(options: Any) -> Representation:
    """:func:`from_options` of a task config's values (:func:`option_values`)."""
    v = option_values(options)
    return from_options(
        str(v["bottleneck_pooling"]),
        str(v["retrieval_similarity"]),
        v["retrieval_max_length"],  # checked, not converted: a checkpoint recording "12" is refused
        bool(v["retrieval_raw_vectors"]),
    )
