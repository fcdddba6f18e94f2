"""MediaWiki XML export (``pages-articles*.xml[.bz2]``) -> clean article paragraphs.

Streaming: ``xml.etree.ElementTree.iterparse`` over a ``bz2`` stream (multi-stream
dumps included), each <page> element freed once read; the decompression runs in a
thread ahead of the parsing (:class:`_ReadAhead`: bz2 releases the GIL), so it
overlaps the cleaning even with one worker.

Two cleaners with the same rules (``--wiki-cleaner``): ``scanner``
(:mod:`preprocess.wiki_scanner`, the default: brackets paired by a linear scan,
WikiExtractor's approach) and ``parser`` (:func:`clean_wikitext` here:
mwparserfromhell's tree). Both end in :func:`tidy_paragraphs`.

Speed of the parser cleaner (the same output, tested against the straightforward
use of mwparserfromhell): the tree is built by :class:`_SkippingBuilder`, which does
not build what the cleaning would remove first anyway (top-level templates,
tags in ``_DROP_TAGS`` at top level) and removals are pops by index
(:func:`_prune`) instead of ``Wikicode.remove``, which searches the tree for
every node it removes. Together 5-6x faster; what is left is mostly
mwparserfromhell's C tokenizer. That tokenizer is quadratic on a few kinds of
unclosed markup and overflows its C stack on one (tests/test_faults_wiki.py):
the extraction's per-page budget (:mod:`preprocess.extract`) covers those.
"""

import bz2
import queue
import re
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple, Union

from mwparserfromhell.nodes import Heading, Tag, Template, Wikilink
from mwparserfromhell.parser import Parser
from mwparserfromhell.parser import tokens as _tokens
from mwparserfromhell.parser.builder import Builder

from .errors import PreprocessError
from .text import check_nonempty_file

# Link prefixes whose targets are media, categories or other-language copies:
# their text is not article prose. ("Image:"/"Media:" are old aliases of "File:".)
_DROP_LINK_PREFIXES = ("file:", "image:", "media:", "category:")
# Tags whose contents are not prose. Wiki tables ({| ... |}) parse as <table>.
_DROP_TAGS = {
    "ref",
    "references",
    "table",
    "gallery",
    "math",
    "chem",
    "ce",
    "timeline",
    "score",
    "syntaxhighlight",
    "source",
    "pre",
    "imagemap",
    "graph",
    "mapframe",
    "maplink",
    "templatedata",
    "hiero",
    "inputbox",
    "categorytree",
    "code",
}
# Trailing sections that are lists of links/citations rather than prose.
_DROP_SECTIONS = {
    "references",
    "external links",
    "see also",
    "further reading",
    "notes",
    "bibliography",
    "sources",
    "footnotes",
    "citations",
    "notes and references",
    "works cited",
    "literature",
}
# An interlanguage/interwiki link looks like [[fr:Titre]]: a short lowercase prefix.
_INTERWIKI = re.compile(r"^:?[a-z][a-z\-]{1,11}:")
# Removing templates leaves husks such as "Foo ( ; born 1950)" or "( )": tidy
# them, since no cleaner can know what the template would have rendered.
# All these patterns stay within a line ([^\S\n] is whitespace but a newline) and
# run in linear time on any input: possessive quantifiers, and a run of spaces is
# only tried from its first space (a plain \s+ or \(\s*...\s*\) is quadratic in a
# long run of spaces). The same holds for every pattern of both cleaners
# (tests/test_faults_wiki.py times them on adversarial runs).
_EMPTY_PARENS = re.compile(r"\([^\S\n]*+[,;:]*+[^\S\n]*+\)")
_PAREN_LEAD_PUNCT = re.compile(r"\([^\S\n]*+[,;:]++[^\S\n]*+")
_SPACE_BEFORE_PUNCT = re.compile(r"(?<![^\S\n])[^\S\n]++([,.;:!?])")
# Magic words (__NOTOC__) and leftover table/template fragments on their own line.
_MAGIC_WORD = re.compile(r"__[A-Z]++__")
# HTML tags left as text because they were unbalanced (by either cleaner).
_STRAY_TAG = re.compile(
    r"</?(?:blockquote|div|span|br|center|small|big|sup|sub|p|poem|font|u|s|del|ins|"
    r"abbr|cite|onlyinclude|includeonly|noinclude|nowiki|ref|references)\b[^<>\n]*+>",
    re.IGNORECASE,
)
_MARKUP_LEFTOVER = ("{{", "}}", "{|", "|}", "[[", "]]", "<ref", "|-")


def _local(tag):
    return tag.rsplit("}", 1)[-1]


