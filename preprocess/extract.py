"""Extract stage: every input -> one normalised corpus file.

Output format (fairseq's convention): one sentence (``--line-unit sentence``,
the default) or one paragraph (``--line-unit paragraph``) per line, one blank
line between documents, no blank line at the start or end. A paragraph is a
cleaned wiki line, a non-blank line of a book or a line of a --text corpus;
its sentences joined by one space give back the normalised paragraph. Inputs are read in the
order --wiki..., --books..., --text...; documents that normalise to nothing are
dropped (and counted), never written as empty documents.
"""

from typing import Any, Dict, Sequence, Tuple

from tqdm import tqdm

from . import text as textmod
from . import wiki, wiki_scanner
from .parallel import ordered_imap

# --wiki-cleaner: the default scanner, or the mwparserfromhell tree (builds made
# before the scanner existed used the parser)
WIKI_CLEANERS = {"scanner": wiki_scanner.clean_wikitext, "parser": wiki.clean_wikitext}

# A task is a batch of segments of about this many characters: big enough to
# amortise pickling, small enough to balance uneven article sizes across
# workers and keep the few tasks in flight per worker at a few MB.
_TASK_CHARS = 64 * 1024
_MAX_SEGMENT_LINES = 4096


def _process_task(task):
    """Worker: [(kind, starts_doc, payload)] -> ([(starts_doc, normalised lines)], counters)."""
    options, segments = task
    line_unit = options.get("line_unit", "sentence")
    clean_wikitext = WIKI_CLEANERS[options.get("wiki_cleaner", "scanner")]
    out = []
    paragraphs = kept_whole = 0
    for kind, starts_doc, payload in segments:
        raw_lines = clean_wikitext(payload) if kind == "wiki" else payload
        lines = []
        for raw in raw_lines:
            para, whole = textmod.paragraph_lines(
                raw, lowercase=options["lowercase"], nfkc=options["nfkc"], line_unit=line_unit
            )
            if para:
                paragraphs += 1
                kept_whole += whole
                lines.extend(para)
        out.append((starts_doc, lines))
    return out, {"paragraphs": paragraphs, "paragraphs_kept_whole": kept_whole}


def _segments(sources, skip_bad, stats):
    """(kind, starts_doc, payload) for every input, in order, streaming."""
    for kind, path in sources:
        source_stats = stats.setdefault(str(path), {"kind": kind})
        if kind == "wiki":
            for page in wiki.iter_pages(path, source_stats):
                yield "wiki", True, page
        elif kind == "books":
            for book in textmod.book_files(path):
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
    return len(payload) if kind == "wiki" else sum(len(line) for line in payload)


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

    ``options``: {"lowercase", "nfkc", "line_unit", "wiki_cleaner"} ("line_unit"
    defaults to "sentence", "wiki_cleaner" to "scanner"). Returns {"documents", "paragraphs", "lines", "bytes",
    "empty_documents_dropped", "paragraphs_kept_whole"}.
    """
    tasks = ((options, batch) for batch in _batches(_segments(sources, skip_bad, stats)))
    docs = lines_written = nbytes = dropped = 0
    counters = {"paragraphs": 0, "paragraphs_kept_whole": 0}
    doc_has_text = False  # does the document being written have a line yet?
    started = False  # have we seen any segment yet?
    with open(out_path, "w", encoding="utf-8", newline="\n") as out, tqdm(
        desc="extract", unit=" docs", disable=None
    ) as bar:
        for results, task_counters in ordered_imap(_process_task, tasks, workers):
            for k, v in task_counters.items():
                counters[k] += v
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
