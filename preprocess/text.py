"""Text normalisation and the plain-text readers (BookCorpus-style dirs, ready corpora).

``normalize_line`` (defined in ``seed_fairseq.base.vocabulary.text``, recorded under this name)
is the single definition of the normalisation recorded in ``preprocess.json``; anything
that tokenizes raw text for this model (HF export, downstream encoding) must apply it
before the sentencepiece model, because the model itself is trained with sentencepiece's
``identity`` normalizer.
"""

from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple, Union

# below the fairseq side, where the pre-training task's --retrieval-dev normalises its text too
from seed_fairseq.base.vocabulary.text import NORMALIZATION_STEPS, normalize_line  # noqa: F401

from .errors import PreprocessError

LINE_UNITS = ("sentence", "paragraph")
SENTENCE_SPLITTER = "blingfire.text_to_sentences"


def _blingfire():
    try:
        import blingfire
    except ImportError:  # pragma: no cover - blingfire is a dependency of preprocess/
        raise PreprocessError(
            "blingfire", "not installed: pip install blingfire (needed by --line-unit sentence)"
        ) from None
    return blingfire


def sentence_splitter_available() -> None:
    """Raise PreprocessError unless the sentence splitter can be imported."""
    _blingfire()


def split_sentences(text: str) -> List[str]:
    """Split one whitespace-normalised paragraph into sentences, cutting only at its spaces.

    The splitter is blingfire's ``text_to_sentences`` (Microsoft Bling Fire): a
    maintained C++ library with prebuilt wheels, deterministic (no model
    download, no randomness), fast enough for a whole Wikipedia dump (tens of
    MB/s, negligible beside wikitext parsing), and good on the abbreviations,
    initials, decimals and quotes of encyclopedic English. It is given the
    cased text (its rules use capitalisation; on lower-cased text it misses
    many boundaries).

    blingfire answers with the text, one sentence per line. That answer is
    aligned back onto ``text`` and a boundary is kept only where ``text`` has a
    space, which is dropped; so ``" ".join(split_sentences(text)) == text``
    always holds. Boundaries without a space (e.g. after a CJK full stop) are
    not cut; if the splitter ever changes other characters, the paragraph
    stays whole.
    """
    out = _blingfire().text_to_sentences(text)
    if "\n" not in out:
        return [text] if text else []
    if out.replace("\n", " ") == text:  # the usual case: each boundary replaced one space
        return out.split("\n")
    cuts = []
    i = 0
    for ch in out:
        if ch == "\n":
            if i < len(text) and text[i] == " ":
                cuts.append(i)
                i += 1
            elif i > 0 and text[i - 1] == " ":
                cuts.append(i - 1)
            continue
        if i >= len(text) or text[i] != ch:
            return [text]
        i += 1
    if i != len(text):
        return [text]
    sentences, start = [], 0
    for cut in sorted(set(cuts)):
        if cut > start:
            sentences.append(text[start:cut])
        start = cut + 1
    if start < len(text):
        sentences.append(text[start:])
    return sentences


def paragraph_lines(
    raw: str, lowercase: bool = True, nfkc: bool = True, line_unit: str = "sentence"
) -> Tuple[List[str], bool]:
    """One raw paragraph -> its output lines; returns (lines, kept_whole).

    ``paragraph``: ``[normalize_line(raw)]`` (nothing if it is empty).
    ``sentence``: the cased, normalised paragraph is split by
    ``split_sentences`` and each sentence then normalised (lower-cased) on its
    own. Invariant, in both modes: ``" ".join(lines) == normalize_line(raw)``.
    In the (rare) case where normalising the sentences one by one would break
    it, the paragraph is kept as one line and ``kept_whole`` is True.
    """
    norm = normalize_line(raw, lowercase=lowercase, nfkc=nfkc)
    if not norm:
        return [], False
    if line_unit == "paragraph":
        return [norm], False
    if line_unit != "sentence":
        raise ValueError(line_unit)
    if not lowercase:
        return split_sentences(norm), False
    cased = normalize_line(raw, lowercase=False, nfkc=nfkc)
    lines = [normalize_line(s, lowercase=lowercase, nfkc=nfkc) for s in split_sentences(cased)]
    lines = [line for line in lines if line]
    if " ".join(lines) != norm:
        return [norm], True
    return lines, False


def decode_lines(path: Union[str, Path], skip_bad: bool, stats: Dict[str, Any]) -> Iterator[Tuple[int, str]]:
    """Yield (line_number, text) of a UTF-8 file, streaming, '\\n' as the only line end.

    Lines are split on b'\\n' before decoding so that U+2028 & co. never split
    a line (they are whitespace inside it), and a bad byte can be reported with
    its line number or, with ``skip_bad``, that line alone skipped and counted.
    """
    path = Path(path)
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                if not skip_bad:
                    raise PreprocessError(
                        path,
                        f"line {number}: not valid UTF-8 ({e.reason} at byte {e.start}); "
                        "fix the file or pass --skip-bad to skip such lines",
                    ) from None
                stats["bad_lines_skipped"] = stats.get("bad_lines_skipped", 0) + 1
                continue
            yield number, text.rstrip("\r\n")


def check_nonempty_file(path: Union[str, Path]) -> None:
    path = Path(path)
    if not path.exists():
        raise PreprocessError(path, "no such file")
    if not path.is_file():
        raise PreprocessError(path, "not a regular file")
    if path.stat().st_size == 0:
        raise PreprocessError(path, "empty file")


def read_book_segments(
    path: Union[str, Path], skip_bad: bool, stats: Dict[str, Any], max_lines: int
) -> Iterator[Tuple[bool, List[str]]]:
    """One book = one document; every non-blank line is a paragraph.

    Blank lines inside a book are dropped (in the output a blank line means
    "next document"). Yields (starts_document, [lines]) segments of at most
    ``max_lines`` so a huge book never sits in memory whole.
    """
    check_nonempty_file(path)
    starts_doc = True
    buf = []
    for _, line in decode_lines(path, skip_bad, stats):
        if line.strip():
            buf.append(line)
            if len(buf) >= max_lines:
                yield starts_doc, buf
                starts_doc, buf = False, []
    if buf or starts_doc:
        yield starts_doc, buf


def read_text_segments(
    path: Union[str, Path], skip_bad: bool, stats: Dict[str, Any], max_lines: int
) -> Iterator[Tuple[bool, List[str]]]:
    """A corpus already in "one paragraph per line, blank line between documents" form."""
    check_nonempty_file(path)
    starts_doc = True
    buf = []
    for _, line in decode_lines(path, skip_bad, stats):
        if not line.strip():
            if buf:
                yield starts_doc, buf
                buf = []
            starts_doc = True
            continue
        buf.append(line)
        if len(buf) >= max_lines:
            yield starts_doc, buf
            starts_doc, buf = False, []
    if buf:
        yield starts_doc, buf
