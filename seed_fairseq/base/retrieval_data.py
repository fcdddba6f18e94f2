"""Retrieval data: BEIR folders and MS MARCO passage TSVs.

Below the fairseq side (no fairseq, no torch), so that the pre-training task can read a
labelled dev set (``--retrieval-dev``) as the retrieval tools do.

BEIR (https://github.com/beir-cellar/beir) folder::

    corpus.jsonl        {"_id": "d1", "title": "...", "text": "..."}   (title optional)
    queries.jsonl       {"_id": "q1", "text": "..."}
    qrels/{split}.tsv   query-id <TAB> corpus-id <TAB> score   (header line optional)

MS MARCO passage folder (https://microsoft.github.io/msmarco/)::

    collection.tsv          pid <TAB> passage
    queries.{split}.tsv     qid <TAB> query          (split: train, dev, dev.small, eval, ...)
    qrels.{split}.tsv       qid <TAB> 0 <TAB> pid <TAB> relevance   (TREC qrels; whitespace also accepted)

Every malformed line raises :class:`DataFormatError`, whose message starts with
``FILE:LINE:`` so that a user can open the file at the offending line; so do
inputs that would make every result meaningless: an empty corpus or queries
file, a split with no relevant judgement, a judgement given twice, a judged
query with an empty text, judgements none of whose relevant documents is in
the corpus (some of them missing is a warning: it only lowers recall).
"""

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple


