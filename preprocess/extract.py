"""Extract stage: every input -> one normalised corpus file.

Output format (fairseq's convention): one sentence (``--line-unit sentence``,
the default) or one paragraph (``--line-unit paragraph``) per line, one blank
line between documents, no blank line at the start or end. A paragraph is a
cleaned wiki line, a non-blank line of a book or a line of a --text corpus;
its sentences joined by one space give back the normalised paragraph. Inputs are read in the
order --wiki..., --books..., --text...; documents that normalise to nothing are
dropped (and counted), never written as empty documents.

A wiki page whose cleaning takes more than ``wiki_page_seconds`` of CPU time
(``--wiki-page-seconds``), or crashes its process, is skipped: logged with its
dump and title, counted and named in its source's stats (so in
``preprocess.json``). Both cleaners' own steps are linear on any input, so this
is a second line of defence, against a library: mwparserfromhell's C tokenizer
(the parser cleaner) is quadratic on some markup, in loops that do not check
for signals, and overflows the C stack on some (all measured in
tests/test_faults_wiki.py). One such page would otherwise stall or kill a
build of millions of pages without an error.

How: pages are cleaned in worker processes (even with one worker) under two
CPU timers. At ``seconds`` a signal handler raises into the cleaning (Python
code, the ``re`` engine and most of the tokenizer check for signals); at
``2 * seconds + 0.5`` the kernel ends the process, stuck in C code. A task whose
worker died is run again alone, then page by page, and the page that ends its
process again is the one skipped.
"""

import contextlib
import logging
import multiprocessing
import signal
from typing import Any, Dict, Iterable, Iterator, List, Sequence, Tuple

from tqdm import tqdm

from . import text as textmod
from . import wiki, wiki_scanner
from .inputs import book_files
from .parallel import WorkerDied, ordered_imap

# --wiki-cleaner: the default scanner, or the mwparserfromhell tree (builds made
# before the scanner existed used the parser)
WIKI_CLEANERS = {"scanner": wiki_scanner.clean_wikitext, "parser": wiki.clean_wikitext}
# CPU seconds one wiki page may take (cleaning and normalising), 0 for no limit.
# Real pages take well under a second with either cleaner.
DEFAULT_PAGE_SECONDS = 30.0
# Titles of the skipped pages named in the stats of one dump (all are logged).
_TITLES_RECORDED = 100

logger = logging.getLogger("preprocess")

# A task is a batch of segments of about this many characters: big enough to
# amortise pickling, small enough to balance uneven article sizes across
# workers and keep the few tasks in flight per worker at a few MB.
_TASK_CHARS = 64 * 1024
_MAX_SEGMENT_LINES = 4096


class _OverBudget(BaseException):
    """Raised into a page's cleaning when its CPU time is spent. A BaseException,
    like KeyboardInterrupt, so that no ``except Exception`` on the way (in a
    cleaner or a library) can swallow it."""


_armed = False  # is a page's budget running (a late signal after it is ignored)?
_hard_stop = False  # may a page stuck in C code end this process (a pool worker)?


def _hard_stop_seconds(seconds: float) -> float:
    """When a page the signal did not stop ends its process: well after the budget, which a
    page that checks for signals never reaches, and at least half a second past it."""
    return 2 * seconds + 0.5


def _budget_spent(signum, frame):
    if _armed:
        raise _OverBudget


@contextlib.contextmanager
def _page_budgets(seconds: float, hard_stop: bool = False) -> Iterator[None]:
    """Let :func:`_within_budget` stop a page while the block runs.

    The budget is CPU time (``ITIMER_VIRTUAL``, signal SIGVTALRM, which nothing
    else here uses), not wall time: a page must not be skipped because the
    machine is busy or there are more workers than cores. Python runs the
    handler in the main thread, between bytecodes or when C code checks for
    signals (CPython's ``re`` engine does; mwparserfromhell's tokenizer in its
    main loop only), so this works in the main thread of a process.
    ``hard_stop`` (pool workers only): a page still running at twice its budget
    ends the process (``ITIMER_PROF``: SIGPROF's default action, which needs no
    Python code to run).
    """
    global _hard_stop
    if not seconds:
        yield
        return
    previous = signal.signal(signal.SIGVTALRM, _budget_spent)
    previous_prof = signal.signal(signal.SIGPROF, signal.SIG_DFL) if hard_stop else None
    _hard_stop = hard_stop
    try:
        yield
    finally:
        _hard_stop = False
        signal.signal(signal.SIGVTALRM, previous)
        if hard_stop:
            signal.signal(signal.SIGPROF, previous_prof)


