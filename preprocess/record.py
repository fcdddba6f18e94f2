"""What ``preprocess.build`` writes about itself, and so what it may touch in ``--out``.

Two records say a folder is this tool's:

* ``OUT/preprocess.json`` (:data:`RECORD`), written last by a finished build:
  normalisation, vocabulary, counts, versions, the fingerprint of the build
  and ``outputs``, the exact list of files the build wrote in ``OUT``;
* ``OUT/.work/state.json`` (:data:`STATE`), written first by an unfinished
  build: the files of ``OUT`` it owns (written, or about to be written, by its
  finalize stage; or taken over from a finished build replaced with
  ``--force``) and the content hashes of the inputs.

The tool overwrites or deletes only files these records list (and its own
``.work`` folder); anything else in ``OUT`` is the user's.
"""

import hashlib
import json
import os
import platform
import shutil
import unicodedata
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

from seed_fairseq.base.fileio import delete_listed, fsync_dir, write_json_atomic

RECORD = "preprocess.json"
RECORD_FORMAT = "seed_fairseq.preprocess/1"
WORK = ".work"
STATE = "state.json"
STATE_FORMAT = "seed_fairseq.preprocess.work/1"
TOOL = "preprocess.build"
# Keys every .work/config.json of the code before state.json has (an unfinished
# build of that code is this tool's too).
_LEGACY_CONFIG_KEYS = {"sources", "vocab_size", "shards", "valid_docs", "test_docs"}


def read_json(path: Path) -> Optional[Any]:
    """The JSON in ``path``, or None when it is missing, unreadable or not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# ---- the final record ------------------------------------------------------------------------


def load_record(out: Path) -> Optional[Dict[str, Any]]:
    """The build record in ``out`` if this tool wrote it, else None."""
    rec = read_json(Path(out) / RECORD)
    if isinstance(rec, dict) and rec.get("format") == RECORD_FORMAT:
        return rec
    return None


def split_prefix(name: str, shards: int) -> str:
    """Where split ``name`` (valid, test, train<k>) lives in OUT, relative (README layout)."""
    base = "train" if name.startswith("train") else name
    if shards == 1:
        return base
    shard = int(name[5:]) if name.startswith("train") else 0
    return f"shard{shard}/{base}"


# what a build writes beside the data: its vocabulary (sentencepiece, or a HF tokenizer's)
SPM_FILES = ("dict.txt", "spm.model", "spm.vocab")
SPM_SHARD_FILES = ("dict.txt", "spm.model")
TOKENIZER_FILES = ("dict.txt", "hf_tokenizer.json")  # + tokenizer/<its files>
TOKENIZER_SHARD_FILES = ("dict.txt", "hf_tokenizer.json")
# the tokenizer files a build expects to write (checked for collisions before it starts;
# finalize checks the actual list again)
EXPECTED_TOKENIZER_FILES = ("tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json")


def vocab_outputs(shards: int, tokenizer_files: Optional[Iterable[str]] = None) -> List[str]:
    """The vocabulary files of a build: sentencepiece's, or (``tokenizer_files`` given) a
    HF tokenizer's."""
    if tokenizer_files is None:
        files = list(SPM_FILES)
        per_shard = SPM_SHARD_FILES
    else:
        files = list(TOKENIZER_FILES) + sorted(tokenizer_files)
        per_shard = TOKENIZER_SHARD_FILES
    if shards > 1:
        for k in range(shards):
            files += [f"shard{k}/{name}" for name in per_shard]
    return files


def planned_outputs(
    shards: int, split_names: Iterable[str], tokenizer_files: Optional[Iterable[str]] = None
) -> List[str]:
    """Every file a build with these splits writes in OUT, relative, the record last."""
    files = vocab_outputs(shards, tokenizer_files)
    for name in split_names:
        prefix = split_prefix(name, shards)
        files += [prefix + ".bin", prefix + ".idx"]
    return files + [RECORD]


def possible_outputs(shards: int, tokenizer_files: Optional[Iterable[str]] = None) -> List[str]:
    """What a build with ``shards`` may write, whichever held-out splits it ends with."""
    return planned_outputs(shards, ["valid", "test"] + [f"train{k}" for k in range(shards)], tokenizer_files)