class DataFormatError(ValueError):
    """A malformed input line; ``str()`` is ``FILE:LINE: problem``."""

    def __init__(self, path, line: Optional[int], problem: str):
        self.path = str(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")


@dataclass
class RetrievalData:
    """One split of a retrieval collection; ids are strings, as in the files."""

    corpus: Dict[str, str]
    queries: Dict[str, str]
    qrels: Dict[str, Dict[str, int]]
    name: str = ""
    split: str = ""
    # qrels whose document is missing from the corpus: kept in ``qrels`` (they
    # count against recall, as in trec_eval) but unusable as training positives
    missing_docs: int = 0
    # where it came from, so that later errors (e.g. "no negatives possible")
    # can name the folder and file the user has to look at
    folder: str = ""
    corpus_path: str = ""
    qrels_path: str = ""

    def positives(self, qid: str) -> List[str]:
        return [d for d, r in self.qrels.get(qid, {}).items() if r > 0 and d in self.corpus]

    def query_ids(self) -> List[str]:
        """Queries with at least one relevant document, in file order."""
        return [q for q in self.queries if any(r > 0 for r in self.qrels.get(q, {}).values())]

    def subset(self, qids: Sequence[str]) -> "RetrievalData":
        keep = set(qids)
        return RetrievalData(
            corpus=self.corpus,
            queries={q: t for q, t in self.queries.items() if q in keep},
            qrels={q: r for q, r in self.qrels.items() if q in keep},
            name=self.name,
            split=self.split,
            missing_docs=self.missing_docs,
            folder=self.folder,
            corpus_path=self.corpus_path,
            qrels_path=self.qrels_path,
        )


def _lines(path: Path) -> Iterator[Tuple[int, str]]:
    """(line number, text without newline), skipping blank lines.

    Lines are decoded one by one so that bad UTF-8 is reported with its line.
    """
    if not path.is_file():
        # a folder or a FIFO is not read: opening a FIFO would wait forever for a writer
        raise DataFormatError(path, None, "not a regular file" if path.exists() else "file not found")
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DataFormatError(path, None, f"cannot read: {e.strerror}") from None
    with f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataFormatError(path, lineno, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
            line = line.rstrip("\r\n")
            if lineno == 1 and line.startswith("\ufeff"):
                line = line[1:]
            if line.strip():
                yield lineno, line


def _check_id(value: str, path: Path, lineno: int, what: str) -> str:
    """Ids are matched across files and written to whitespace-separated TREC
    run files: an empty id, or one with blanks in it, cannot survive that."""
    if not value:
        raise DataFormatError(path, lineno, f"empty {what} id")
    if any(c.isspace() for c in value):
        raise DataFormatError(
            path,
            lineno,
            f"{what} id {value!r} contains whitespace (TREC run and qrels files separate columns by whitespace)",
        )
    return value


def _json_id(value, path: Path, lineno: int, what: str) -> str:
    # str(None) == "None", str(1.5) == "1.5", str(True) == "True": only strings
    # and integers are ids; bool is an int subclass, so it is refused explicitly
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        kind = "null" if value is None else type(value).__name__
        raise DataFormatError(path, lineno, f"field '_id' must be a string or an integer, got {kind}")
    return _check_id(str(value), path, lineno, what)


_PLURAL = {"query": "queries"}


def _put(table: Dict[str, str], seen: Dict[str, int], key: str, value: str, path: Path, lineno: int, what: str):
    if key in seen:
        raise DataFormatError(path, lineno, f"duplicate {what} id {key!r} (first on line {seen[key]})")
    seen[key] = lineno
    table[key] = value


def _read_jsonl(path: Path, what: str, text_fields: Sequence[str]) -> Tuple[Dict[str, str], Dict[str, int]]:
    """(id -> text, id -> line number)."""
    out: Dict[str, str] = {}
    seen: Dict[str, int] = {}
    for lineno, line in _lines(path):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataFormatError(path, lineno, f"invalid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(obj, dict):
            raise DataFormatError(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
        if "_id" not in obj:
            raise DataFormatError(path, lineno, "missing field '_id'")
        if "text" not in obj:
            raise DataFormatError(path, lineno, "missing field 'text'")
        parts = []
        for name in text_fields:
            value = obj.get(name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise DataFormatError(path, lineno, f"field {name!r} must be a string, got {type(value).__name__}")
            if value.strip():
                parts.append(value.strip())
        _put(out, seen, _json_id(obj["_id"], path, lineno, what), " ".join(parts), path, lineno, what)
    if not out:
        raise DataFormatError(path, None, f"no {_PLURAL.get(what, what + 's')} in the file (it is empty)")
    return out, seen


def _read_tsv2(path: Path, what: str) -> Tuple[Dict[str, str], Dict[str, int]]:
    """``id <TAB> text`` files (MS MARCO collection and queries): (id -> text, id -> line number)."""
    out: Dict[str, str] = {}
    seen: Dict[str, int] = {}
    for lineno, line in _lines(path):
        cols = line.split("\t", 1)
        if len(cols) != 2:
            raise DataFormatError(path, lineno, f"expected 2 tab-separated columns ({what} id, text), found 1")
        key = _check_id(cols[0].strip(), path, lineno, what)
        _put(out, seen, key, cols[1].strip(), path, lineno, what)
    if not out:
        raise DataFormatError(path, None, f"no {_PLURAL.get(what, what + 's')} in the file (it is empty)")
    return out, seen


def _read_qrels(path: Path) -> Tuple[Dict[str, Dict[str, int]], Dict[str, int]]:
    """BEIR (3 columns, optional header) or TREC (4 columns) qrels.

    Returns the qrels and, for error messages, the first line of each query.
    """
    qrels: Dict[str, Dict[str, int]] = {}
    first_line: Dict[str, int] = {}
    pair_line: Dict[Tuple[str, str], int] = {}
    for lineno, line in _lines(path):
        cols = line.split("\t") if "\t" in line else line.split()
        cols = [c.strip() for c in cols]
        if len(cols) == 3:
            qid, did, rel = cols
        elif len(cols) == 4:
            qid, _, did, rel = cols
        else:
            raise DataFormatError(
                path,
                lineno,
                f"expected 3 columns (query-id, corpus-id, score) or 4 (qid, 0, docid, rel), found {len(cols)}",
            )
        if lineno == 1 and qid.lower() in ("query-id", "query_id", "qid") and not _is_int(rel):
            continue  # BEIR header "query-id corpus-id score"
        if not _is_int(rel):
            raise DataFormatError(path, lineno, f"relevance {rel!r} is not an integer")
        if not qid or not did:
            raise DataFormatError(path, lineno, "empty query or document id")
        _check_id(qid, path, lineno, "query")
        _check_id(did, path, lineno, "document")
        # a second judgement of the same pair would silently replace the first
        # (e.g. "1" then "0" drops the query from the metrics): refuse, as for ids
        if (qid, did) in pair_line:
            raise DataFormatError(
                path,
                lineno,
                f"duplicate judgement of query {qid!r} and document {did!r} (first on line {pair_line[qid, did]})",
            )
        pair_line[qid, did] = lineno
        qrels.setdefault(qid, {})[did] = int(rel)
        first_line.setdefault(qid, lineno)
    return qrels, first_line


def _is_int(s: str) -> bool:
    try:
        int(s)
        return True
    except ValueError:
        return False


def _load(folder: Path, split: str, corpus_path: Path, queries_path: Path, qrels_path: Path, read) -> RetrievalData:
    """One split, read and checked as a whole; ``read(path, what)`` is the format's
    reader of the corpus and the queries (-> id -> text, id -> line number)."""
    corpus, _ = read(corpus_path, "document")
    queries, query_lines = read(queries_path, "query")
    qrels, first_line = _read_qrels(qrels_path)
    for qid in qrels:
        if qid not in queries:
            raise DataFormatError(qrels_path, first_line[qid], f"query id {qid!r} is not in the queries file")
        # an empty query retrieves an arbitrary ranking: its metrics would be noise, its training pairs too
        if not queries[qid]:
            raise DataFormatError(
                queries_path, query_lines[qid], f"query {qid!r} has an empty text (it is judged in {qrels_path})"
            )
    # Metrics average over the queries with a relevant document; with none of
    # them every metric would print as 0.0, which looks like a (bad) result.
    if not qrels:
        raise DataFormatError(
            qrels_path,
            None,
            "no judgements in the file (it is empty or only a header): nothing to evaluate or train on",
        )
    if not any(r > 0 for rels in qrels.values() for r in rels.values()):
        raise DataFormatError(
            qrels_path,
            None,
            "no judgement has a score > 0, so no query has a relevant document: nothing to evaluate or train on",
        )
    missing = sum(1 for rels in qrels.values() for d in rels if d not in corpus)
    relevant = {d for rels in qrels.values() for d, r in rels.items() if r > 0}
    # Some judged documents missing is common (a corpus snapshot older than the
    # judgements) and only lowers recall, as in trec_eval: a warning.  All of the
    # relevant ones missing makes every metric 0 and leaves no training positive:
    # the qrels belong to another corpus.
    if not relevant & corpus.keys():
        raise DataFormatError(
            qrels_path,
            None,
            f"none of its {len(relevant)} relevant documents is in the corpus {corpus_path}: "
            "every metric would be 0 (judgements of another collection?)",
        )
    if missing:
        print(
            f"warning: {qrels_path}: {missing} judged documents are not in the corpus "
            "(kept for the metrics, skipped as training positives)",
            file=sys.stderr,
        )
    # only judged queries: BEIR keeps every split's queries in one file
    queries = {q: t for q, t in queries.items() if q in qrels}
    return RetrievalData(
        corpus,
        queries,
        qrels,
        name=folder.name,
        split=split,
        missing_docs=missing,
        folder=str(folder),
        corpus_path=str(corpus_path),
        qrels_path=str(qrels_path),
    )


def load_beir(folder, split: str) -> RetrievalData:
    folder = Path(folder)

    def read(path: Path, what: str) -> Tuple[Dict[str, str], Dict[str, int]]:
        return _read_jsonl(path, what, ("title", "text") if what == "document" else ("text",))

    qrels_path = folder / "qrels" / f"{split}.tsv"
    return _load(folder, split, folder / "corpus.jsonl", folder / "queries.jsonl", qrels_path, read)


def load_msmarco(folder, split: str) -> RetrievalData:
    folder = Path(folder)

    def read(path: Path, what: str) -> Tuple[Dict[str, str], Dict[str, int]]:
        return _read_tsv2(path, "passage" if what == "document" else what)

    queries_path = folder / f"queries.{split}.tsv"
    return _load(folder, split, folder / "collection.tsv", queries_path, folder / f"qrels.{split}.tsv", read)


def detect_format(folder) -> str:
    folder = Path(folder)
    if not folder.is_dir():
        raise DataFormatError(folder, None, "data folder not found" if not folder.exists() else "not a folder")
    if (folder / "corpus.jsonl").is_file():
        return "beir"
    if (folder / "collection.tsv").is_file():
        return "msmarco"
    raise DataFormatError(folder, None, "neither a BEIR folder (corpus.jsonl) nor MS MARCO (collection.tsv)")


def split_files(folder, split: str) -> List[Path]:
    """The files of ``folder`` that belong to ``split`` alone (not the corpus): BEIR's
    ``qrels/SPLIT.tsv``, MS MARCO's ``queries.SPLIT.tsv`` and ``qrels.SPLIT.tsv``.
    DataFormatError when ``folder`` is not a BEIR or MS MARCO folder."""
    folder = Path(folder)
    if detect_format(folder) == "beir":
        return [folder / "qrels" / f"{split}.tsv"]
    return [folder / f"queries.{split}.tsv", folder / f"qrels.{split}.tsv"]


def has_split(folder, split: str) -> bool:
    """Whether ``folder`` has ``split`` at all: one of its files exists, readable or not.
    A split that exists is loaded and its faults are errors naming it; only a split without
    any file is "no such split" (a tool may then fall back to another one)."""
    return any(p.exists() or p.is_symlink() for p in split_files(folder, split))


def load_data(folder, split: str) -> RetrievalData:
    """Load one split of a BEIR or MS MARCO folder (format detected from its files)."""
    return load_beir(folder, split) if detect_format(folder) == "beir" else load_msmarco(folder, split)