class _ReadAhead:
    """A binary stream read by a background thread, ``depth`` blocks ahead.

    For the bz2 dumps: ``BZ2Decompressor`` releases the GIL, so decompressing
    here overlaps the XML parsing and cleaning in the calling thread (a third of
    the time of a one-worker extraction was decompression). Errors of the
    stream (truncated or corrupt data) are raised by :meth:`read` in the
    caller, as if it had read the stream itself. Memory: at most ``depth + 1``
    blocks.
    """

    def __init__(self, raw, block_size: int = 1 << 20, depth: int = 4):
        self._queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._block = b""
        self._pos = 0
        self._done = False
        self._thread = threading.Thread(target=self._fill, args=(raw, block_size), daemon=True)
        self._thread.start()

    def _fill(self, raw, block_size):
        try:
            while not self._stop.is_set():
                block = raw.read(block_size)
                self._put(block)
                if not block:
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the reader, raised there
            self._put(e)
        finally:
            raw.close()

    def _put(self, item):
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def read(self, n: int = -1) -> bytes:
        out = []
        while not self._done and (n < 0 or n > 0):
            if self._pos == len(self._block):
                item = self._queue.get()
                if isinstance(item, BaseException):
                    self._done = True
                    raise item
                if not item:
                    self._done = True
                    break
                self._block, self._pos = item, 0
            take = len(self._block) - self._pos if n < 0 else min(n, len(self._block) - self._pos)
            out.append(self._block[self._pos : self._pos + take])
            self._pos += take
            if n > 0:
                n -= take
        return b"".join(out)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _open_dump(path):
    """Open a dump as a binary stream, bz2-compressed or not (decided by magic bytes)."""
    path = Path(path)
    check_nonempty_file(path)
    with open(path, "rb") as f:
        magic = f.read(3)
    if magic == b"BZh":
        return _ReadAhead(bz2.open(path, "rb"))
    return open(path, "rb")


def iter_pages(path: Union[str, Path], stats: Dict[str, Any]) -> Iterator[str]:
    """Yield the raw wikitext of every article (namespace 0, not a redirect).

    Counts pages / redirects / other namespaces in ``stats``. All low-level
    failures are turned into one PreprocessError naming the file.
    """
    return (text for _, text in iter_articles(path, stats))


def iter_articles(path: Union[str, Path], stats: Dict[str, Any]) -> Iterator[Tuple[str, str]]:
    """:func:`iter_pages` with each article's title: yields (title, wikitext)."""
    path = Path(path)
    f = _open_dump(path)
    try:
        context = ET.iterparse(f, events=("start", "end"))
        root = None
        for event, elem in context:
            if root is None:
                root = elem
                if _local(elem.tag) != "mediawiki":
                    raise PreprocessError(
                        path,
                        f"not a MediaWiki XML export (root element is <{_local(elem.tag)}>, expected <mediawiki>)",
                    )
                continue
            if event != "end" or _local(elem.tag) != "page":
                continue
            stats["pages"] = stats.get("pages", 0) + 1
            ns = text = None
            title = ""
            redirect = False
            for child in elem:
                name = _local(child.tag)
                if name == "title":
                    title = child.text or ""
                elif name == "ns":
                    ns = (child.text or "").strip()
                elif name == "redirect":
                    redirect = True
                elif name == "revision":
                    for sub in child:
                        if _local(sub.tag) == "text":
                            text = sub.text or ""
            # Free the page and its already-seen siblings: constant memory.
            elem.clear()
            root.clear()
            if redirect:
                stats["redirects"] = stats.get("redirects", 0) + 1
            elif ns not in (None, "0"):
                stats["non_article_pages"] = stats.get("non_article_pages", 0) + 1
            elif text is not None and not text.lstrip().lower().startswith("#redirect"):
                stats["articles"] = stats.get("articles", 0) + 1
                yield title, text
            else:
                stats["redirects"] = stats.get("redirects", 0) + 1
        if root is None:
            raise PreprocessError(path, "not a MediaWiki XML export (no XML element found)")
    except ET.ParseError as e:
        msg = str(e)
        if msg.startswith("no element found") or "unclosed token" in msg:
            problem = f"truncated XML ({msg})"
        elif "not well-formed (invalid token)" in msg:
            problem = f"not a well-formed MediaWiki XML export ({msg}); non-UTF-8 bytes or non-XML data"
        else:
            problem = f"not a well-formed MediaWiki XML export ({msg})"
        raise PreprocessError(path, problem) from None
    except EOFError:
        raise PreprocessError(path, "truncated .bz2 file (compressed stream ended before its end marker)") from None
    except OSError as e:
        raise PreprocessError(path, f"corrupt .bz2 data ({e})") from None
    finally:
        f.close()


def _drop_node(code, node):
    try:
        code.remove(node)
    except ValueError:
        # Already gone with a removed parent (e.g. a template inside a ref).
        pass