def record_outputs(record: Dict[str, Any]) -> List[str]:
    """The files a finished build wrote in OUT, relative.

    Records of the code before ``outputs`` existed do not list them; there
    they are derived from the record's own ``splits`` (each with its ``path``)
    and ``shards``, exactly what that code wrote.
    """
    if isinstance(record.get("outputs"), list):
        return [p for p in record["outputs"] if isinstance(p, str)]
    shards = record.get("shards", 1)
    files = ["dict.txt", "spm.model", "spm.vocab"]
    if isinstance(shards, int) and shards > 1:
        for k in range(shards):
            files += [f"shard{k}/dict.txt", f"shard{k}/spm.model"]
    for split in (record.get("splits") or {}).values():
        if isinstance(split, dict) and isinstance(split.get("path"), str):
            files += [split["path"] + ".bin", split["path"] + ".idx"]
    return files + [RECORD]


def delete_outputs(out: Path, rels: Iterable[str]) -> None:
    """Delete the listed files of OUT (never folders), then the folders (e.g.
    ``shard3``) these deletions left empty.  A listed path outside OUT (absolute,
    ``..``, or through a symbolic link) is refused before anything is deleted
    (``seed_fairseq.base.fileio.delete_listed``: the rule every tool shares)."""
    delete_listed(out, rels)


# ---- the unfinished build's state -----------------------------------------------------------


def work_is_own(out: Path) -> bool:
    """Is ``OUT/.work`` this tool's work folder?

    Yes when it holds the state file (or the ``config.json`` of the code
    before it); also when it is empty or holds nothing but temporaries of the
    state file: the debris of a kill right after the folder was created,
    before the state was in place (nothing of the user's can be there).
    """
    work = Path(out) / WORK
    if work.is_symlink() or not work.is_dir():
        return False
    state = read_json(work / STATE)
    if isinstance(state, dict) and state.get("format") == STATE_FORMAT:
        return True
    legacy = read_json(work / "config.json")
    if isinstance(legacy, dict) and _LEGACY_CONFIG_KEYS <= set(legacy):
        return True
    try:
        return all(e.name.startswith(f".{STATE}.tmp-") and e.is_file() for e in work.iterdir())
    except OSError:
        return False


def holds_build(folder: Path) -> bool:
    """Does ``folder`` hold a build of this tool, finished (its record) or not (its
    work state)? Its files are then the tool's outputs and work files, never input
    (``preprocess.inputs.book_files``). An empty ``.work`` does not count: nothing is
    in it, and a folder of the user's must not be skipped for an empty subfolder."""
    if load_record(folder) is not None:
        return True
    try:
        return work_is_own(folder) and any((Path(folder) / WORK).iterdir())
    except OSError:
        return False


class WorkState:
    """``OUT/.work/state.json``: the OUT files an unfinished build owns, and input hashes."""

    def __init__(self, out: Path, outputs: Iterable[str] = (), input_files: Optional[Dict] = None):
        self.path = Path(out) / WORK / STATE
        self.outputs = sorted(set(outputs))
        self.input_files = dict(input_files or {})

    @classmethod
    def load(cls, out: Path) -> "WorkState":
        """The state of ``out`` (assumed to be this tool's: see :func:`work_is_own`).

        A work folder of the code before state.json: whatever that code's
        finalize may have left in OUT (it is listed by its config.json's
        options) is this build's to replace.
        """
        out = Path(out)
        state = read_json(out / WORK / STATE)
        if isinstance(state, dict) and state.get("format") == STATE_FORMAT:
            return cls(out, state.get("outputs") or [], state.get("input_files") or {})
        legacy = read_json(out / WORK / "config.json")
        if isinstance(legacy, dict) and isinstance(legacy.get("shards"), int):
            return cls(out, possible_outputs(legacy["shards"]))
        return cls(out)

    def save(self) -> None:
        write_json_atomic(
            self.path, {"format": STATE_FORMAT, "tool": TOOL, "outputs": self.outputs, "input_files": self.input_files}
        )


