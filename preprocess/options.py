"""The options of ``preprocess.build``: one :class:`BuildOptions`, made by the command line
(:func:`parse_args`) and by the library call (:meth:`BuildOptions.from_call`), checked and
completed the same way (:meth:`BuildOptions.resolve`).

:meth:`BuildOptions.identity` is what the build's record and fingerprints say about them:
every option that changes what is written, with the same keys and values as every
earlier version of the tool wrote, so a finished build stays the build of the same command.
"""

import argparse
import os
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .text import LINE_UNITS

STAGES = ("extract", "split", "vocab", "encode", "binarize", "finalize")
WIKI_CLEANERS = ("scanner", "parser")
SPM_DEFAULTS = {
    "vocab_size": 32768,
    "byte_fallback": True,
    "character_coverage": 0.9995,
    "spm_sample_sentences": 1_000_000,
}
# Options of sentencepiece's training, refused with --tokenizer.
SPM_ONLY = tuple(SPM_DEFAULTS)
# The BooleanOptionalAction flags: False is spelled --no-NAME.
NEGATABLE = ("byte_fallback", "lowercase", "nfkc")


class OptionsError(ValueError):
    """Options that do not go together or out of range; ``str()`` is argparse's message."""


def _default_workers() -> int:
    return os.cpu_count() or 1


