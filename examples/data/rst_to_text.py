#!/usr/bin/env python
"""reStructuredText sources -> the project's text format (prose only).

    python examples/data/rst_to_text.py SOURCES_DIR --out corpus.txt [--exclude translations]

Every ``*.rst.txt`` / ``*.rst`` file under SOURCES_DIR (sorted, so the output is
the same on every machine) becomes one document: its prose paragraphs, one per
line, and a blank line between documents.  Removed: section titles, directives
and their content (``.. code-block::``, ``.. note::``, ...), comments, literal
blocks (after ``::``) and every other indented block, tables, field lists,
substitution definitions; inline markup is reduced to its text (``x`` -> x,
:ref:`text <target>` -> text, `text <url>`_ -> text, **x** -> x).  Paragraphs
shorter than --min-chars or with too few letters (code, ASCII art) are dropped,
and so are documents left with fewer than --min-paragraphs paragraphs.
"""

import argparse
import re
import sys
from pathlib import Path
from typing import Iterator, List

UNDERLINE = re.compile(r"^([=\-~^\"'`#*+:.<>_])\1{2,}\s*$")
BULLET = re.compile(r"^(?:[-*+•]|#\.|\(?\d+[.)]|\(?[a-zA-Z][.)])\s+")
INLINE = [
    (re.compile(r":[\w:+.-]+:`([^`<]*?)\s*<[^`>]*>`"), r"\1"),  # :role:`text <target>`
    (re.compile(r":[\w:+.-]+:`~?([^`]*)`"), r"\1"),  # :role:`text`
    (re.compile(r"`([^`<]+?)\s*<[^`>]*>`__?"), r"\1"),  # `text <url>`_
    (re.compile(r"``([^`]+)``"), r"\1"),  # ``literal``
    (re.compile(r"`([^`]+)`_{0,2}"), r"\1"),  # `ref`_ / `interpreted`
    (re.compile(r"\*\*([^*]+)\*\*"), r"\1"),
    (re.compile(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])"), r"\1"),
    (re.compile(r"\[(?:#\w*|\d+|\*)\]_"), ""),  # footnote references
    (re.compile(r"\|([\w -]+)\|"), r"\1"),  # |substitution|
    (re.compile(r"\\(.)"), r"\1"),  # escaped characters
]


def blocks(text: str) -> Iterator[List[str]]:
    """Groups of consecutive non-blank lines."""
    block: List[str] = []
    for line in text.splitlines():
        if line.strip():
            block.append(line.rstrip())
        elif block:
            yield block
            block = []
    if block:
        yield block


def clean_inline(text: str) -> str:
    for pattern, repl in INLINE:
        text = pattern.sub(repl, text)
    return re.sub(r"\s+", " ", text).strip()


def paragraphs(text: str, min_chars: int = 60, min_letters: float = 0.7) -> List[str]:
    out = []
    for block in blocks(text):
        first = block[0]
        if first[0] in " \t":  # indented: code, literal blocks, directive bodies, quotes
            continue
        if first.startswith(".."):  # directives, comments, targets, substitution definitions
            continue
        if first.startswith(("+-", "+=", "|", ":")) or UNDERLINE.match(first):  # tables, field lists, overlines
            continue
        # a title (a line underlined by punctuation) and whatever follows the underline
        lines = []
        for line in block:
            if UNDERLINE.match(line):
                lines = []  # drop the title above it
                continue
            if line[0] in " \t" and lines and not BULLET.match(lines[0]):
                break  # an indented tail (definition body, literal continuation)
            lines.append(line)
        if not lines:
            continue
        if re.match(r"^=+(\s+=+)+\s*$", lines[0]):  # simple table
            continue
        para = " ".join(line.strip() for line in lines)
        para = BULLET.sub("", para)
        if para.endswith("::"):  # "Example::" introduces a literal block, dropped above
            para = para[:-2].rstrip() + ":"
        para = clean_inline(para)
        letters = sum(c.isalpha() or c.isspace() for c in para)
        if len(para) < min_chars or letters < min_letters * len(para) or "SPDX-License-Identifier" in para:
            continue
        out.append(para)
    return out


def convert(sources: Path, exclude: List[str], min_chars: int, min_paragraphs: int):
    files = sorted(p for pat in ("*.rst.txt", "*.rst") for p in sources.rglob(pat))
    for path in files:
        rel = path.relative_to(sources)
        if any(part in exclude for part in rel.parts):
            continue
        paras = paragraphs(path.read_text(encoding="utf-8", errors="replace"), min_chars)
        if len(paras) >= min_paragraphs:
            yield rel, paras


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sources", type=Path, help="folder of reStructuredText sources")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--exclude", nargs="*", default=["translations"], help="folder names to skip")
    p.add_argument("--min-chars", type=int, default=60)
    p.add_argument("--min-paragraphs", type=int, default=2)
    args = p.parse_args(argv)
    if not args.sources.is_dir():
        print(f"error: {args.sources}: not a folder", file=sys.stderr)
        return 2
    n_docs = n_paras = 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for _, paras in convert(args.sources, args.exclude, args.min_chars, args.min_paragraphs):
            if n_docs:
                f.write("\n")
            f.write("\n".join(paras) + "\n")
            n_docs += 1
            n_paras += len(paras)
    tmp.replace(args.out)
    print(f"wrote {args.out}: {n_docs} documents, {n_paras} paragraphs, {args.out.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
