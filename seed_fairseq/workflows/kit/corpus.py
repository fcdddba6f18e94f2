"""The user's corpus: its documents, and the retrieval set derived from some of them (the
retrieval stage's, and what the up-front checks derive into a folder they throw away)."""

import random
from pathlib import Path
from typing import List

from ...base.derived_set import derive_retrieval_set
from ...base.fileio import OutputError


def corpus_documents(path: Path) -> List[List[str]]:
    """Documents (lists of paragraphs) of a text in the project's format."""
    text = path.read_text(encoding="utf-8")
    return [[p.strip() for p in d.splitlines() if p.strip()] for d in text.split("\n\n") if d.strip()]


def read_corpus(corpus: Path) -> List[List[str]]:
    """Its documents: the held-out set and the derived retrieval set are planned from them."""
    try:
        return corpus_documents(corpus)
    except UnicodeDecodeError as e:
        raise OutputError(corpus, f"--corpus: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise OutputError(corpus, f"--corpus: cannot be read ({e.strerror})") from None


def sample_documents(docs: List[List[str]], limit: int, seed: int) -> List[List[str]]:
    """At most ``limit`` documents (0: all), a seeded choice kept in corpus order."""
    if not limit or limit >= len(docs):
        return docs
    keep = set(random.Random(seed).sample(range(len(docs)), limit))
    return [d for i, d in enumerate(docs) if i in keep]


def write_retrieval_set(docs: List[List[str]], limit: int, folder: Path):
    """The retrieval set derived from ``limit`` of the corpus ``docs`` (0: all) in ``folder``; its
    ``DerivedSetStats``."""
    source = folder / "source.txt"
    chosen = sample_documents(docs, limit, seed=1)
    source.write_text("\n\n".join("\n".join(d) for d in chosen) + "\n", encoding="utf-8")
    return derive_retrieval_set(source, folder, seed=1)
