"""Wiki cleaning never hangs (issue 21, defect 1): every pattern of both cleaners runs in linear
time on any input, and a page whose cleaning still takes too long is skipped, named and counted.

Linear growth: each input class (a run of one character every pattern quantifies, in the shape
that made a pattern backtrack) goes through the whole ``clean_wikitext`` of both cleaners, and
the normalisation's patterns through ``normalize_line``, at n and 8n: linear time is ~8x, a
quadratic step 64x, the old heading pattern 512x. CPU time of this thread, the least of a few
runs, with the garbage collector off: the machine may be busy with other work. A super-linear
run is cut by the page budget itself, so a failure is quick too.

The budget (preprocess.extract): a signal interrupts Python, the ``re`` engine and
mwparserfromhell's tokenizer; where the tokenizer cannot be interrupted or crashes (a segfault:
its worker's faulthandler then prints "Fatal Python error", as expected), the worker process
ends and the page is found by running its task again, alone and page by page.
"""

import bz2
import gc
import math
import os
import re
import signal
import time

import pytest
from test_preprocess import mediawiki_xml

from preprocess import build as build_mod
from preprocess import extract as extract_mod
from preprocess import text as textmod
from preprocess import wiki, wiki_scanner
from preprocess.parallel import WorkerDied, ordered_imap

