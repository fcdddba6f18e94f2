"""Split stage: whole documents -> train (round-robin over shards) / valid / test.

Which documents go to valid and test is ``random.Random(seed).sample(range(N),
valid+test)``: deterministic for a seed, spread over the whole corpus rather
than its first pages, and it needs only O(valid+test) memory. Train document j
(in corpus order) goes to shard j % shards.

How many documents are held out: what --valid-docs/--test-docs say, or, when
they are not given, ``choose_held_out``'s share of the corpus.
"""

import random
from typing import Any, Dict, Optional, Tuple

from tqdm import tqdm

# Held out when --valid-docs/--test-docs are not given: this share of the
# documents each, at most AUTO_MAX (the fixed default before, which a full
# Wikipedia dump still gets), at least one each while every shard keeps a train
# document. A fixed 1000 would leave nothing to train on in a small corpus.
AUTO_FRACTION_PERCENT = 5
AUTO_MAX = 1000


def choose_held_out(num_docs: int, valid_docs: Optional[int], test_docs: Optional[int], shards: int) -> Tuple[int, int]:
    """(valid, test) document counts; ``None`` = not given, choose one.

    Given values are used as they are (the caller checks that they leave a
    train document per shard). Chosen ones shrink, test first, down to 0 when
    the corpus is too small to hold out anything and still train every shard.
    """
    auto = max(1, min(AUTO_MAX, num_docs * AUTO_FRACTION_PERCENT // 100))
    spare = num_docs - shards  # documents that can be held out at most
    if valid_docs is None and test_docs is None:
        valid = min(auto, max(0, spare))
        test = min(auto, max(0, spare - valid))
    elif valid_docs is None:
        test = test_docs
        valid = min(auto, max(0, spare - test))
    elif test_docs is None:
        valid = valid_docs
        test = min(auto, max(0, spare - valid))
    else:
        valid, test = valid_docs, test_docs
    return valid, test


def _documents(path):
    """Yield each document as a list of lines (with their '\\n')."""
    doc = []
    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            if line == "\n":
                if doc:
                    yield doc
                doc = []
            else:
                doc.append(line)
    if doc:
        yield doc


class _SplitWriter:
    def __init__(self, path):
        self.path = path
        self.f = open(path, "w", encoding="utf-8", newline="\n")
        self.documents = self.lines = self.bytes = 0

    def write(self, doc):
        if self.documents:
            self.f.write("\n")
            self.bytes += 1
        self.f.writelines(doc)
        self.documents += 1
        self.lines += len(doc)
        self.bytes += sum(len(line.encode("utf-8")) for line in doc)

    def close(self):
        self.f.close()
        return {"documents": self.documents, "lines": self.lines, "bytes": self.bytes}


def split(
    corpus_path, num_docs: int, valid_docs: int, test_docs: int, shards: int, seed: int, paths: Dict[str, Any]
) -> Dict[str, Dict[str, int]]:
    """``paths`` maps split name ("valid", "test", "train0".."trainK") to its output file."""
    held_out = random.Random(seed).sample(range(num_docs), valid_docs + test_docs)
    valid = set(held_out[:valid_docs])
    test = set(held_out[valid_docs:])
    writers = {name: _SplitWriter(path) for name, path in paths.items()}
    train_index = 0
    try:
        for i, doc in enumerate(
            tqdm(_documents(corpus_path), total=num_docs, desc="split", unit=" docs", disable=None)
        ):
            if i in valid:
                writers["valid"].write(doc)
            elif i in test:
                writers["test"].write(doc)
            else:
                writers[f"train{train_index % shards}"].write(doc)
                train_index += 1
    finally:
        counts = {name: w.close() for name, w in writers.items()}
    return counts
