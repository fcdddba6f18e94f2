"""The corpus normalisation, and the characters that carry no text.

``normalize_line`` is the single definition of the normalisation a sentencepiece build
records in ``preprocess.json`` (``preprocess.text`` is its recorded name): ``preprocess``
applies it to the corpus, ``--retrieval-dev`` of the pre-training task to the dev set's
text, so both reach the sentencepiece model (trained with its ``identity`` normaliser)
the same way.

Control characters (Unicode category Cc) that are not whitespace would otherwise
become byte-fallback pieces or unknown tokens: ``normalize_line`` drops them from
every line, and ``hf.tokenizer`` adds the same rule to an exported tokenizer's
normaliser, so a model sees the same text in both places.
"""

import re
import unicodedata

CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f]")
# Any run of Unicode whitespace (str.isspace: includes NBSP, U+2028, \x1c-\x1f ...)
# becomes one ASCII space. fairseq's tokenize_line splits on the same class (\s),
# so no sentencepiece piece may contain any of these characters.
_WHITESPACE = re.compile(r"\s+")

NORMALIZATION_STEPS = (
    "unicodedata NFKC",
    "lowercase (str.lower) when enabled, then NFKC again",
    "drop non-whitespace control characters (Unicode Cc)",
    "collapse every run of Unicode whitespace to one ASCII space, strip both ends",
)


def normalize_line(line: str, lowercase: bool = True, nfkc: bool = True) -> str:
    """Normalise one paragraph/line; returns '' for lines with no text left.

    NFKC runs before lower-casing (NFKC turns e.g. U+210C "ℌ" into "H") and
    again after it (lower-casing can leave a non-NFC sequence, e.g. "İ" ->
    "i" + U+0307), so the result is stable: normalize_line(normalize_line(x))
    == normalize_line(x), which makes applying it again downstream harmless.
    """
    if nfkc:
        line = unicodedata.normalize("NFKC", line)
    if lowercase:
        line = line.lower()
        if nfkc:
            line = unicodedata.normalize("NFKC", line)
    if line.isprintable():
        # The usual case, same result, half the time: a printable line has no
        # control character and no whitespace but " " (str.isprintable is False
        # for categories Cc, Zs but the ASCII space, Zl and Zp).
        if "  " in line:
            line = _WHITESPACE.sub(" ", line)
        return line.strip()
    line = CONTROL_CHARACTERS.sub("", line)
    return _WHITESPACE.sub(" ", line).strip()
