"""The default wikitext cleaner (``--wiki-cleaner scanner``): article wikitext -> paragraphs.

The same rules as the mwparserfromhell cleaner (:func:`preprocess.wiki.clean_wikitext`,
``--wiki-cleaner parser``) and the same tidying (:func:`preprocess.wiki.tidy_paragraphs`),
applied the way WikiExtractor works: regular expressions over the text, with each
bracket construct (templates, tables, links, tags) paired by one linear scan with a
stack instead of a parse tree. About 8x faster than the parser cleaner, so
extraction keeps up with WikiExtractor, and on the real-article sample it leaves
less markup than either (``benchmarks/preprocess_throughput.py`` counts both).

Hand-written rather than a library because the libraries are either the parser
(mwparserfromhell, wikitextparser: a tree of every node, the slow part) or
WikiExtractor (a command-line tool that leaves more markup and whose cleaning
functions are not a maintained API).

How it differs from the parser on real pages (``tests/test_wiki_scanner.py``):
bold/italic markup is deleted as text before anything else, never paired. An
apostrophe run that does not pair (``''Iliad'''s``) then changes nothing but
itself, where mwparserfromhell can read the rest of the page as the inside of one
italic tag and keep its headings, tables and "References" section as prose; and
``''{{lang|la|x}}''`` cannot leave ``''''`` behind once the template is gone.
Every other pairing is local too: a stray ``{{`` or ``[[`` stays unpaired and
costs only its own line (dropped by the markup check).

Every step is linear in the page length, whatever the page holds: finditer
scans, pairing stacks, and patterns that never backtrack into a run they have
read. No pattern has two unbounded quantifiers, nested or adjacent, that can
match the same characters: each run is either possessive (``*+``, ``++``) or
followed by what its class excludes, and heading lines are read with str
methods (``tests/test_faults_wiki.py`` times every pattern on adversarial runs).
"""

import html
import re
from typing import List, Optional, Tuple

from . import wiki

# ''italic'', '''bold''', '''''both'''''.
_BOLD_ITALIC = re.compile(r"'''''|'''|''")
# An opening, closing or self-closing tag whose contents are dropped (wiki.py's
# _DROP_TAGS: <ref>, <math>, <table> ...). Longest names first: <references> is
# not <ref> plus "erences". Group 3 (the attributes) ends with "/" when the tag
# closes itself.
_DROP_TAG = re.compile(
    r"<(/?)[^\S\n]*+(" + "|".join(sorted(wiki._DROP_TAGS, key=len, reverse=True)) + r")\b([^<>]*+)>",
    re.IGNORECASE,
)
# Runs of 2+ braces: {{template}}, {{{parameter}}} and their nestings, by brace count.
_BRACES = re.compile(r"\{\{+|\}\}+")
# Wiki tables open with {| and close with |} at the start of a line.
_TABLE_EDGE = re.compile(r"^[ \t:]*+(\{\||\|\})", re.MULTILINE)
_LINK_EDGE = re.compile(r"\[\[|\]\]")
# A link whose title starts with a namespace or interwiki prefix (File:, Category:,
# fr:, wikt: ...): dropped, with everything inside it (captions with nested links).
# The same test as wiki._is_dropped_link, on the raw text.
_DROPPED_LINK = re.compile(r"\[\[[^\S\n]*+[A-Za-z][A-Za-z\-]{1,11}:")
# [[title]] -> title, [[title|text]] -> text (no brackets inside: nested ones are gone).
_LINK = re.compile(r"\[\[([^\[\]|\n]*+)(?:\|([^\[\]\n]*+))?\]\]")
# [http://x.org text] -> text, [http://x.org] -> nothing; bare URLs stay, as in the parser.
# The blanks after the URL are possessive: the text's class holds blanks too, and
# "[^\S\n]+([^\[\]\n]*)" tried every split of a run of blanks (quadratic).
_EXTERNAL_LINK = re.compile(
    r"\[(?:(?:https?|ftps?|sftp|irc|ircs|news|nntp|gopher|svn|git|ssh|telnet|mms)://|//|mailto:)[^\s\[\]]*+"
    r"(?:[^\S\n]++([^\[\]\n]*+))?\]",
    re.IGNORECASE,
)
# A line starting with "=": maybe a heading (= Heading = ... ====== Heading ======),
# which _heading decides.
_EQUALS_LINE = re.compile(r"^=[^\n]*", re.MULTILINE)
_HORIZONTAL_RULE = re.compile(r"^-{4,}", re.MULTILINE)
# Formatting tags whose contents are prose: the tags go, the text stays.
_KEPT_TAG = re.compile(
    r"</?(?:abbr|b|bdi|bdo|big|blockquote|br|caption|center|cite|data|dd|del|dfn|div|dl|dt|em|font|"
    r"h[1-6]|hr|i|includeonly|ins|kbd|li|mark|noinclude|nowiki|ol|onlyinclude|p|poem|q|rp|rt|ruby|"
    r"s|samp|section|small|span|strike|strong|sub|sup|templatestyles|time|tt|u|ul|var|wbr)\b[^<>]*+>",
    re.IGNORECASE,
)
# Named and numeric character references, decoded as the parser does (with the ";").
_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")