# Each class: a function of n giving the adversarial text. Which patterns each one aims at:
# _HEADING (now read by hand) "=" runs, blanks and tabs; _EXTERNAL_LINK / _LINK / _DROPPED_LINK
# "[", blanks, "|"; _DROP_TAG / _KEPT_TAG / _STRAY_TAG "<", blanks, "/"; _TABLE_EDGE blanks,
# ":"; _BRACES "{" "}"; _BOLD_ITALIC "'"; _ENTITY "&"; _MAGIC_WORD "_"; the tidy patterns "(",
# punctuation and blanks; _HORIZONTAL_RULE "-"; comments "<!--".
SHAPES = {
    "equals": lambda n: "=" * n,
    "equals then x": lambda n: "=" * n + "x",
    "equals then x, lines": lambda n: ("=" * 64 + "x\n") * (n // 64),
    "equals blanks x": lambda n: "=" + " " * n + "x",
    "equals tabs x": lambda n: "=" + "\t" * n + "x",
    "equals blanks equals x": lambda n: "=" + " " * n + "= x",
    "equals blank runs": lambda n: "=" + " =" * n + "x",
    "heading with blanks": lambda n: "== a" + " " * n + "b ==",
    "heading title then blanks": lambda n: "= x" + " " * n + "y",
    "equals x runs": lambda n: "= x" * n,
    "external link blanks": lambda n: "[http://a" + " " * n,
    "external link tabs": lambda n: "[http://a" + "\t" * n,
    "external link blanks x": lambda n: "[http://a" + " " * n + "x",
    "external links unclosed": lambda n: "[http://a.org " * n,
    "external link long url": lambda n: "[http://" + "a" * n,
    "brackets": lambda n: "[" * n,
    "link opens": lambda n: "[[" * n,
    "link opens then x": lambda n: "[[" * n + "x",
    "links unclosed": lambda n: "[[a|" * n,
    "link blanks": lambda n: "[[" + " " * n + "]]",
    "link pipes": lambda n: "[[a" + "|" * n,
    "link pipe blanks": lambda n: "[[a|" + " " * n,
    "pipes": lambda n: "|" * n,
    "braces": lambda n: "{{" * n,
    "closing braces": lambda n: "}}" * n,
    "table opens": lambda n: "{|" * n,
    "table lines": lambda n: "{|\n" * n,
    "blanks then x": lambda n: " " * n + "x",
    "colons then x": lambda n: ":" * n + "x",
    "apostrophes": lambda n: "'" * n,
    "angles": lambda n: "<" * n,
    "ref blanks": lambda n: "<ref" + " " * n,
    "blanks before ref": lambda n: "<" + " " * n + "ref",
    "ref slashes": lambda n: "<ref" + "/" * n,
    "refs unclosed": lambda n: "<ref>x " * n,
    "span blanks": lambda n: "<span" + " " * n,
    "spans unclosed": lambda n: "<span " * n,
    "br slashes": lambda n: "<br" + "/" * n,
    "comments unclosed": lambda n: "<!--" * n,
    "dashes": lambda n: "-" * n,
    "ampersands": lambda n: "&" * n,
    "entity starts": lambda n: "&#" * n,
    "entity letters": lambda n: "&" + "a" * n,
    "magic word letters": lambda n: "__" + "A" * n,
    "underscores": lambda n: "_" * n,
    "parenthesis blanks": lambda n: "(" + " " * n + "x",
    "parenthesis commas": lambda n: "(" + "," * n + "x",
    "blanks before punctuation": lambda n: "a" + " " * n + "b",
}
# mwparserfromhell's own tokenizer (a library: not patched here) is super-linear on these
# (measured: 4x the input, 12-18x the time); the page budget is what stops them: its signal
# check in the tokenizer's main loop (test_budget_stops_the_parsers_slow_inputs), except
# where the quadratic loop checks none; there the worker's hard stop ends its process.
PARSER_SUPERLINEAR = {
    "external links unclosed",
    "links unclosed",
    "table lines",
    "comments unclosed",
    "refs unclosed",
    "spans unclosed",
}
PARSER_UNINTERRUPTIBLE = {"spans unclosed"}
# Linear in time, but a C stack overflow (a segfault) from ~100,000 units (200 KB) on, with the
# usual 8 MB stack (it depends on ``ulimit -s``: test_extract_skips_a_page_that_crashes_its_worker
# crashes on purpose instead).
PARSER_CRASHES = {"equals blank runs"}
NORMALIZE_SHAPES = {
    "blanks": lambda n: "a" + " " * n + "b",
    "mixed whitespace": lambda n: "a" + " \t\u3000\xa0\u2028" * n + "b",
    "controls": lambda n: "a" + "\x01\x85 " * n + "b",
}
CLEANERS = {"scanner": wiki_scanner.clean_wikitext, "parser": wiki.clean_wikitext}

GROWTH_BOUND = 24  # allowed time(8n) / time(n): linear is ~8, quadratic 64
FLOOR = 0.0015  # seconds: a time(n) below this is too small to divide by


def _cpu_seconds(fn, text, cap):
    """CPU seconds of ``fn(text)`` in this thread; inf when it goes over ``cap`` (cut there)."""
    start = time.thread_time()
    with extract_mod._page_budgets(cap):
        done = extract_mod._within_budget(cap, lambda: (fn(text),))
    return math.inf if done is None else time.thread_time() - start


def assert_linear(fn, make):
    """time(8n) / time(n) < GROWTH_BOUND, n doubled until time(n) is 3-6 ms (8n: 25-50 ms)."""
    gc.disable()
    try:
        n = 256
        while _cpu_seconds(fn, make(n), 10) < 2 * FLOOR and len(make(n)) < 1 << 20:
            n *= 2
        t1 = min(_cpu_seconds(fn, make(n), 10) for _ in range(3))
        bound = GROWTH_BOUND * max(t1, FLOOR)
        times = []
        for _ in range(3):  # a busy machine can slow one run down; a super-linear one is slow every time
            times.append(_cpu_seconds(fn, make(8 * n), 2 * bound))
            if times[-1] <= bound or times[-1] == math.inf:
                break
        t8 = min(times)
        assert t8 <= bound, f"n={n}: {t1 * 1e3:.1f} ms, 8n: {t8 * 1e3:.1f} ms ({t8 / t1:.0f}x)"
    finally:
        gc.enable()


@pytest.mark.parametrize(
    "cleaner, shape",
    [(c, s) for c in CLEANERS for s in SHAPES if not (c == "parser" and s in PARSER_SUPERLINEAR)],
)
def test_cleaning_time_grows_linearly(cleaner, shape):
    assert_linear(CLEANERS[cleaner], SHAPES[shape])


@pytest.mark.parametrize("shape", sorted(NORMALIZE_SHAPES))
def test_normalisation_time_grows_linearly(shape):
    assert_linear(textmod.normalize_line, NORMALIZE_SHAPES[shape])


def test_tidy_patterns_time_grows_linearly_on_the_shapes_the_parser_cannot_reach():
    """The parser's own steps after its tokenizer: tidy_paragraphs on the raw text."""
    for shape in sorted(PARSER_SUPERLINEAR):
        assert_linear(wiki.tidy_paragraphs, SHAPES[shape])


# ---- the per-page budget ----------------------------------------------------------------------

# The heading pattern before this issue: cubic in a run of "=" (this one would take hours).
OLD_HEADING = re.compile(r"^(=+)[ \t]*(.*?)[ \t]*(=+)[ \t]*$", re.MULTILINE)
HANGS_THE_REGEX_ENGINE = "=" * 20_000 + "x"
# mwparserfromhell's tokenizer: quadratic in the number of unclosed table lines (minutes)
SLOW_FOR_THE_PARSER = SHAPES["table lines"](40_000)
# ... quadratic in a loop where it checks no signal (10,000 spans: minutes)
STUCK_FOR_THE_PARSER = SHAPES[min(PARSER_UNINTERRUPTIBLE)](10_000)


def _spin(text):
    while True:
        pass


@pytest.mark.parametrize("what", ["python", "regex engine", "parser tokenizer", "parser cleaner"])
def test_budget_interrupts_python_the_regex_engine_and_the_parser(what):
    fn, text = {
        "python": (_spin, ""),
        "regex engine": (OLD_HEADING.search, HANGS_THE_REGEX_ENGINE),
        "parser tokenizer": (wiki._parse, SLOW_FOR_THE_PARSER),
        "parser cleaner": (wiki.clean_wikitext, SLOW_FOR_THE_PARSER),
    }[what]
    before = signal.getsignal(signal.SIGVTALRM)
    start = time.perf_counter()
    with extract_mod._page_budgets(0.1):
        assert extract_mod._within_budget(0.1, lambda: (fn(text),)) is None
        # the next page gets its own budget: a finished one is not cut
        assert extract_mod._within_budget(0.1, lambda: wiki.clean_wikitext("== a ==\nb")) == ["b"]
    assert time.perf_counter() - start < 5  # 0.1 s of CPU time; the machine may be busy
    assert signal.getsignal(signal.SIGVTALRM) == before
    assert signal.getitimer(signal.ITIMER_VIRTUAL) == (0.0, 0.0)


def test_budget_stops_the_parsers_slow_inputs():
    """The classes of PARSER_SUPERLINEAR that the signal reaches, big enough to take minutes."""
    for shape in sorted(PARSER_SUPERLINEAR - PARSER_UNINTERRUPTIBLE):
        text = SHAPES[shape](200_000)
        start = time.thread_time()
        with extract_mod._page_budgets(0.05):
            assert extract_mod._within_budget(0.05, wiki.clean_wikitext, text) is None, shape
        assert time.thread_time() - start < 1, shape


def _dies_on(x):
    if x == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


@pytest.mark.timeout(120)  # a hang is the failure this test looks for
def test_a_dead_worker_is_an_error_not_a_hang():
    """multiprocessing.Pool would wait for the lost result forever."""
    got = []
    with pytest.raises(WorkerDied) as died:
        for x in ordered_imap(_dies_on, range(40), 2, inflight_per_worker=2):
            got.append(x)
    assert got == list(range(len(got))) and 5 in died.value.items
    assert died.value.items == list(range(len(got), len(got) + len(died.value.items)))


# ---- the budget through extraction and the build ----------------------------------------------

ALPHA = ("Alpha", 0, "'''Alpha''' is the first letter of the Greek alphabet.\n")
BETA = ("Beta", 0, "Beta is the second letter. It comes after alpha.\n")
CORPUS = "alpha is the first letter of the greek alphabet.\n\nbeta is the second letter.\nit comes after alpha.\n"


def _dump(tmp_path, pages):
    dump = tmp_path / "wiki.xml.bz2"
    dump.write_bytes(bz2.compress(mediawiki_xml(pages)))
    return dump


def _extract(tmp_path, dump, cleaner, workers, seconds=0.1):
    out, stats = tmp_path / "corpus.txt", {}
    options = {"lowercase": True, "nfkc": True, "wiki_cleaner": cleaner, "wiki_page_seconds": seconds}
    totals = extract_mod.extract([("wiki", dump)], out, options, workers, False, stats)
    return out.read_text(encoding="utf-8"), totals, stats[str(dump)]


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "page" in r.getMessage()]