def _within_budget(seconds: float, func, *args):
    """``func(*args)``, or None when it took more than ``seconds`` of CPU time (0: no limit)."""
    global _armed
    if not seconds:
        return func(*args)
    try:
        _armed = True
        signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
        if _hard_stop:
            signal.setitimer(signal.ITIMER_PROF, _hard_stop_seconds(seconds))
        try:
            return func(*args)
        finally:
            _armed = False
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
            if _hard_stop:
                signal.setitimer(signal.ITIMER_PROF, 0)
    except _OverBudget:
        _armed = False
        return None


def _normalised(raw_lines, options) -> Tuple[List[str], int, int]:
    """Raw paragraphs -> (output lines, paragraphs kept, paragraphs kept whole)."""
    line_unit = options.get("line_unit", "sentence")
    lines = []
    paragraphs = kept_whole = 0
    for raw in raw_lines:
        para, whole = textmod.paragraph_lines(
            raw, lowercase=options["lowercase"], nfkc=options["nfkc"], line_unit=line_unit
        )
        if para:
            paragraphs += 1
            kept_whole += whole
            lines.extend(para)
    return lines, paragraphs, kept_whole


def _clean_page(clean_wikitext, page, options):
    return _normalised(clean_wikitext(page), options)


def _page_seconds(options) -> float:
    return options.get("wiki_page_seconds", DEFAULT_PAGE_SECONDS)


def _process_task(task):
    """Worker: [(kind, starts_doc, payload)] -> ([(starts_doc, normalised lines)], counters,
    [(source, title, why) of each page left out of the output])."""
    options, segments = task
    clean_wikitext = WIKI_CLEANERS[options.get("wiki_cleaner", "scanner")]
    seconds = _page_seconds(options)
    out = []
    skipped = []
    paragraphs = kept_whole = 0
    has_pages = any(kind == "wiki" for kind, _, _ in segments)
    with _page_budgets(seconds if has_pages else 0, hard_stop=multiprocessing.parent_process() is not None):
        for kind, starts_doc, payload in segments:
            if kind == "wiki":
                source, title, page = payload
                result = _within_budget(seconds, _clean_page, clean_wikitext, page, options)
                if result is None:
                    skipped.append((source, title, "slow"))
                    continue
            else:
                result = _normalised(payload, options)
            lines, n, whole = result
            paragraphs += n
            kept_whole += whole
            out.append((starts_doc, lines))
    return out, {"paragraphs": paragraphs, "paragraphs_kept_whole": kept_whole}, skipped


def _alone(task):
    """The result of ``task`` run in a process of its own; WorkerDied if that process dies too."""
    (result,) = ordered_imap(_process_task, [task], 1, own_process=True)
    return result


def _run_again(task):
    """A task whose worker died, run again alone; if its process dies again, page by
    page, leaving out each page that ends its own process too (it crashed the
    cleaner, or was stuck past the budget in code no signal reaches)."""
    try:
        return _alone(task)
    except WorkerDied:
        pass
    options, segments = task
    out, skipped = [], []
    counters = {"paragraphs": 0, "paragraphs_kept_whole": 0}
    for kind, starts_doc, payload in segments:
        try:
            part, part_counters, part_skipped = _alone((options, [(kind, starts_doc, payload)]))
        except WorkerDied:
            if kind != "wiki":  # text is only normalised: not a page's fault
                raise
            skipped.append((payload[0], payload[1], "died"))
            continue
        out += part
        skipped += part_skipped
        for k, v in part_counters.items():
            counters[k] += v
    return out, counters, skipped


def _results(tasks: Iterable[Any], workers: int, own_process: bool) -> Iterator[Any]:
    """``ordered_imap(_process_task, tasks)``, going on after a worker died: the tasks
    it had in flight are run again (:func:`_run_again`), the rest as before."""
    tasks = iter(tasks)
    while True:
        try:
            yield from ordered_imap(_process_task, tasks, workers, own_process=own_process)
            return
        except WorkerDied as died:
            logger.warning("a worker process died: running its %d task(s) in flight again, alone", len(died.items))
            for task in died.items:
                yield _run_again(task)


