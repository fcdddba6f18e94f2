"""The parser cleaner (``--wiki-cleaner parser``, :func:`preprocess.wiki.clean_wikitext`) gives
exactly what the straightforward use of mwparserfromhell gives (parse the whole tree, then
``Wikicode.remove`` node by node): on hand-written markup that exercises every removal rule and
on real articles of the shared dump sample."""

import bz2
import os
import re
from pathlib import Path

import mwparserfromhell
import pytest

from preprocess import wiki

# beside the repo, as in test_preprocess.py; WIKI_SAMPLE=... points elsewhere (e.g. from a git worktree)
WIKI_SAMPLE = Path(
    os.environ.get("WIKI_SAMPLE")
    or Path(__file__).resolve().parents[2] / "shared" / "data" / "enwiki-sample-206-pages.xml.bz2"
)


def _remove(code, node):
    try:
        code.remove(node)
    except ValueError:
        pass


def reference_paragraphs(text):
    """preprocess.wiki.clean_wikitext as it was written first (slow, obviously right)."""
    code = mwparserfromhell.parse(text)
    for section in code.get_sections(levels=[2], include_headings=True):
        headings = section.filter_headings(recursive=False)
        if headings and headings[0].title.strip_code().strip().lower() in wiki._DROP_SECTIONS:
            _remove(code, section)
    for node in code.filter_templates(recursive=False):
        _remove(code, node)
    for node in code.filter_tags(recursive=True):
        if str(node.tag).strip().lower() in wiki._DROP_TAGS:
            _remove(code, node)
    for node in code.filter_wikilinks(recursive=True):
        title = str(node.title).strip().lower()
        if title.startswith(wiki._DROP_LINK_PREFIXES) or (
            wiki._INTERWIKI.match(title) and not title.startswith(":") and " " not in title.split(":", 1)[0]
        ):
            _remove(code, node)
    for node in code.filter_headings(recursive=False):
        _remove(code, node)
    for node in code.filter_templates(recursive=True):
        _remove(code, node)
    plain = code.strip_code(normalize=True, collapse=True, keep_template_params=False)
    out = []
    for line in plain.split("\n"):
        for pattern, repl in (
            (wiki._MAGIC_WORD, ""),
            (wiki._STRAY_TAG, ""),
            (wiki._EMPTY_PARENS, ""),
            (wiki._PAREN_LEAD_PUNCT, "("),
            (wiki._SPACE_BEFORE_PUNCT, r"\1"),
        ):
            line = pattern.sub(repl, line)
        line = line.strip(" \t*#:;")
        if line and not any(tok in line for tok in wiki._MARKUP_LEFTOVER):
            out.append(line)
    return out


# Every rule, and the places where the order of the rules matters.
HAND_WRITTEN = [
    "'''Alpha''' is a [[letter]] {{citation needed}}.<ref>A source.</ref> More.<ref name=x/>\n",
    "{{Infobox|name={{nested|a}}|map=[[File:x.png]]}}\n'''B''' is ''big''{{sfn|X|2001}}.\n",
    "Text <REF group=n>up{{cite|x}}</REF> and <Ref>mixed</Ref> case.\n",
    "''Italic <ref>inside</ref> tag'' and a link [[Foo|text {{lang|fr|bar}}]] here.\n",
    "[[{{ns}}File:odd.png|a template in a link title]] and [[fr:Titre]] and [[:fr:Titre|kept]].\n",
    "[[File:Alpha.png|thumb|An alpha with a [[nested link]]]] after [[Category:Letters]].\n",
    "== Notes<ref>x</ref> ==\nnotes text\n== History ==\nIt came from [[Phoenicia|the Phoenicians]].\n",
    '{| class="wikitable"\n|-\n| cell || {{tpl}} <ref>r</ref>\n|}\nafter the table\n',
    "<math>x^2</math> is <code>code</code>; <gallery>\nA.jpg|c\n</gallery> __NOTOC__\n",
    "Unclosed {{template and <ref>ref and [[link\nnext line\n",
    "<!-- a comment {{x}} --> visible <nowiki>{{not a template}}</nowiki> text\n",
    "Born ({{birth date|1950|1|1}}; died 2000) here.\n=== Sub ===\nsub text\n",
    "Lead.\n== See also ==\n* [[Other]]\n=== Deeper ===\nstill dropped\n== Career ==\nkept\n",
    "<div>{{tpl}} div text <ref>r</ref></div> <span>{{tpl|<ref>in tpl</ref>}}</span>\n",
    "<ref>outer <ref>inner</ref> rest</ref> tail <br> line <br/> end\n== References ==\n{{reflist}}\n",
    "{{a}}{{b}}{{{arg|default}}} text {{c|{{d}}}} <references/> end\n",
]


@pytest.mark.parametrize("index", range(len(HAND_WRITTEN)))
def test_fast_cleaner_equals_reference_on_hand_written_markup(index):
    text = HAND_WRITTEN[index]
    assert wiki.clean_wikitext(text) == reference_paragraphs(text)


def test_fast_cleaner_equals_reference_on_real_articles():
    if not WIKI_SAMPLE.exists():
        pytest.skip(f"{WIKI_SAMPLE} not found")
    pages = list(wiki.iter_pages(WIKI_SAMPLE, {}))
    # every 13th article (8 of them, ~0.4 MB of wikitext): the test stays a few seconds
    picked = pages[::13]
    assert len(picked) >= 8
    for page in picked:
        assert wiki.clean_wikitext(page) == reference_paragraphs(page)


def test_skipping_builder_drops_what_it_should_and_nothing_else():
    code = wiki._parse("a {{t|x}} b <ref>r</ref> c ''<ref>in italics</ref>'' <gallery>g</gallery> d")
    assert not code.filter_templates() and "r</ref>" not in str(code)
    # a dropped tag below top level is built (the cleaner removes it later)
    assert [str(t.tag) for t in code.filter_tags()] == ["i", "ref"]
    assert re.sub(r"\s+", " ", str(code)) == "a b c ''<ref>in italics</ref>'' d"


def test_synthetic_dump_pages_clean_the_same(tmp_path):
    """Through the reader too: a bz2 dump made of the hand-written pages."""
    from test_preprocess import mediawiki_xml

    dump = tmp_path / "wiki.xml.bz2"
    pages = [(f"P{i}", 0, text) for i, text in enumerate(HAND_WRITTEN)]
    dump.write_bytes(bz2.compress(mediawiki_xml(pages)))
    for text in wiki.iter_pages(dump, {}):
        assert wiki.clean_wikitext(text) == reference_paragraphs(text)
