"""MediaWiki XML export (``pages-articles*.xml[.bz2]``) -> clean article paragraphs.

Streaming: ``xml.etree.ElementTree.iterparse`` over a ``bz2`` stream (multi-stream
dumps included), each <page> element freed once read. Cleaning uses
mwparserfromhell; only the post-cleanup tidying is hand-written.
"""

import bz2
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import mwparserfromhell

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
# them, since no parser can know what the template would have rendered.
_EMPTY_PARENS = re.compile(r"\(\s*[,;:]*\s*\)")
_PAREN_LEAD_PUNCT = re.compile(r"\(\s*[,;:]+\s*")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?])")
# Magic words (__NOTOC__) and leftover table/template fragments on their own line.
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
# HTML tags mwparserfromhell left as text because they were unbalanced.
_STRAY_TAG = re.compile(
    r"</?(?:blockquote|div|span|br|center|small|big|sup|sub|p|poem|font|u|s|del|ins|"
    r"abbr|cite|onlyinclude|includeonly|noinclude|nowiki|ref|references)\b[^<>]*/?>",
    re.IGNORECASE,
)
_MARKUP_LEFTOVER = ("{{", "}}", "{|", "|}", "[[", "]]", "<ref", "|-")


def _local(tag):
    return tag.rsplit("}", 1)[-1]


def _open_dump(path):
    """Open a dump as a binary stream, bz2-compressed or not (decided by magic bytes)."""
    path = Path(path)
    check_nonempty_file(path)
    with open(path, "rb") as f:
        magic = f.read(3)
    if magic == b"BZh":
        return bz2.open(path, "rb")
    return open(path, "rb")


def iter_pages(path, stats):
    """Yield the raw wikitext of every article (namespace 0, not a redirect).

    Counts pages / redirects / other namespaces in ``stats``. All low-level
    failures are turned into one PreprocessError naming the file.
    """
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
            redirect = False
            for child in elem:
                name = _local(child.tag)
                if name == "ns":
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
                yield text
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


def clean_wikitext(text):
    """Article wikitext -> list of plain-text paragraphs (headings and non-prose dropped)."""
    code = mwparserfromhell.parse(text)
    # Drop whole trailing sections (References, External links ...).
    for section in code.get_sections(levels=[2], include_headings=True):
        headings = section.filter_headings(recursive=False)
        if headings and headings[0].title.strip_code().strip().lower() in _DROP_SECTIONS:
            _drop_node(code, section)
    for node in code.filter_templates(recursive=False):
        _drop_node(code, node)
    for node in code.filter_tags(recursive=True):
        if str(node.tag).strip().lower() in _DROP_TAGS:
            _drop_node(code, node)
    for node in code.filter_wikilinks(recursive=True):
        title = str(node.title).strip().lower()
        if title.startswith(_DROP_LINK_PREFIXES) or (
            _INTERWIKI.match(title) and not title.startswith(":") and " " not in title.split(":", 1)[0]
        ):
            _drop_node(code, node)
    for node in code.filter_headings(recursive=False):
        _drop_node(code, node)
    # Templates nested in what survived (e.g. inside link text) go too.
    for node in code.filter_templates(recursive=True):
        _drop_node(code, node)
    plain = code.strip_code(normalize=True, collapse=True, keep_template_params=False)
    paragraphs = []
    for line in plain.split("\n"):
        line = _MAGIC_WORD.sub("", line)
        line = _STRAY_TAG.sub("", line)
        line = _EMPTY_PARENS.sub("", line)
        line = _PAREN_LEAD_PUNCT.sub("(", line)
        line = _SPACE_BEFORE_PUNCT.sub(r"\1", line)
        line = line.strip(" \t*#:;")
        if not line:
            continue
        if any(tok in line for tok in _MARKUP_LEFTOVER):
            # Broken markup mwparserfromhell could not pair up: the whole line
            # is junk rather than prose, so drop it instead of leaking markup.
            continue
        paragraphs.append(line)
    return paragraphs