def remove_work(out: Path) -> None:
    """Delete this tool's ``OUT/.work``, its state file last, so that a kill half-way
    leaves a folder still recognisable as this tool's (see :func:`work_is_own`)."""
    work = Path(out) / WORK
    if not work.is_dir() or work.is_symlink():
        return
    for entry in work.iterdir():
        if entry.name in (STATE, "config.json"):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    (work / "config.json").unlink(missing_ok=True)
    (work / STATE).unlink(missing_ok=True)
    work.rmdir()


# ---- input identity -------------------------------------------------------------------------


def legacy_source_fingerprint(kind: str, path: str) -> Dict[str, Any]:
    """How the code before content hashes identified an input (path, size, mtime);
    only used to recognise a finished build of that code as unchanged."""
    p = Path(path).resolve()
    if kind == "books" and p.is_dir():
        h = hashlib.sha256()
        for f in sorted(p.rglob("*.txt")):
            st = f.stat()
            h.update(f"{f.relative_to(p)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return {"kind": kind, "path": str(p), "files_digest": h.hexdigest()}
    st = p.stat() if p.exists() else None
    return {
        "kind": kind,
        "path": str(p),
        "bytes": st.st_size if st else None,
        "mtime_ns": st.st_mtime_ns if st else None,
    }


def versions() -> Dict[str, Optional[str]]:
    from importlib import metadata

    import fairseq
    import mwparserfromhell
    import sentencepiece

    try:
        blingfire = metadata.version("blingfire")
    except metadata.PackageNotFoundError:
        blingfire = None
    return {
        "python": platform.python_version(),
        "fairseq": fairseq.__version__,
        "sentencepiece": sentencepiece.__version__,
        "mwparserfromhell": mwparserfromhell.__version__,
        "blingfire": blingfire,
        "unicodedata": unicodedata.unidata_version,
    }


# ---- writing the record ---------------------------------------------------------------------


def build_record(
    args,
    sources: List[Dict[str, Any]],
    results: Dict[str, Any],
    *,
    config: Dict[str, Any],
    fingerprints: Dict[str, str],
    outputs: List[str],
    input_files: Dict[str, Any],
    dictionary_sha256: str,
) -> Dict[str, Any]:
    """The content of ``preprocess.json`` for a finished build.

    ``sources``: [{"kind", "path", "sha256"}] in input order; ``results``: the
    results of the stages; ``outputs``: every file written in OUT, relative.
    """
    from . import text as textmod

    a = args
    split_result = results["split"]
    split_counts = split_result["splits"]
    splits = {}
    for name, counts in split_counts.items():
        enc = results["encode"][name]
        splits[name] = dict(
            counts,
            **results["binarize"][name],
            lines_cut=enc["lines_cut"],
            chunks_added=enc["chunks_added"],
            path=split_prefix(name, a.shards),
        )
    totals = results["extract"]["totals"]
    source_stats = results["extract"]["sources"]
    record = {
        "format": RECORD_FORMAT,
        "tool": TOOL,
        "normalization": {
            "function": "preprocess.text.normalize_line",
            "lowercase": a.lowercase,
            "nfkc": a.nfkc,
            "whitespace": "runs of Unicode whitespace -> one space; strip; control characters dropped",
            "steps": list(textmod.NORMALIZATION_STEPS),
            "unicodedata_version": unicodedata.unidata_version,
            "line_unit": a.line_unit,
        },
        "lines": {
            "unit": a.line_unit,
            "sentence_splitter": (
                textmod.SENTENCE_SPLITTER + " (cased text, cut only at spaces)" if a.line_unit == "sentence" else None
            ),
            "paragraphs": totals["paragraphs"],
            "lines": totals["lines"],
            "paragraphs_kept_whole": totals["paragraphs_kept_whole"],
            "max_line_pieces": a.max_line_pieces,
            "lines_cut": sum(s["lines_cut"] for s in splits.values()),
            "chunks_added": sum(s["chunks_added"] for s in splits.values()),
            "rule": "sentences of a paragraph joined by one space = the normalised paragraph; "
            "a line of more than max_line_pieces pieces is cut into consecutive chunks "
            "of at most max_line_pieces pieces, one per line, pieces unchanged (0 = no cut)",
        },
        **(
            _tokenizer_sections(results["vocab"], dictionary_sha256)
            if getattr(a, "tokenizer", None)
            else _spm_sections(a, results["vocab"], dictionary_sha256)
        ),
        "sources": [
            dict(kind=s["kind"], path=s["path"], sha256=s["sha256"], stats=stats)
            for s, stats in zip(sources, source_stats)
        ],
        "documents": totals,
        "held_out": {
            "valid_docs": split_result["valid_docs"],
            "test_docs": split_result["test_docs"],
            "chosen": split_result["chosen"],
        },
        "splits": splits,
        "shards": a.shards,
        "seed": a.seed,
        "versions": versions(),
        "config": config,
        # Identity of the build: a rerun is "nothing to do" exactly when the
        # inputs and options give this fingerprint again.
        "fingerprint": fingerprints["finalize"],
        "stage_fingerprints": {k: v for k, v in fingerprints.items() if k != "finalize"},
        # What --force may delete: these files and nothing else.
        "outputs": sorted(outputs),
        "work_kept": bool(a.keep_work),
        # sha256 of each input file with the size and mtime it had when it was
        # hashed: a rerun rehashes only files whose size or mtime changed.
        "input_files": input_files,
    }
    return record


def _spm_sections(a, vocab_result: Dict[str, Any], dictionary_sha256: str) -> Dict[str, Any]:
    from . import vocab as vocabmod

    pieces = vocab_result["pieces"]
    return {
        "sentencepiece": {
            "model": "spm.model",
            "model_type": "bpe",
            "vocab_size": pieces,
            "normalization_rule_name": "identity",
            "byte_fallback": a.byte_fallback,
            "character_coverage": a.character_coverage,
            "special_ids": {"unk": 0, "bos": 1, "eos": 2, "pad": -1},
            "sample_sentences_requested": a.spm_sample_sentences,
            "sample_lines_used": vocab_result["sample_lines"],
        },
        "fairseq_dictionary": {
            "file": "dict.txt",
            "convention": "xlm-r (fairseq_offset=1)",
            "rule": "fairseq = spm + 1 for spm >= 3; spm <unk> 0 -> 3, <s> 1 -> 0, </s> 2 -> 2; "
            "<pad> = 1; <mask> appended by the task = len(spm) + 1",
            "function": "preprocess.vocab.spm_to_fairseq_id",
            "counts": "1 for every piece",
            "size_with_specials": pieces + 1,
            "mask_index": vocabmod.spm_to_fairseq_id(pieces - 1) + 1,
            # seed_fairseq.base.vocabulary.dictionary.dictionary_sha256: compared by the training
            # task, checkpoints and the HF export before ids are trusted.
            "sha256": dictionary_sha256,
        },
    }


def _tokenizer_sections(vocab_result: Dict[str, Any], dictionary_sha256: str) -> Dict[str, Any]:
    return {
        "tokenizer": dict(vocab_result["record"], files=vocab_result["tokenizer_files"], source=vocab_result["source"]),
        "fairseq_dictionary": {
            "file": "dict.txt",
            "convention": "the tokenizer's own ids (seed_fairseq.base.vocabulary.tokenizer)",
            "rule": vocab_result["record"]["rule"],
            "counts": "1 for every token",
            "size_with_specials": vocab_result["pieces"],
            "mask_index": vocab_result["pieces"] - 1,
            "sha256": dictionary_sha256,
        },
    }


def move_into(src: Path, dst: Path) -> None:
    """Rename the complete file ``src`` to ``dst`` (same file system: both are in
    OUT), durably: the data is fsync'ed before the rename, the folder after.

    seed_fairseq.base.fileio has no helper for a file written elsewhere (fairseq's
    binarizer writes its own files), hence this one.
    """
    with open(src, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(src, dst)
    fsync_dir(Path(dst).parent)


def write_record(out: Path, record: Dict[str, Any], staging: Path) -> None:
    """Write the record under ``staging`` (in OUT/.work) and rename it into OUT:
    complete or absent, and no temporary is ever left in OUT itself."""
    tmp = write_json_atomic(Path(staging) / RECORD, record)
    move_into(tmp, Path(out) / RECORD)