@dataclass
class BuildOptions:
    """Everything a build is told. ``None`` is "not given": :meth:`resolve` fills in the
    defaults that depend on other options (sentencepiece's, normalisation with --tokenizer)."""

    out: str
    wiki: List[str] = field(default_factory=list)
    books: List[str] = field(default_factory=list)
    text: List[str] = field(default_factory=list)
    tokenizer: Optional[str] = None
    vocab_size: Optional[int] = None
    workers: int = field(default_factory=_default_workers)
    line_unit: str = "sentence"
    wiki_cleaner: str = "scanner"
    wiki_page_seconds: Optional[float] = None
    max_line_pieces: int = 510
    spm_sample_sentences: Optional[int] = None
    character_coverage: Optional[float] = None
    byte_fallback: Optional[bool] = None
    lowercase: Optional[bool] = None
    nfkc: Optional[bool] = None
    valid_docs: Optional[int] = None
    test_docs: Optional[int] = None
    shards: int = 1
    seed: int = 1
    skip_bad: bool = False
    keep_work: bool = False
    force: bool = False
    stop_after: Optional[str] = None

    @classmethod
    def from_call(
        cls, out: Any, *, text: Iterable[Any] = (), wiki: Iterable[Any] = (), books: Iterable[Any] = (), **options
    ) -> "BuildOptions":
        """The options of ``build(out, text=..., **options)``, resolved; names are the
        flags' with ``_``, ``None`` is "not given". :class:`OptionsError` as the CLI's."""
        names = {f.name for f in fields(cls)} - {"out", "text", "wiki", "books"}
        unknown = sorted(set(options) - names)
        if unknown:
            raise OptionsError(f"unrecognized arguments: {' '.join('--' + n.replace('_', '-') for n in unknown)}")
        given = {k: v for k, v in options.items() if v is not None}
        if given.get("tokenizer") is not None:
            given["tokenizer"] = str(given["tokenizer"])
        opts = cls(
            out=str(out),
            text=[str(p) for p in text],
            wiki=[str(p) for p in wiki],
            books=[str(p) for p in books],
            **given,
        )
        return opts.resolve()

    @property
    def sources(self) -> List[Tuple[str, str]]:
        """(kind, path) of every input, in the order they are read."""
        return [("wiki", p) for p in self.wiki] + [("books", p) for p in self.books] + [("text", p) for p in self.text]

    def resolve(self) -> "BuildOptions":
        """Check the options and fill in the defaults (in place; returns ``self``)."""
        if not (self.wiki or self.books or self.text):
            raise OptionsError("give at least one input: --wiki, --books or --text")
        for name, choices in (("line_unit", LINE_UNITS), ("wiki_cleaner", WIKI_CLEANERS)):
            _check_choice(name, getattr(self, name), choices)
        if self.stop_after is not None:
            _check_choice("stop_after", self.stop_after, STAGES)
        if self.tokenizer:
            given = [_flag(n) for n in SPM_ONLY if getattr(self, n) is not None]
            if given:
                raise OptionsError(
                    f"--tokenizer cannot be combined with {', '.join(given)}: the tokenizer's own vocabulary "
                    "is used, no sentencepiece model is trained"
                )
        # the defaults (a sentencepiece build: as before; with --tokenizer: its own normalisation)
        for name, default in SPM_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, default)
        for name in ("lowercase", "nfkc"):
            if getattr(self, name) is None:
                setattr(self, name, not self.tokenizer)
        for name in ("vocab_size", "workers", "shards"):
            if getattr(self, name) < 1:
                raise OptionsError(f"{_flag(name)} must be >= 1")
        for name in ("valid_docs", "test_docs", "spm_sample_sentences", "max_line_pieces"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise OptionsError(f"{_flag(name)} must be >= 0")
        if not 0 < self.character_coverage <= 1:
            raise OptionsError("--character-coverage must be in (0, 1]")
        if self.wiki_page_seconds is None:
            from .extract import DEFAULT_PAGE_SECONDS

            self.wiki_page_seconds = DEFAULT_PAGE_SECONDS
        if not 0 <= self.wiki_page_seconds <= 1e6:  # also refuses nan and inf
            raise OptionsError("--wiki-page-seconds must be between 0 (no limit) and 1000000")
        return self

    def identity(self, tokenizer_sha256: Optional[str] = None) -> Dict[str, Any]:
        """Every option that changes what is written (not --workers, --keep-work ...), as the
        record's ``config`` holds them. --valid-docs/--test-docs are null when not given
        (chosen from the corpus); with --tokenizer, its identity replaces sentencepiece's
        options. The keys and values are those of every earlier version (the fingerprints)."""
        options = {
            "lowercase": self.lowercase,
            "nfkc": self.nfkc,
            "valid_docs": self.valid_docs,
            "test_docs": self.test_docs,
            "shards": self.shards,
            "seed": self.seed,
            "skip_bad": self.skip_bad,
            "line_unit": self.line_unit,
            "max_line_pieces": self.max_line_pieces,
        }
        if self.tokenizer:
            options["tokenizer"] = tokenizer_sha256
        else:
            options.update({name: getattr(self, name) for name in SPM_ONLY})
        # Recorded only for builds that read a dump and do not use the parser: the
        # records of builds made before --wiki-cleaner existed (all parser, or no
        # dump at all) stay the records of the same command.
        if self.wiki and self.wiki_cleaner != "parser":
            options["wiki_cleaner"] = self.wiki_cleaner
        return options


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise OptionsError(f"argument {_flag(name)}: invalid choice: {value!r} (choose from {listed})")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m preprocess.build",
        description="Raw Wikipedia dumps / BookCorpus-style text -> sentencepiece BPE + fairseq mmap data.",
    )
    g = p.add_argument_group("inputs (read in this order: all --wiki, all --books, all --text)")
    g.add_argument(
        "--wiki",
        action="append",
        default=[],
        metavar="DUMP",
        help="MediaWiki XML export, .xml or .xml.bz2 (repeatable)",
    )
    g.add_argument(
        "--books",
        action="append",
        default=[],
        metavar="DIR",
        help="directory of .txt files, one book per file (repeatable)",
    )
    g.add_argument(
        "--text",
        action="append",
        default=[],
        metavar="FILE",
        help="text with one paragraph (or sentence) per line, blank line between documents (repeatable)",
    )
    p.add_argument(
        "--out",
        required=True,
        help="output folder (fairseq data dir): missing, empty, or an earlier build of this tool",
    )
    p.add_argument(
        "--tokenizer",
        metavar="HF_DIR",
        help="encode with this HuggingFace model's own (fast) tokenizer instead of training sentencepiece: "
        "a model folder, its tokenizer folder, or an examples/import_from_hf.py output; dict.txt is then the "
        "model's vocabulary in its own id order (text is not lower-cased or NFKC-normalised unless asked: "
        "the tokenizer normalises)",
    )
    p.add_argument("--vocab-size", type=int, default=None, help="sentencepiece pieces (default 32768)")
    p.add_argument("--workers", type=int, default=_default_workers(), help="processes (default: all cores)")
    p.add_argument(
        "--line-unit",
        choices=LINE_UNITS,
        default="sentence",
        help="what one line (one fairseq item) is: 'sentence' (default; paragraphs split "
        "by blingfire, as in BERT/RoBERTa/SEED data) or 'paragraph'",
    )
    p.add_argument(
        "--wiki-cleaner",
        choices=WIKI_CLEANERS,
        default="scanner",
        help="how --wiki articles are cleaned: 'scanner' (default; brackets paired by a linear scan, "
        "WikiExtractor's speed, the least markup left) or 'parser' (mwparserfromhell's tree, "
        "~8x slower; what builds before this option used)",
    )
    p.add_argument(
        "--wiki-page-seconds",
        type=float,
        default=None,
        metavar="S",
        help="CPU seconds the cleaning of one --wiki page may take (default 30; 0 = no limit): a page "
        "over it is skipped, named in the log and in preprocess.json, and the build goes on. Not part "
        "of the build's identity (it changes nothing but the pages it skips)",
    )
    p.add_argument(
        "--max-line-pieces",
        type=int,
        default=510,
        metavar="N",
        help="cut any line longer than N sentencepiece pieces into consecutive chunks of at "
        "most N (nothing is lost), so --sample-break-mode complete never makes an "
        "oversized block; default 510 = --tokens-per-sample 512 minus [CLS] and </s>; "
        "0 = never cut",
    )
    p.add_argument(
        "--spm-sample-sentences",
        type=int,
        default=None,
        help="train lines (sentences or paragraphs, see --line-unit) sampled for "
        "sentencepiece; 0 = all (default 1000000)",
    )
    p.add_argument("--character-coverage", type=float, default=None, help="sentencepiece (default 0.9995)")
    p.add_argument(
        "--byte-fallback",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="unknown characters become UTF-8 byte pieces (default on); off: they become <unk>",
    )
    p.add_argument(
        "--lowercase",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="lower-case all text (default on: the released SEED-Encoder is uncased; off with --tokenizer)",
    )
    p.add_argument(
        "--nfkc",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Unicode NFKC normalisation (default on; off with --tokenizer)",
    )
    p.add_argument(
        "--valid-docs",
        type=int,
        default=None,
        help="documents held out for valid (default: 5%% of the documents, at most 1000)",
    )
    p.add_argument(
        "--test-docs",
        type=int,
        default=None,
        help="documents held out for test (default: 5%% of the documents, at most 1000)",
    )
    p.add_argument("--shards", type=int, default=1, help="train shards: OUT/shard0..N-1 when N > 1")
    p.add_argument("--seed", type=int, default=1, help="seed of the valid/test document choice")
    p.add_argument(
        "--skip-bad", action="store_true", help="skip (and count) non-UTF-8 lines of text inputs instead of stopping"
    )
    p.add_argument("--keep-work", action="store_true", help="keep OUT/.work (normalised text, pieces)")
    p.add_argument(
        "--force",
        action="store_true",
        help="discard the earlier build in OUT (the files its record lists) and start over",
    )
    p.add_argument("--stop-after", choices=STAGES, help=argparse.SUPPRESS)
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> BuildOptions:
    """The command line's options, resolved; a bad one exits with argparse's usage line (status 2)."""
    p = parser()
    try:
        return BuildOptions(**vars(p.parse_args(argv))).resolve()
    except OptionsError as e:
        p.error(str(e))
        raise  # not reached: error() exits