def _skip_page(source_stats: Dict[str, Any], source: str, title: str, why: str, seconds: float) -> None:
    """Report a page left out: one warning line, and the dump's stats."""
    if why == "slow":
        reason = f"took over {seconds:g} CPU seconds to clean"
    else:
        reason = f"ended its cleaning process (a crash, or over {_hard_stop_seconds(seconds):g} CPU seconds in C code)"
    logger.warning("%s: page %r %s; skipped (--wiki-page-seconds)", source, title, reason)
    source_stats["page_budget_cpu_seconds"] = seconds
    source_stats["pages_skipped"] = source_stats.get("pages_skipped", 0) + 1
    titles = source_stats.setdefault("pages_skipped_titles", [])
    if len(titles) < _TITLES_RECORDED:
        titles.append(title)


def _segments(sources, skip_bad, stats):
    """(kind, starts_doc, payload) for every input, in order, streaming."""
    for kind, path in sources:
        source_stats = stats.setdefault(str(path), {"kind": kind})
        if kind == "wiki":
            for title, page in wiki.iter_articles(path, source_stats):
                yield "wiki", True, (str(path), title, page)
        elif kind == "books":
            for book in book_files(path):
                source_stats["files"] = source_stats.get("files", 0) + 1
                for starts_doc, lines in textmod.read_book_segments(book, skip_bad, source_stats, _MAX_SEGMENT_LINES):
                    yield "text", starts_doc, lines
        elif kind == "text":
            for starts_doc, lines in textmod.read_text_segments(path, skip_bad, source_stats, _MAX_SEGMENT_LINES):
                yield "text", starts_doc, lines
        else:
            raise ValueError(kind)


def _size(segment):
    kind, _, payload = segment
    return len(payload[2]) if kind == "wiki" else sum(len(line) for line in payload)


def _batches(segments):
    batch, chars = [], 0
    for segment in segments:
        batch.append(segment)
        chars += _size(segment)
        if chars >= _TASK_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def extract(
    sources: Sequence[Tuple[str, Any]],
    out_path,
    options: Dict[str, Any],
    workers: int,
    skip_bad: bool,
    stats: Dict[str, Dict[str, Any]],
) -> Dict[str, int]:
    """Write the corpus to ``out_path``.

    ``options``: {"lowercase", "nfkc", "line_unit", "wiki_cleaner",
    "wiki_page_seconds"} ("line_unit" defaults to "sentence", "wiki_cleaner" to
    "scanner", "wiki_page_seconds" to DEFAULT_PAGE_SECONDS). Returns
    {"documents", "paragraphs", "lines", "bytes", "empty_documents_dropped",
    "paragraphs_kept_whole"}; each page left out is in its source's ``stats``.
    """
    tasks = ((options, batch) for batch in _batches(_segments(sources, skip_bad, stats)))
    seconds = _page_seconds(options)
    # a page can only be stopped for sure by ending its process
    own_process = bool(seconds) and any(kind == "wiki" for kind, _ in sources)
    docs = lines_written = nbytes = dropped = 0
    counters = {"paragraphs": 0, "paragraphs_kept_whole": 0}
    doc_has_text = False  # does the document being written have a line yet?
    started = False  # have we seen any segment yet?
    with open(out_path, "w", encoding="utf-8", newline="\n") as out, tqdm(
        desc="extract", unit=" docs", disable=None
    ) as bar:
        for results, task_counters, skipped in _results(tasks, workers, own_process):
            for k, v in task_counters.items():
                counters[k] += v
            for source, title, why in skipped:
                _skip_page(stats[source], source, title, why, seconds)
            for starts_doc, lines in results:
                if starts_doc:
                    if started and not doc_has_text:
                        dropped += 1
                    started = True
                    doc_has_text = False
                for line in lines:
                    if not doc_has_text:
                        if docs:
                            out.write("\n")
                            nbytes += 1
                        docs += 1
                        doc_has_text = True
                        bar.update(1)
                    data = line + "\n"
                    out.write(data)
                    nbytes += len(data.encode("utf-8"))
                    lines_written += 1
        if started and not doc_has_text:
            dropped += 1
    return {
        "documents": docs,
        "paragraphs": counters["paragraphs"],
        "lines": lines_written,
        "bytes": nbytes,
        "empty_documents_dropped": dropped,
        "paragraphs_kept_whole": counters["paragraphs_kept_whole"],
    }
