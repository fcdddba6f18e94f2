"""Normalised text -> space-separated sentencepiece pieces, in parallel, order kept.

Blank lines (document boundaries) stay blank: fairseq's binarizer turns them
into a one-token sequence [</s>], which is exactly what TokenBlockDataset's
``complete_doc`` mode takes as a document separator (document_sep_len=1).

A line of more than ``max_pieces`` pieces (a run-on "sentence", a table-like
line) is cut into consecutive chunks of at most ``max_pieces`` pieces, each
written as a line of its own: with ``--sample-break-mode complete`` a line is
never split across blocks, so a longer line would make a block longer than
``--tokens-per-sample`` (dropped in training, an error in validation). The
chunks are the line's pieces in order, nothing is added or lost: their pieces
concatenated are the line's pieces (see ``cut_pieces``).
"""

import itertools
from typing import Callable, Dict, List, Sequence, Tuple

from .parallel import line_ranges, ordered_imap, read_range, split_lines
from .vocab import load_spm

CHUNK_BYTES = 1 << 20

WORD_START = "\u2581"  # sentencepiece's "▁": the piece starts a new word
# Byte-fallback pieces <0x80>..<0xBF> continue a multi-byte UTF-8 character.
_CONTINUATION_BYTES = frozenset(f"<0x{b:02X}>" for b in range(0x80, 0xC0))

_SP = None
_MAX_PIECES = 0


def _init_worker(model_path, max_pieces=0):
    global _SP, _MAX_PIECES
    _SP = load_spm(model_path)
    _MAX_PIECES = max_pieces


def starts_spm_word(piece: str) -> bool:
    return piece.startswith(WORD_START)