def _without(text: str, spans) -> str:
    """``text`` minus the ``(start, end)`` spans; a span inside an earlier one is already gone."""
    if not spans:
        return text
    spans.sort()
    out = []
    pos = 0
    for start, end in spans:
        if start < pos:
            continue
        out.append(text[pos:start])
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _drop_comments(text: str) -> str:
    """<!-- ... -->; an unclosed comment hides the rest of the page, as in MediaWiki."""
    out = []
    pos = 0
    while True:
        start = text.find("<!--", pos)
        if start < 0:
            out.append(text[pos:])
            return "".join(out)
        out.append(text[pos:start])
        end = text.find("-->", start + 4)
        if end < 0:
            return "".join(out)
        pos = end + 3


def _drop_templates(text: str) -> str:
    """Every {{...}} / {{{...}}} with what it holds, paired by brace count.

    Each run of opening braces waits on a stack; a run of closing braces closes
    the innermost open runs brace by brace (``{{a|{{{b}}}}}``: 2 + 3 opened, 5
    closed). An opening run nothing closes stays as text (its line is then
    dropped by the markup check), without swallowing the templates after it.
    """
    spans = []
    stack = []  # [start, braces still open]
    for m in _BRACES.finditer(text):
        n = m.end() - m.start()
        if text[m.start()] == "{":
            stack.append([m.start(), n])
            continue
        pos = m.start()
        while n and stack:
            top = stack[-1]
            k = min(top[1], n)
            top[1] -= k
            n -= k
            pos += k
            if top[1] < 2:  # closed (a single brace left over stays as text)
                stack.pop()
                spans.append((top[0] + top[1], pos))
    return _without(text, spans)


def _drop_tags(text: str) -> str:
    """<ref>...</ref>, <ref name=x/>, <math>...</math>, <table>...</table> ...: paired
    per tag name (so a stray </ref> cannot end a <math>); unclosed ones stay."""
    spans = []
    open_tags = {}
    for m in _DROP_TAG.finditer(text):
        closing, name, self_closing = m.group(1), m.group(2).lower(), m.group(3).endswith("/")
        if closing:
            if open_tags.get(name):
                spans.append((open_tags[name].pop(), m.end()))
        elif self_closing:
            spans.append((m.start(), m.end()))
        else:
            open_tags.setdefault(name, []).append(m.start())
    return _without(text, spans)


def _drop_tables(text: str) -> str:
    spans = []
    stack = []
    for m in _TABLE_EDGE.finditer(text):
        if m.group(1) == "{|":
            stack.append(m.start(1))
        elif stack:
            spans.append((stack.pop(), m.end()))
    return _without(text, spans)


def _heading(line: str) -> Optional[Tuple[int, str]]:
    """(level, title) of a heading line, or None: what the pattern
    ``^(=+)[ \\t]*(.*?)[ \\t]*(=+)[ \\t]*$`` reads, with str methods.

    The level is the shorter of the two "=" runs; a line of "=" only is level 1
    (the pattern leaves one "=" to the closing run). By hand because that
    pattern backtracks through every split of a run of "=" or of blanks between
    its three groups: cubic on a line of "=" (10 KB of them took an hour).
    """
    body = line.rstrip(" \t")
    if len(body) < 2 or body[0] != "=" or body[-1] != "=":
        return None
    inner = body.strip("=")
    if not inner:
        return 1, ""
    opening = len(body) - len(body.lstrip("="))
    closing = len(body) - len(body.rstrip("="))
    return min(opening, closing), inner.strip(" \t")


def _drop_sections(text: str) -> str:
    """Every heading line, and the level-2 sections titled in wiki._DROP_SECTIONS
    (to the next heading of level 1 or 2, subsections included)."""
    out = []
    pos = 0
    dropping = False
    for m in _EQUALS_LINE.finditer(text):
        heading = _heading(m.group())
        if heading is None:
            continue
        if not dropping:
            out.append(text[pos : m.start()])
        pos = m.end()
        level, title = heading
        if level <= 2:
            dropping = level == 2 and title.strip().lower() in wiki._DROP_SECTIONS
    if not dropping:
        out.append(text[pos:])
    return "".join(out)


def _drop_prefixed_links(text: str) -> str:
    """[[File:...]], [[Category:...]], [[fr:...]] ... with everything inside."""
    spans = []
    stack = []
    for m in _LINK_EDGE.finditer(text):
        if m.group() == "[[":
            stack.append(m.start())
        elif stack:
            start = stack.pop()
            if _DROPPED_LINK.match(text, start):
                spans.append((start, m.end()))
    return _without(text, spans)


def _link_text(m) -> str:
    return m.group(2) or m.group(1)


def clean_wikitext(text: str) -> List[str]:
    """Article wikitext -> list of plain-text paragraphs (headings and non-prose dropped)."""
    if "<!--" in text:
        text = _drop_comments(text)
    text = _BOLD_ITALIC.sub("", text)
    # Templates before tags: a template can hold broken tag markup, and a <ref>
    # usually holds a template.
    if "{{" in text:
        text = _drop_templates(text)
    if "<" in text:
        text = _drop_tags(text)
    if "{|" in text:
        text = _drop_tables(text)
    text = _drop_sections(text)
    text = _HORIZONTAL_RULE.sub("", text)
    # External links first: in "[[File:x|a [http://y.org b]]]" the first "]" is theirs.
    if "[" in text:
        text = _EXTERNAL_LINK.sub(lambda m: m.group(1) or "", text)
    if "[[" in text:
        text = _LINK.sub(_link_text, _drop_prefixed_links(text))
    if "<" in text:
        text = _KEPT_TAG.sub("", text)
    if "&" in text:
        text = _ENTITY.sub(lambda m: html.unescape(m.group()), text)
    return wiki.tidy_paragraphs(text)