def _spinning_scanner(text):
    """The default cleaner, stuck as the old one was on a run of "=" (hours)."""
    if "Spin" in text:
        OLD_HEADING.search(HANGS_THE_REGEX_ENGINE)
    return wiki_scanner.clean_wikitext(text)


@pytest.mark.parametrize("workers", [1, 2])
def test_extract_skips_names_and_counts_a_page_over_budget(tmp_path, caplog, monkeypatch, workers):
    """A monkeypatched slow cleaner (worker processes are forked: they have the patch)."""
    monkeypatch.setitem(extract_mod.WIKI_CLEANERS, "scanner", _spinning_scanner)
    caplog.set_level("WARNING", logger="preprocess")
    dump = _dump(tmp_path, [ALPHA, ("Slow page", 0, "Spin."), BETA])
    corpus, totals, source = _extract(tmp_path, dump, "scanner", workers)
    assert corpus == CORPUS
    assert totals["documents"] == 2 and totals["empty_documents_dropped"] == 0
    assert source["articles"] == 3 and source["pages_skipped"] == 1
    assert source["pages_skipped_titles"] == ["Slow page"] and source["page_budget_cpu_seconds"] == 0.1
    (warning,) = _warnings(caplog)
    assert warning.startswith(f"{dump}: page 'Slow page' took over 0.1 CPU seconds")