def cut_pieces(
    pieces: List[str], max_pieces: int, starts_word: Callable[[str], bool] = starts_spm_word
) -> List[List[str]]:
    """Consecutive chunks of ``pieces``, each at most ``max_pieces`` long (0 = no limit).

    A chunk ends, by preference, right before the last piece starting a word
    (``starts_word``: "▁" for sentencepiece) in the second half of the window, so words stay whole
    and every chunk but the first starts a word; failing that, before a piece
    that is not in the middle of a byte-fallback UTF-8 character; failing
    that, at exactly ``max_pieces``. ``sum(chunks, []) == pieces`` always.
    """
    if max_pieces <= 0 or len(pieces) <= max_pieces:
        return [pieces]
    chunks = []
    start = 0
    while len(pieces) - start > max_pieces:
        limit = start + max_pieces  # the chunk is pieces[start:cut], start < cut <= limit
        lowest = start + max(1, (max_pieces + 1) // 2)
        cut = None
        for j in range(limit, lowest - 1, -1):
            if starts_word(pieces[j]):
                cut = j
                break
        if cut is None:
            for j in range(limit, start, -1):
                if pieces[j] not in _CONTINUATION_BYTES:
                    cut = j
                    break
        if cut is None:
            cut = limit
        chunks.append(pieces[start:cut])
        start = cut
    chunks.append(pieces[start:])
    return chunks


def encode_lines(lines: Sequence[str]) -> Tuple[List[str], int, int]:
    """(encoded lines, input lines, lines cut) for a chunk of lines; '' stays ''.

    Runs in a worker (uses the worker's model and max_pieces); a line cut into
    k chunks gives k output lines. One batch call into sentencepiece per chunk
    (the same pieces as line by line, without a Python call per line).
    """
    texts = [line for line in lines if line]
    encoded = iter(_SP.encode(texts, out_type=str, num_threads=1)) if texts else iter(())
    out = []
    cut = 0
    for line in lines:
        if not line:
            out.append("")
            continue
        pieces = next(encoded)
        if _MAX_PIECES <= 0 or len(pieces) <= _MAX_PIECES:
            out.append(" ".join(pieces))
            continue
        chunks = cut_pieces(pieces, _MAX_PIECES)
        cut += len(chunks) > 1
        out.extend(" ".join(chunk) for chunk in chunks)
    return out, len(lines), cut


def _encode_range(task):
    """Worker: one byte range of the input -> (its encoded text, input lines, output lines, lines cut)."""
    path, start, end = task
    out, n_in, cut = encode_lines(split_lines(read_range(path, start, end).decode("utf-8")))
    text = "\n".join(out) + "\n" if out else ""
    return text, n_in, len(out), cut


def encode_file(
    src, dst, model_path, workers: int, chunk_bytes: int = CHUNK_BYTES, progress=None, max_pieces: int = 0
) -> Dict[str, int]:
    """Encode ``src`` into ``dst`` (the caller renames it into place).

    Lines are split on "\\n" only. Workers each read their own byte range of
    ``src`` (a bounded number in flight) and the main process writes their text
    in order, so ``dst`` does not depend on ``workers``.

    Returns {"input_lines", "lines" (written), "lines_cut", "chunks_added"};
    ``lines == input_lines + chunks_added``.
    """
    n_in = n_out = n_cut = 0
    tasks = ((str(src), start, end) for start, end in line_ranges(src, chunk_bytes))
    with open(dst, "w", encoding="utf-8", newline="\n") as out:
        for text, n_lines, n_written, cut in ordered_imap(
            _encode_range,
            tasks,
            workers,
            initializer=_init_worker,
            initargs=(str(model_path), max_pieces),
        ):
            out.write(text)
            n_in += n_lines
            n_out += n_written
            n_cut += cut
            if progress is not None:
                progress.update(n_lines)
    return {"input_lines": n_in, "lines": n_out, "lines_cut": n_cut, "chunks_added": n_out - n_in}


def _chunks(path, chunk_lines):
    with open(path, encoding="utf-8", newline="\n") as f:
        while True:
            chunk = [line.rstrip("\n") for line in itertools.islice(f, chunk_lines)]
            if not chunk:
                return
            yield chunk


def encode_file_hf(
    src, dst, tokenizer_dir, progress=None, max_pieces: int = 0, chunk_lines: int = 2000
) -> Dict[str, int]:
    """``encode_file`` with a HuggingFace tokenizer instead of sentencepiece: each line's
    tokens (no special tokens) written as the fairseq dictionary's symbols (the model's
    own tokens, see seed_fairseq.base.vocabulary.tokenizer), cut before word starts like spm pieces.

    The tokenizer runs in this process (its Rust core uses the cores itself).  A
    line the tokenizer reduces to nothing is dropped (counted), never written as
    an empty line, which fairseq would read as a document boundary.
    """
    from seed_fairseq.base.vocabulary.tokenizer import load_fast_tokenizer, starts_word, vocab_from_tokenizer

    tok = load_fast_tokenizer(tokenizer_dir)
    vocab = vocab_from_tokenizer(tok, tokenizer_dir)
    symbols = [vocab.symbols[f] for f in vocab.hf_to_fairseq]  # HF id -> dict.txt symbol

    def starts(symbol):
        return starts_word(symbol, vocab.boundary)

    backend = tok.backend_tokenizer
    backend.no_truncation()
    backend.no_padding()
    n_in = n_out = n_cut = n_dropped = 0
    with open(dst, "w", encoding="utf-8", newline="\n") as out:
        for lines in _chunks(src, chunk_lines):
            texts = [line for line in lines if line]
            encoded = iter(backend.encode_batch(texts, add_special_tokens=False)) if texts else iter(())
            for line in lines:
                if not line:
                    out.write("\n")
                    n_out += 1
                    continue
                pieces = [symbols[i] for i in next(encoded).ids]
                if not pieces:
                    n_dropped += 1
                    continue
                chunks = cut_pieces(pieces, max_pieces, starts)
                n_cut += len(chunks) > 1
                out.writelines(" ".join(chunk) + "\n" for chunk in chunks)
                n_out += len(chunks)
            n_in += len(lines)
            if progress is not None:
                progress.update(len(lines))
    return {
        "input_lines": n_in,
        "lines": n_out,
        "lines_cut": n_cut,
        "chunks_added": n_out - n_in + n_dropped,
        "lines_dropped": n_dropped,
    }
