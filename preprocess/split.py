"""Split stage: whole documents -> train (round-robin over shards) / valid / test.

Which documents go to valid and test is ``random.Random(seed).sample(range(N),
valid+test)``: deterministic for a seed, spread over the whole corpus rather
than its first pages, and it needs only O(valid+test) memory. Train document j
(in corpus order) goes to shard j % shards.
"""
import random

from tqdm import tqdm


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


def split(corpus_path, num_docs, valid_docs, test_docs, shards, seed, paths):
    """``paths`` maps split name ("valid", "test", "train0".."trainK") to its output file."""
    held_out = random.Random(seed).sample(range(num_docs), valid_docs + test_docs)
    valid = set(held_out[:valid_docs])
    test = set(held_out[valid_docs:])
    writers = {name: _SplitWriter(path) for name, path in paths.items()}
    train_index = 0
    try:
        for i, doc in enumerate(tqdm(_documents(corpus_path), total=num_docs, desc="split",
                                     unit=" docs", disable=None)):
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