@pytest.mark.timeout(120)  # a hang is the failure this test looks for
def test_extract_skips_the_page_the_parser_is_stuck_on(tmp_path, caplog):
    """Real pages: mwparserfromhell stuck where no signal reaches it (the worker's hard stop
    ends it, the page is found by running its task again), and one the signal stops."""
    caplog.set_level("WARNING", logger="preprocess")
    dump = _dump(tmp_path, [ALPHA, ("Stuck", 0, STUCK_FOR_THE_PARSER), ("Slow", 0, SLOW_FOR_THE_PARSER), BETA])
    start = time.perf_counter()
    corpus, totals, source = _extract(tmp_path, dump, "parser", 2)
    assert corpus == CORPUS and totals["documents"] == 2
    assert source["pages_skipped"] == 2 and source["pages_skipped_titles"] == ["Stuck", "Slow"]
    warnings = _warnings(caplog)
    assert len(warnings) == 2
    assert warnings[0].startswith(f"{dump}: page 'Stuck' ended its cleaning process")
    assert warnings[1].startswith(f"{dump}: page 'Slow' took over 0.1 CPU seconds")
    assert time.perf_counter() - start < 60  # minutes without the budget; the machine may be busy


def _crashing_scanner(text):
    if "Crash" in text:
        os.kill(os.getpid(), signal.SIGSEGV)
    return wiki_scanner.clean_wikitext(text)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2])
def test_extract_skips_a_page_that_crashes_its_worker(tmp_path, caplog, monkeypatch, workers):
    """As mwparserfromhell does on PARSER_CRASHES; its other tasks' pages all come out."""
    monkeypatch.setitem(extract_mod.WIKI_CLEANERS, "scanner", _crashing_scanner)
    caplog.set_level("WARNING", logger="preprocess")
    filler = [(f"Filler {i}", 0, f"Filler page number {i}.\n" + "x " * 40_000) for i in range(4)]
    dump = _dump(tmp_path, [ALPHA, *filler[:2], ("Crash page", 0, "Crash."), *filler[2:], BETA])
    corpus, totals, source = _extract(tmp_path, dump, "scanner", workers, seconds=30)
    assert totals["documents"] == 6
    assert corpus.startswith(CORPUS.split("\n\n")[0]) and corpus.endswith(CORPUS.split("\n\n")[1])
    assert all(f"filler page number {i}." in corpus for i in range(4))
    assert source["pages_skipped"] == 1 and source["pages_skipped_titles"] == ["Crash page"]
    assert _warnings(caplog)[-1].startswith(f"{dump}: page 'Crash page' ended its cleaning process")


def test_without_a_budget_one_worker_cleans_in_process(tmp_path):
    """--wiki-page-seconds 0: no limit, no worker process (a page is never left out)."""
    dump = _dump(tmp_path, [ALPHA, BETA])
    corpus, totals, source = _extract(tmp_path, dump, "scanner", 1, seconds=0)
    assert corpus == CORPUS and "pages_skipped" not in source


def test_build_finishes_and_records_the_skipped_page(tmp_path, capsys, caplog):
    caplog.set_level("INFO", logger="preprocess")
    dump = _dump(tmp_path, [ALPHA, ("Slow page", 0, SLOW_FOR_THE_PARSER), BETA])
    out = tmp_path / "out"
    args = ["--wiki", dump, "--out", out, "--wiki-cleaner", "parser", "--vocab-size", 300]
    args += ["--workers", 1, "--valid-docs", 0, "--test-docs", 0, "--wiki-page-seconds", 0.2]
    assert build_mod.main([str(a) for a in args]) == 0, capsys.readouterr().err
    record = build_mod.rec.load_record(out)
    stats = record["sources"][0]["stats"]
    assert stats["pages_skipped"] == 1 and stats["pages_skipped_titles"] == ["Slow page"]
    assert stats["page_budget_cpu_seconds"] == 0.2
    assert record["documents"]["documents"] == 2
    assert f"{dump}: page 'Slow page' took over 0.2 CPU seconds" in caplog.text
    # not part of the build's identity: another budget is the same build (the record says what it skipped)
    assert "wiki_page_seconds" not in record["config"]
    caplog.clear()
    args[-1] = 0.5
    assert build_mod.main([str(a) for a in args]) == 0
    assert "nothing to do" in caplog.text
