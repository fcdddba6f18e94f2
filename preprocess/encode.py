"""Normalised text -> space-separated sentencepiece pieces, in parallel, order kept.

Blank lines (document boundaries) stay blank: fairseq's binarizer turns them
into a one-token sequence [</s>], which is exactly what TokenBlockDataset's
``complete_doc`` mode takes as a document separator (document_sep_len=1).
"""
import itertools

from .parallel import ordered_imap
from .vocab import load_spm

_SP = None


def _init_worker(model_path):
    global _SP
    _SP = load_spm(model_path)


def encode_lines(lines):
    """Pieces for each line; '' stays ''. Runs in a worker (uses the worker's model)."""
    out = []
    for line in lines:
        out.append(" ".join(_SP.encode(line, out_type=str)) if line else "")
    return out


def _chunks(path, chunk_lines):
    with open(path, encoding="utf-8", newline="\n") as f:
        while True:
            chunk = [line.rstrip("\n") for line in itertools.islice(f, chunk_lines)]
            if not chunk:
                return
            yield chunk


def encode_file(src, dst, model_path, workers, chunk_lines=2000, progress=None):
    """Encode ``src`` into ``dst`` (the caller renames it into place). Returns line count."""
    n = 0
    with open(dst, "w", encoding="utf-8", newline="\n") as out:
        for encoded in ordered_imap(
            encode_lines, _chunks(src, chunk_lines), workers,
            initializer=_init_worker, initargs=(str(model_path),),
        ):
            out.writelines(line + "\n" for line in encoded)
            n += len(encoded)
            if progress is not None:
                progress.update(len(encoded))
    return n