def _prune(code, drop):
    """Remove every node for which ``drop(node)`` is true, at any depth, from ``code``.

    Visits parents before their children and never descends into a removed node:
    the same nodes go as with ``for n in code.filter(recursive=True): if drop(n):
    code.remove(n)`` (mwparserfromhell), but each removal is a pop by index where
    ``Wikicode.remove`` searches the whole tree for the node again (that search
    was two thirds of the cleaning time).
    """
    stack = [code]
    while stack:
        nodes = stack.pop().nodes
        i = 0
        while i < len(nodes):
            node = nodes[i]
            if drop(node):
                nodes.pop(i)
            else:
                stack.extend(node.__children__())
                i += 1


def _is_template(node):
    return isinstance(node, Template)


def _is_dropped_tag(node):
    return isinstance(node, Tag) and str(node.tag).strip().lower() in _DROP_TAGS


def _is_dropped_link(node):
    if not isinstance(node, Wikilink):
        return False
    title = str(node.title).strip().lower()
    return title.startswith(_DROP_LINK_PREFIXES) or (
        _INTERWIKI.match(title) is not None and not title.startswith(":") and " " not in title.split(":", 1)[0]
    )


def _drop_top_level(code, drop):
    nodes = code.nodes
    for i in range(len(nodes) - 1, -1, -1):
        if drop(nodes[i]):
            nodes.pop(i)


_TAG_NAME_END = (_tokens.TagAttrStart, _tokens.TagCloseOpen, _tokens.TagCloseSelfclose)


class _SkippingBuilder(Builder):
    """mwparserfromhell's tree builder, minus the top-level templates and the
    top-level tags in ``_DROP_TAGS``: their tokens are consumed without building
    nodes (most of an article's tree: infoboxes, citations, tables).

    ``clean_wikitext`` removes exactly these nodes first, before anything reads
    them (its section step only looks at top-level headings), so the result is
    the same as building and then removing them.
    """

    def build(self, tokenlist):
        self._tokens = tokens = tokenlist
        tokens.reverse()
        self._push()
        while tokens:
            token = tokens.pop()
            kind = type(token)
            if kind is _tokens.TemplateOpen:
                self._skip(_tokens.TemplateOpen, (_tokens.TemplateClose,))
            elif kind is _tokens.TagOpenOpen and self._dropped_tag_follows():
                self._skip(_tokens.TagOpenOpen, (_tokens.TagCloseSelfclose, _tokens.TagCloseClose))
            else:
                self._write(self._handle_token(token))
        return self._pop()

    def _dropped_tag_follows(self):
        # a tag name is one Text token (anything else, e.g. a template in the
        # name, is built as usual)
        tokens = self._tokens
        return (
            len(tokens) >= 2
            and type(tokens[-1]) is _tokens.Text
            and type(tokens[-2]) in _TAG_NAME_END
            and tokens[-1].text.strip().lower() in _DROP_TAGS
        )

    def _skip(self, opener, closers):
        """Consume tokens up to the closer that balances the opener just read."""
        tokens = self._tokens
        depth = 1
        while depth:
            kind = type(tokens.pop())
            if kind is opener:
                depth += 1
            elif kind in closers:
                depth -= 1


def _parse(text):
    parser = Parser()
    return _SkippingBuilder().build(parser._tokenizer.tokenize(text, 0, False))


def clean_wikitext(text: str) -> List[str]:
    """Article wikitext -> list of plain-text paragraphs (headings and non-prose dropped)."""
    code = _parse(text)
    # Drop whole trailing sections (References, External links ...).
    for section in code.get_sections(levels=[2], include_headings=True):
        headings = section.filter_headings(recursive=False)
        if headings and headings[0].title.strip_code().strip().lower() in _DROP_SECTIONS:
            _drop_node(code, section)
    # In this order: a link's title is judged with the templates inside it still there.
    _drop_top_level(code, _is_template)
    _prune(code, _is_dropped_tag)
    _prune(code, _is_dropped_link)
    _drop_top_level(code, lambda node: isinstance(node, Heading))
    # Templates nested in what survived (e.g. inside link text) go too.
    _prune(code, _is_template)
    return tidy_paragraphs(code.strip_code(normalize=True, collapse=True, keep_template_params=False))


def tidy_paragraphs(plain: str) -> List[str]:
    """Cleaned text (one paragraph per line) -> its non-empty paragraphs, tidied.

    Both cleaners end here. Lines still holding markup no cleaner could pair up
    (``_MARKUP_LEFTOVER``) are junk rather than prose: dropped whole instead of
    leaking markup.
    """
    plain = _MAGIC_WORD.sub("", plain)
    plain = _STRAY_TAG.sub("", plain)
    plain = _EMPTY_PARENS.sub("", plain)
    plain = _PAREN_LEAD_PUNCT.sub("(", plain)
    plain = _SPACE_BEFORE_PUNCT.sub(r"\1", plain)
    paragraphs = []
    for line in plain.split("\n"):
        line = line.strip(" \t*#:;")
        if line and not any(tok in line for tok in _MARKUP_LEFTOVER):
            paragraphs.append(line)
    return paragraphs
