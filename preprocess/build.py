"""One command from raw dumps to the folder ``fairseq-train DATA`` reads.

    python -m preprocess.build --wiki DUMP.xml.bz2 [--wiki ...] [--books DIR] \\
        [--text FILE] --out data-bin --vocab-size 32768 --workers N

Stages (run by preprocess.stages.Runner; each leaves ``OUT/.work/<stage>.done``
with its fingerprint, and a rerun redoes exactly the stages whose inputs or
options changed, see preprocess/README.md):

    extract  -> .work/extract/corpus.txt       (normalised documents, one sentence
                                                or paragraph per line: --line-unit)
    split    -> .work/split/{train0..,valid,test}.txt
    vocab    -> .work/vocab/{spm.model,spm.vocab,dict.txt}
    encode   -> .work/bpe/<split>.bpe          (space-separated pieces; lines longer
                                                than --max-line-pieces cut in chunks)
    binarize -> .work/bin/<split>.{bin,idx}    (fairseq mmap)
    finalize -> OUT/... and OUT/preprocess.json, written last: its presence
                marks a complete folder.

Every file is written under a temporary name and renamed when complete
(seed_fairseq.fileio). ``--out`` must be missing, empty, or hold this tool's
own record (preprocess.record); nothing else in it is ever written or deleted.
Nothing in it is ever read as input: an input inside ``--out`` is refused, and
the ``--books`` listing leaves out every folder holding a build (an ``--out``
inside the books folder).
"""

import argparse
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from tqdm import tqdm

from . import record as rec
from .errors import ENVIRONMENT_ERRNOS, WRITE_ERRNOS, PreprocessError, environment_problem, writing
from .parallel import WorkerDied
from .record import RECORD, TOOL, WORK
from .stages import Runner, Stage, fingerprint
from .text import LINE_UNITS

logger = logging.getLogger("preprocess")

STAGES = ("extract", "split", "vocab", "encode", "binarize", "finalize")
SPM_DEFAULTS = {
    "vocab_size": 32768,
    "byte_fallback": True,
    "character_coverage": 0.9995,
    "spm_sample_sentences": 1_000_000,
}
_HASH_CHUNK = 16 << 20


def _fileio():
    """seed_fairseq.fileio, imported on first use (after main() set up logging).

    Importing the seed_fairseq package loads fairseq, whose model and task
    modules call logging.basicConfig(level=DEBUG) at import time; imported at
    the top of this module, that would replace the log format set in main().
    The rest of preprocess/ imports fairseq lazily for the same reason.
    """
    from seed_fairseq import fileio

    return fileio


def _output_error(path, problem: str) -> Exception:
    """seed_fairseq.fileio.OutputError: an output location the tool must not write."""
    return _fileio().OutputError(path, problem)


# ---- input identity: content, not path or mtime ----------------------------------------------


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while True:
                chunk = f.read(_HASH_CHUNK)
                if not chunk:
                    break
                h.update(chunk)
    except OSError as e:
        raise PreprocessError(path, f"cannot read it ({e.strerror or e})") from None
    return h.hexdigest()


class InputHasher:
    """sha256 of input files, rehashing only files whose size or mtime changed
    since they were hashed (``cache``: {resolved path: {bytes, mtime_ns, sha256}})."""

    def __init__(self, cache: Optional[Dict[str, Any]] = None):
        self.cache = {k: v for k, v in (cache or {}).items() if isinstance(v, dict)}
        self.used: Dict[str, Dict[str, Any]] = {}

    def file(self, path: Path) -> str:
        from .text import check_nonempty_file

        # The readers' own checks first: a FIFO or device is refused here,
        # before open() could block on it.
        check_nonempty_file(path)
        key = str(Path(path).resolve())
        st = os.stat(key)
        entry = self.cache.get(key)
        if not (
            entry
            and entry.get("bytes") == st.st_size
            and entry.get("mtime_ns") == st.st_mtime_ns
            and isinstance(entry.get("sha256"), str)
        ):
            entry = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _sha256_file(Path(path))}
        self.used[key] = entry
        return entry["sha256"]

    def source(self, kind: str, path: str) -> str:
        """Content identity of one --wiki / --books / --text input."""
        from .text import book_files

        if kind != "books":
            return self.file(Path(path))
        root = Path(path)
        h = hashlib.sha256()
        skipped = set()
        for f in book_files(root, skipped):  # sorted: the order books are read in
            h.update(f"{f.relative_to(root).as_posix()}\0{self.file(f)}\n".encode("utf-8"))
        for folder in sorted(skipped):
            logger.info("--books %s: skipping %s, a build of %s (its outputs are not books)", root, folder, TOOL)
        return h.hexdigest()

    def changed_since_hashed(self) -> Optional[str]:
        """A hashed file whose size or mtime is no longer what it was, if any."""
        for key, entry in self.used.items():
            try:
                st = os.stat(key)
            except OSError:
                return key
            if (st.st_size, st.st_mtime_ns) != (entry["bytes"], entry["mtime_ns"]):
                return key
        return None


def _place_in(path: Path, out: Path) -> Optional[str]:
    """Where ``path`` is with respect to the folder ``out``, if it is ``out`` or
    inside it: symlinks resolved, and the same folder reached by another name
    (a bind mount, a case-insensitive file system) recognised by its inode."""
    resolved, folder = path.resolve(), out.resolve()
    if resolved == folder:
        return f"is --out {out} itself"
    if folder in resolved.parents:
        return f"is inside --out {out}"
    try:
        target = folder.stat()
    except OSError:
        return None  # a missing --out holds nothing
    for p in (resolved, *resolved.parents):
        try:
            st = p.stat()
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            return f"is --out {out} itself" if p == resolved else f"is inside --out {out}"
    return None


def _save_tokenizer(tok, folder: Path) -> None:
    """``tok.save_pretrained(folder)``, with an OS error of the Rust tokenizers (a plain
    ``Exception("... (os error 28)")``) raised as the OSError it is."""
    try:
        tok.save_pretrained(str(folder))
    except Exception as e:
        m = re.search(r"\(os error (\d+)\)", str(e))
        if type(e) is not Exception or m is None:
            raise
        code = int(m.group(1))
        raise OSError(code, os.strerror(code)) from e


# ---- the build ------------------------------------------------------------------------------------


class Build:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.work = self.out / WORK
        self.sources = (
            [("wiki", p) for p in args.wiki] + [("books", p) for p in args.books] + [("text", p) for p in args.text]
        )
        self.hasher: Optional[InputHasher] = None
        self.identities: List[Dict[str, Any]] = []
        self.runner: Optional[Runner] = None
        self._lock_fd: Optional[int] = None
        self.tokenizer_dir: Optional[Path] = None
        self.tokenizer_sha256: Optional[str] = None

    # ---- identity -------------------------------------------------------------------------

    def options(self) -> Dict[str, Any]:
        """Every option that changes what is written (not --workers, --keep-work ...).
        --valid-docs/--test-docs are null when not given (chosen from the corpus)."""
        a = self.args
        options = {
            "lowercase": a.lowercase,
            "nfkc": a.nfkc,
            "valid_docs": a.valid_docs,
            "test_docs": a.test_docs,
            "shards": a.shards,
            "seed": a.seed,
            "skip_bad": a.skip_bad,
            "line_unit": a.line_unit,
            "max_line_pieces": a.max_line_pieces,
        }
        if a.tokenizer:
            # the model's tokenizer replaces sentencepiece: its identity replaces spm's options
            options["tokenizer"] = self.tokenizer_sha256
        else:
            options.update(
                vocab_size=a.vocab_size,
                byte_fallback=a.byte_fallback,
                character_coverage=a.character_coverage,
                spm_sample_sentences=a.spm_sample_sentences,
            )
        # Recorded only for builds that read a dump and do not use the parser: the
        # records of builds made before --wiki-cleaner existed (all parser, or no
        # dump at all) stay the records of the same command.
        if a.wiki and a.wiki_cleaner != "parser":
            options["wiki_cleaner"] = a.wiki_cleaner
        return options

    def config(self) -> Dict[str, Any]:
        return dict(self.options(), sources=[{"kind": s["kind"], "sha256": s["sha256"]} for s in self.identities])

    def legacy_config(self) -> Dict[str, Any]:
        """The ``config`` the code before content hashes recorded for this command
        (unset held-out sizes meant 1000 then): a finished build of that code
        with this config is this build."""
        o = self.options()
        o["valid_docs"] = 1000 if o["valid_docs"] is None else o["valid_docs"]
        o["test_docs"] = 1000 if o["test_docs"] is None else o["test_docs"]
        return dict(o, sources=[rec.legacy_source_fingerprint(k, p) for k, p in self.sources])

    def stages(self) -> List[Stage]:
        o = self.options()

        def pick(*names, optional=()):
            picked = {n: o[n] for n in names}
            picked.update({n: o[n] for n in optional if n in o})
            return picked

        # Each stage's options are exactly what it reads: changing one redoes
        # that stage and the stages after it that read its output, nothing before.
        if self.args.tokenizer:
            vocab_stage = Stage("vocab", self.stage_tokenizer_vocab, pick("tokenizer"), reads=(), folder="vocab")
            encode_options = pick("max_line_pieces", "tokenizer")
        else:
            vocab_stage = Stage(
                "vocab",
                self.stage_vocab,
                pick("vocab_size", "byte_fallback", "character_coverage", "spm_sample_sentences"),
                reads=("split",),
                folder="vocab",
            )
            encode_options = pick("max_line_pieces")
        return [
            Stage(
                "extract",
                self.stage_extract,
                pick("lowercase", "nfkc", "line_unit", "skip_bad", optional=("wiki_cleaner",)),
                reads=("inputs",),
                folder="extract",
            ),
            Stage(
                "split",
                self.stage_split,
                pick("valid_docs", "test_docs", "shards", "seed"),
                reads=("extract",),
                folder="split",
            ),
            vocab_stage,
            Stage("encode", self.stage_encode, encode_options, reads=("split", "vocab"), folder="bpe"),
            Stage("binarize", self.stage_binarize, reads=("encode", "vocab"), folder="bin"),
            Stage(
                "finalize", self.stage_finalize, reads=("extract", "split", "vocab", "encode", "binarize"), marker=False
            ),
        ]

    def load_tokenizer(self) -> None:
        """The --tokenizer's identity (its whole pipeline and vocabulary), before any stage."""
        from seed_fairseq.vocabulary.tokenizer import (
            TokenizerError,
            load_fast_tokenizer,
            tokenizer_folder,
            vocab_from_tokenizer,
        )

        try:
            self.tokenizer_dir = tokenizer_folder(self.args.tokenizer)
            tok = load_fast_tokenizer(self.tokenizer_dir)
            vocab = vocab_from_tokenizer(tok, self.tokenizer_dir)
        except TokenizerError as e:
            raise PreprocessError(e.path, e.problem) from None
        self.tokenizer_sha256 = vocab.sha256

    def identify_inputs(self, cache: Dict[str, Any]) -> None:
        if self.args.tokenizer:
            self.load_tokenizer()
        self.hasher = InputHasher(cache)
        self.identities = [
            {"kind": k, "path": str(Path(p).resolve()), "sha256": self.hasher.source(k, p)} for k, p in self.sources
        ]
        inputs_fp = fingerprint([[s["kind"], s["sha256"]] for s in self.identities])
        self.runner = Runner(self.work, self.stages(), {"inputs": inputs_fp})

    # ---- what OUT is, and what may be done to it ----------------------------------------

    def prepare(self) -> bool:
        """Returns False when OUT already holds this exact, complete build.

        OUT must be missing, empty, a finished build of this tool (its record)
        or an unfinished one (its .work state); anything else is refused.
        """
        fileio = _fileio()
        out, force = self.out, self.args.force
        self.check_paths()
        # What OUT is; nothing is written before this is known.
        if out.exists() and not out.is_dir():
            raise _output_error(out, "exists and is not a folder")
        record = rec.load_record(out) if out.is_dir() else None
        own_work = out.is_dir() and rec.work_is_own(out)
        if record is None and not own_work:
            if out.is_dir() and (out / RECORD).exists():
                raise _output_error(
                    out / RECORD,
                    f"is not a build record of {TOOL}; refusing to write "
                    "into this folder: choose a new or empty folder",
                )
            fileio.check_output_dir(out, RECORD, TOOL)  # missing or empty, else OutputError
        state = rec.WorkState.load(out) if own_work else rec.WorkState(out)

        cache = dict((record or {}).get("input_files") or {})
        cache.update(state.input_files)
        self.identify_inputs(cache)
        fp = self.runner.fingerprints["finalize"]

        if record is not None and not force:
            same = (
                record.get("fingerprint") == fp
                if "fingerprint" in record
                else record.get("config") == self.legacy_config()
            )
            if not same:
                raise PreprocessError(
                    out / RECORD,
                    "OUT already holds a build with other inputs or options (it may be in "
                    "use); use another --out or pass --force to rebuild it",
                )
            logger.info("%s is complete for these inputs and options; nothing to do", out)
            if own_work and record.get("work_kept") is False:
                # A kill while the finished build removed its work folder.
                self.lock()
                rec.remove_work(out)
            return False

        # A finished build's folder with a .work the tool did not write: the
        # build would write its state into it and delete it when done.
        if (self.work.exists() or self.work.is_symlink()) and not own_work:
            raise _output_error(
                self.work,
                f"exists and was not written by {TOOL}; refusing to use it "
                "as the work folder: move it away or choose another --out",
            )
        # Files this build may replace: the ones its records list. Anything
        # else where the build would write is the user's: refuse now, before
        # hours of work (finalize checks again).
        owned = set(state.outputs)
        if record is not None:
            owned |= set(rec.record_outputs(record))
        # A listed file this build would delete through a link or outside OUT: refused
        # now, before anything (the record included) changes.
        for rel in sorted(owned):
            fileio.listed_path(out, rel)
        expected_tokenizer = rec.EXPECTED_TOKENIZER_FILES if self.args.tokenizer else None
        self.check_collisions(rec.possible_outputs(self.args.shards, expected_tokenizer), owned)

        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _output_error(out, f"cannot create the folder ({e.strerror or e})") from None
        self.lock()
        if record is not None:  # --force on a finished build
            self.discard_finished(record)
            state = rec.WorkState(out)
        elif own_work and force:
            self.discard_unfinished(state)
            state = rec.WorkState(out)
        elif own_work and not (self.work / rec.STATE).exists():
            # Unfinished build of the code before state.json (or an empty .work):
            # its stage markers carry no fingerprint and will all be redone.
            (self.work / "config.json").unlink(missing_ok=True)
        state.input_files = dict(self.hasher.used)
        with writing(state.path):
            state.save()
        return True

    def check_paths(self) -> None:
        """Refuse, before any input is read, an --out fairseq cannot use or the tool
        cannot create, and an input inside --out.

        Everything in OUT is the tool's outputs and work files (or the user's
        files beside them): read as input, a build would depend on what it
        wrote, and its --force would delete its own input. An --out inside a
        --books folder is fine: the books listing leaves out every build
        (preprocess.text.book_files).
        """
        out = self.out
        if ":" in str(out.absolute()):
            full = "" if ":" in str(out) else f" ({out.absolute()})"
            raise _output_error(
                out,
                f"its path{full} contains ':', which fairseq-train reads as a list of data folders "
                "(DATA is split at ':' into shards); choose a folder whose path has no ':'",
            )
        for parent in out.absolute().parents:  # `--out file/sub`: the nearest existing one
            if parent.exists() or parent.is_symlink():
                if not parent.is_dir():
                    raise _output_error(out, f"cannot create the folder ({parent} is not a folder)")
                break
        for _, path in self.sources:
            where = _place_in(Path(path), out)
            if where:
                raise PreprocessError(
                    path,
                    f"{where}, where {TOOL} writes its outputs and work files; an input is "
                    "never read from there: move it out or choose another --out",
                )

    def check_collisions(self, rels: Sequence[str], owned) -> None:
        for rel in rels:
            path = self.out / rel
            for parent in list(reversed(path.relative_to(self.out).parents))[1:]:
                p = self.out / parent
                if (p.exists() or p.is_symlink()) and (p.is_symlink() or not p.is_dir()):
                    raise _output_error(
                        p,
                        f"is in the way of {rel}, which {TOOL} writes, and was not "
                        "written by it; move it away or choose another --out",
                    )
            if (path.exists() or path.is_symlink()) and rel not in owned:
                raise _output_error(
                    path,
                    f"exists and was not written by {TOOL}; refusing to overwrite "
                    "it: move it away or choose another --out",
                )

    def lock(self) -> None:
        """One build at a time in OUT: a second one is refused, it never waits."""
        if self._lock_fd is not None:
            return
        try:
            fd = os.open(self.out, os.O_RDONLY)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise _output_error(
                    self.out, f"another {TOOL} is writing this folder; wait for it to finish or stop it"
                ) from None
            return  # a file system without locks: carry on as before
        self._lock_fd = fd

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def discard_finished(self, record: Dict[str, Any]) -> None:
        """--force on a finished build: delete exactly the files its record lists.

        The list goes into a fresh work state before the record is deleted, so
        a kill half-way leaves a folder that still says what is the tool's.
        """
        if rec.work_is_own(self.out):
            rec.remove_work(self.out)
        outputs = rec.record_outputs(record)
        logger.info("--force: deleting the %d files of the earlier build in %s", len(outputs), self.out)
        state = rec.WorkState(self.out, outputs)
        with writing(state.path):
            state.save()
        (self.out / RECORD).unlink(missing_ok=True)
        rec.delete_outputs(self.out, outputs)

    def discard_unfinished(self, state: rec.WorkState) -> None:
        """--force on an unfinished build: its files in OUT, then its work folder."""
        logger.info("--force: discarding the unfinished build in %s", self.out)
        rec.delete_outputs(self.out, state.outputs)
        rec.remove_work(self.out)

    def run(self) -> Dict[str, Any]:
        # The stages name the files they write; what is left unnamed (the runner's
        # markers) is in the work folder.
        with writing(self.work):
            return self.runner.run(self.args.stop_after)

    # ---- stages ----------------------------------------------------------------------

    def stage_extract(self, results: Dict[str, Any]) -> Dict[str, Any]:
        from . import text as textmod
        from .extract import extract

        if self.args.line_unit == "sentence":
            textmod.sentence_splitter_available()  # a clear error here, not in a pool worker
        corpus = self.work / "extract" / "corpus.txt"
        stats = {}
        with writing(corpus), _fileio().atomic_path(corpus) as tmp:
            totals = extract(
                self.sources,
                tmp,
                {
                    "lowercase": self.args.lowercase,
                    "nfkc": self.args.nfkc,
                    "line_unit": self.args.line_unit,
                    "wiki_cleaner": self.args.wiki_cleaner,
                    "wiki_page_seconds": self.args.wiki_page_seconds,
                },
                self.args.workers,
                self.args.skip_bad,
                stats,
            )
            if totals["documents"] == 0:
                raise PreprocessError(
                    ", ".join(str(p) for _, p in self.sources),
                    "no text found in the input (no documents after cleaning)",
                )
            changed = self.hasher.changed_since_hashed()
            if changed:
                # The fingerprint names the content hashed before reading.
                raise PreprocessError(changed, "changed while it was being read; run the command again")
        logger.info(
            "extract: %d documents, %d paragraphs -> %d lines (--line-unit %s)",
            totals["documents"],
            totals["paragraphs"],
            totals["lines"],
            self.args.line_unit,
        )
        # Stats by position (not by path): a reused extraction stays right when
        # an input was only renamed.
        return {
            "corpus": str(corpus.relative_to(self.out)),
            "totals": totals,
            "sources": [stats.get(str(p), {"kind": k}) for k, p in self.sources],
        }

    def stage_split(self, results: Dict[str, Any]) -> Dict[str, Any]:
        from .split import AUTO_FRACTION_PERCENT, AUTO_MAX, choose_held_out, split

        a = self.args
        n = results["extract"]["totals"]["documents"]
        valid, test = choose_held_out(n, a.valid_docs, a.test_docs, a.shards)
        if n - valid - test < a.shards:
            raise PreprocessError(
                ", ".join(str(p) for _, p in self.sources),
                f"only {n} documents: --valid-docs {valid} + --test-docs {test} "
                f"leave fewer than one train document per shard (--shards {a.shards})",
            )
        chosen = [
            name for name, given in (("--valid-docs", a.valid_docs), ("--test-docs", a.test_docs)) if given is None
        ]
        if chosen:
            logger.info(
                "held out %d valid and %d test documents of %d (%s not given: %d%% of the "
                "documents each, at most %d, and at least one train document per shard)",
                valid,
                test,
                n,
                " and ".join(chosen),
                AUTO_FRACTION_PERCENT,
                AUTO_MAX,
            )
        names = (["valid"] if valid else []) + (["test"] if test else []) + [f"train{k}" for k in range(a.shards)]
        d = self.work / "split"
        atomic_path = _fileio().atomic_path
        with writing(d), contextlib.ExitStack() as stack:  # several files at once: the folder
            tmps = {name: stack.enter_context(atomic_path(d / f"{name}.txt")) for name in names}
            counts = split(self.work / "extract" / "corpus.txt", n, valid, test, a.shards, a.seed, tmps)
        return {
            "valid_docs": valid,
            "test_docs": test,
            "chosen": {
                "valid_docs": "auto" if a.valid_docs is None else "given",
                "test_docs": "auto" if a.test_docs is None else "given",
            },
            "splits": counts,
        }

    @staticmethod
    def split_names(results: Dict[str, Any]) -> List[str]:
        return list(results["split"]["splits"])

    def stage_vocab(self, results: Dict[str, Any]) -> Dict[str, Any]:
        from . import vocab

        atomic_path = _fileio().atomic_path
        d = self.work / "vocab"
        splits = results["split"]["splits"]
        train_files = [self.work / "split" / f"train{k}.txt" for k in range(self.args.shards)]
        train_lines = sum(splits[f"train{k}"]["lines"] for k in range(self.args.shards))
        sample = d / "spm_sample.txt"
        with writing(sample), atomic_path(sample) as tmp:
            kept = vocab.systematic_sample(train_files, train_lines, self.args.spm_sample_sentences, tmp)
        logger.info("training sentencepiece BPE (%d pieces) on %d lines", self.args.vocab_size, kept)
        model = vocab.train_spm(
            sample,
            self.args.vocab_size,
            self.args.workers,
            byte_fallback=self.args.byte_fallback,
            character_coverage=self.args.character_coverage,
        )
        # The model is renamed into place last (after spm.vocab and dict.txt).
        with writing(d / "spm.model"), atomic_path(d / "spm.model") as tmp_model:
            tmp_model.write_bytes(model)
            sp = vocab.load_spm(tmp_model)
            with writing(d / "spm.vocab"), atomic_path(d / "spm.vocab") as tmp:
                vocab.write_spm_vocab(sp, tmp)
            with writing(d / "dict.txt"), atomic_path(d / "dict.txt") as tmp:
                vocab.write_fairseq_dict(sp, tmp)
        return {"sample_lines": kept, "pieces": sp.get_piece_size()}

    def stage_tokenizer_vocab(self, results: Dict[str, Any]) -> Dict[str, Any]:
        """dict.txt, the id mapping and a copy of the tokenizer (seed_fairseq.vocabulary.tokenizer)."""
        from seed_fairseq.vocabulary.tokenizer import RECORD as VOCAB_RECORD
        from seed_fairseq.vocabulary.tokenizer import load_fast_tokenizer, vocab_from_tokenizer, write_dict

        fileio = _fileio()
        d = self.work / "vocab"
        tok = load_fast_tokenizer(self.tokenizer_dir)
        vocab = vocab_from_tokenizer(tok, self.tokenizer_dir)
        if vocab.sha256 != self.tokenizer_sha256:
            raise PreprocessError(self.tokenizer_dir, "changed while the build ran; run the command again")
        staging = d / "tokenizer.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        with writing(d / "tokenizer"):
            _save_tokenizer(tok, staging)
        files = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
        shutil.rmtree(d / "tokenizer", ignore_errors=True)
        os.replace(staging, d / "tokenizer")
        with writing(d / VOCAB_RECORD):
            fileio.write_json_atomic(d / VOCAB_RECORD, vocab.record())
        # dict.txt last: the folder's other files are in place when it appears
        with writing(d / "dict.txt"):
            write_dict(vocab, d / "dict.txt")
        logger.info(
            "vocab: the tokenizer of %s, %d tokens (%s)",
            self.tokenizer_dir,
            len(vocab.symbols),
            "ids unchanged" if vocab.is_identity else "specials moved to fairseq's positions",
        )
        return {
            "pieces": len(vocab.symbols),
            "record": vocab.record(),
            "tokenizer_files": ["tokenizer/" + f for f in files],
            "source": str(Path(self.tokenizer_dir).resolve()),
        }

    def stage_encode(self, results: Dict[str, Any]) -> Dict[str, Dict[str, int]]:
        from .encode import encode_file, encode_file_hf

        fileio = _fileio()
        d = self.work / "bpe"
        model = self.work / "vocab" / "spm.model"
        names = self.split_names(results)
        splits = results["split"]["splits"]
        total = sum(splits[name]["lines"] + splits[name]["documents"] - 1 for name in names)
        max_pieces = self.args.max_line_pieces
        counts = {}
        with tqdm(total=total, desc="encode", unit=" lines", disable=None) as bar:
            for name in names:
                dst = d / f"{name}.bpe"
                src = self.work / "split" / f"{name}.txt"
                stats = d / f"{name}.counts.json"
                # The runner keeps this folder only for a restart with the same
                # fingerprint: a split finished then is still right.
                if dst.exists() and stats.exists():
                    logger.info("encode %s: reusing %s", name, dst)
                    counts[name] = rec.read_json(stats)
                    bar.update(counts[name]["input_lines"])
                    continue
                with writing(dst), fileio.atomic_path(dst) as tmp:
                    if self.args.tokenizer:
                        counts[name] = encode_file_hf(
                            src, tmp, self.work / "vocab" / "tokenizer", progress=bar, max_pieces=max_pieces
                        )
                    else:
                        counts[name] = encode_file(
                            src, tmp, model, self.args.workers, progress=bar, max_pieces=max_pieces
                        )
                    # The counts first: a .bpe in place always has its counts beside it.
                    with writing(stats):
                        fileio.write_json_atomic(stats, counts[name])
        cut = sum(c["lines_cut"] for c in counts.values())
        added = sum(c["chunks_added"] for c in counts.values())
        lines = sum(c["input_lines"] for c in counts.values())
        if max_pieces:
            logger.info(
                "encode: %d of %d lines were longer than --max-line-pieces %d pieces and were "
                "cut into chunks (%d extra lines)",
                cut,
                lines,
                max_pieces,
                added,
            )
        return counts

    def stage_binarize(self, results: Dict[str, Any]) -> Dict[str, Dict[str, int]]:
        from .binarize import binarize_file

        d = self.work / "bin"
        dict_path = self.work / "vocab" / "dict.txt"
        counts = {}
        for name in tqdm(self.split_names(results), desc="binarize", unit=" splits", disable=None):
            tmp_prefix = d / f"{name}.tmp"
            with writing(d / f"{name}.bin"):
                seqs, toks = binarize_file(self.work / "bpe" / f"{name}.bpe", dict_path, tmp_prefix, self.args.workers)
                # .idx last: fairseq opens a dataset through its index.
                rec.move_into(d / f"{name}.tmp.bin", d / f"{name}.bin")
                rec.move_into(d / f"{name}.tmp.idx", d / f"{name}.idx")
            counts[name] = {"sequences": seqs, "tokens": toks}
        return counts

    def stage_finalize(self, results: Dict[str, Any]) -> Dict[str, Any]:
        from seed_fairseq.vocabulary.dictionary import dictionary_sha256

        a, out = self.args, self.out
        names = self.split_names(results)
        tokenizer_files = results["vocab"]["tokenizer_files"] if a.tokenizer else None
        planned = rec.planned_outputs(a.shards, names, tokenizer_files)
        state = rec.WorkState.load(out)
        owned = set(state.outputs)
        # A file of the user's put in OUT during the build is never replaced.
        self.check_collisions(planned, owned)
        # Files an interrupted finalize with other splits left (e.g. valid.bin
        # before --valid-docs 0): this build's to delete, and not part of it.
        rec.delete_outputs(out, sorted(owned - set(planned)))
        # Claimed before anything is written: whatever a kill leaves in OUT is
        # listed as the tool's.
        state.outputs = planned
        with writing(state.path):
            state.save()

        # Everything is prepared under .work and renamed into OUT: no temporary
        # file is ever left in OUT itself.
        staging = self.work / "final"
        shutil.rmtree(staging, ignore_errors=True)
        vocab_dir = self.work / "vocab"
        # Each shard is a complete fairseq data dir of its own (dict + spm or the id record beside it).
        copies = [(vocab_dir / rel, rel) for rel in rec.vocab_outputs(1, tokenizer_files)]
        shard_files = rec.TOKENIZER_SHARD_FILES if a.tokenizer else rec.SPM_SHARD_FILES
        if a.shards > 1:
            copies += [(vocab_dir / name, f"shard{k}/{name}") for k in range(a.shards) for name in shard_files]
        for src, rel in copies:
            with writing(out / rel):
                _fileio().copy_atomic(src, staging / rel)
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                rec.move_into(staging / rel, out / rel)
        for name in names:
            prefix = rec.split_prefix(name, a.shards)
            for ext in (".bin", ".idx"):
                src, dst = self.work / "bin" / f"{name}{ext}", out / (prefix + ext)
                dst.parent.mkdir(parents=True, exist_ok=True)
                # Moves are idempotent so an interrupted finalize can simply run
                # again: a missing source was moved by it (the binarize marker
                # vouches that it is this build's).
                if src.exists():
                    with writing(dst):
                        rec.move_into(src, dst)
                elif not dst.exists():
                    raise FileNotFoundError(src)
        record = rec.build_record(
            a,
            self.identities,
            results,
            config=self.config(),
            fingerprints=self.runner.fingerprints,
            outputs=planned,
            input_files=dict(self.hasher.used),
            dictionary_sha256=dictionary_sha256(out / "dict.txt"),
        )
        with writing(out / RECORD):
            rec.write_record(out, record, staging)
        shutil.rmtree(staging, ignore_errors=True)
        if not a.keep_work:
            rec.remove_work(out)
        return record


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m preprocess.build",
        description="Raw Wikipedia dumps / BookCorpus-style text -> sentencepiece BPE + fairseq mmap data.",
    )
    g = p.add_argument_group("inputs (read in this order: all --wiki, all --books, all --text)")
    g.add_argument(
        "--wiki",
        action="append",
        default=[],
        metavar="DUMP",
        help="MediaWiki XML export, .xml or .xml.bz2 (repeatable)",
    )
    g.add_argument(
        "--books",
        action="append",
        default=[],
        metavar="DIR",
        help="directory of .txt files, one book per file (repeatable)",
    )
    g.add_argument(
        "--text",
        action="append",
        default=[],
        metavar="FILE",
        help="text with one paragraph (or sentence) per line, blank line between documents (repeatable)",
    )
    p.add_argument(
        "--out",
        required=True,
        help="output folder (fairseq data dir): missing, empty, or an earlier build of this tool",
    )
    p.add_argument(
        "--tokenizer",
        metavar="HF_DIR",
        help="encode with this HuggingFace model's own (fast) tokenizer instead of training sentencepiece: "
        "a model folder, its tokenizer folder, or an examples/import_from_hf.py output; dict.txt is then the "
        "model's vocabulary in its own id order (text is not lower-cased or NFKC-normalised unless asked: "
        "the tokenizer normalises)",
    )
    p.add_argument("--vocab-size", type=int, default=None, help="sentencepiece pieces (default 32768)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: all cores)")
    p.add_argument(
        "--line-unit",
        choices=LINE_UNITS,
        default="sentence",
        help="what one line (one fairseq item) is: 'sentence' (default; paragraphs split "
        "by blingfire, as in BERT/RoBERTa/SEED data) or 'paragraph'",
    )
    p.add_argument(
        "--wiki-cleaner",
        choices=("scanner", "parser"),
        default="scanner",
        help="how --wiki articles are cleaned: 'scanner' (default; brackets paired by a linear scan, "
        "WikiExtractor's speed, the least markup left) or 'parser' (mwparserfromhell's tree, "
        "~8x slower; what builds before this option used)",
    )
    p.add_argument(
        "--wiki-page-seconds",
        type=float,
        default=None,
        metavar="S",
        help="CPU seconds the cleaning of one --wiki page may take (default 30; 0 = no limit): a page "
        "over it is skipped, named in the log and in preprocess.json, and the build goes on. Not part "
        "of the build's identity (it changes nothing but the pages it skips)",
    )
    p.add_argument(
        "--max-line-pieces",
        type=int,
        default=510,
        metavar="N",
        help="cut any line longer than N sentencepiece pieces into consecutive chunks of at "
        "most N (nothing is lost), so --sample-break-mode complete never makes an "
        "oversized block; default 510 = --tokens-per-sample 512 minus [CLS] and </s>; "
        "0 = never cut",
    )
    p.add_argument(
        "--spm-sample-sentences",
        type=int,
        default=None,
        help="train lines (sentences or paragraphs, see --line-unit) sampled for "
        "sentencepiece; 0 = all (default 1000000)",
    )
    p.add_argument("--character-coverage", type=float, default=None, help="sentencepiece (default 0.9995)")
    p.add_argument(
        "--byte-fallback",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="unknown characters become UTF-8 byte pieces (default on); off: they become <unk>",
    )
    p.add_argument(
        "--lowercase",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="lower-case all text (default on: the released SEED-Encoder is uncased; off with --tokenizer)",
    )
    p.add_argument(
        "--nfkc",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Unicode NFKC normalisation (default on; off with --tokenizer)",
    )
    p.add_argument(
        "--valid-docs",
        type=int,
        default=None,
        help="documents held out for valid (default: 5%% of the documents, at most 1000)",
    )
    p.add_argument(
        "--test-docs",
        type=int,
        default=None,
        help="documents held out for test (default: 5%% of the documents, at most 1000)",
    )
    p.add_argument("--shards", type=int, default=1, help="train shards: OUT/shard0..N-1 when N > 1")
    p.add_argument("--seed", type=int, default=1, help="seed of the valid/test document choice")
    p.add_argument(
        "--skip-bad", action="store_true", help="skip (and count) non-UTF-8 lines of text inputs instead of stopping"
    )
    p.add_argument("--keep-work", action="store_true", help="keep OUT/.work (normalised text, pieces)")
    p.add_argument(
        "--force",
        action="store_true",
        help="discard the earlier build in OUT (the files its record lists) and start over",
    )
    p.add_argument("--stop-after", choices=STAGES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not (args.wiki or args.books or args.text):
        p.error("give at least one input: --wiki, --books or --text")
    spm_only = ("vocab_size", "byte_fallback", "character_coverage", "spm_sample_sentences")
    if args.tokenizer:
        given = [f"--{n.replace('_', '-')}" for n in spm_only if getattr(args, n) is not None]
        if given:
            p.error(
                f"--tokenizer cannot be combined with {', '.join(given)}: the tokenizer's own vocabulary "
                "is used, no sentencepiece model is trained"
            )
    # the defaults (a sentencepiece build: as before; with --tokenizer: its own normalisation)
    for name, default in SPM_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    for name in ("lowercase", "nfkc"):
        if getattr(args, name) is None:
            setattr(args, name, not args.tokenizer)
    for name in ("vocab_size", "workers", "shards"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("valid_docs", "test_docs", "spm_sample_sentences", "max_line_pieces"):
        value = getattr(args, name)
        if value is not None and value < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if not 0 < args.character_coverage <= 1:
        p.error("--character-coverage must be in (0, 1]")
    if args.wiki_page_seconds is None:
        from .extract import DEFAULT_PAGE_SECONDS

        args.wiki_page_seconds = DEFAULT_PAGE_SECONDS
    if not 0 <= args.wiki_page_seconds <= 1e6:  # also refuses nan and inf
        p.error("--wiki-page-seconds must be between 0 (no limit) and 1000000")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(name)s | %(message)s", stream=sys.stderr)
    OutputError = _fileio().OutputError  # noqa: N806 - after logging is set up (see _fileio)
    build = Build(args)
    try:
        if build.prepare():
            build.run()
    except (PreprocessError, OutputError) as e:
        print(f"error: {e.path}: {e.problem}", file=sys.stderr)
        return 2
    except OSError as e:
        # Errors of the machine rather than of the code (a full disk, the file-size
        # limit, permissions): one line naming the file, so the user can fix it and
        # rerun to resume. Writes name their file (errors.writing); one that does
        # not is still somewhere in OUT.
        path = e.filename or (args.out if e.errno in WRITE_ERRNOS else None)
        if e.errno not in ENVIRONMENT_ERRNOS or not path:
            raise
        print(f"error: {path}: {environment_problem(e)}", file=sys.stderr)
        return 2
    except WorkerDied as e:
        # killed (out of memory?) or crashed in C code: what it finished is kept
        print(
            f"error: {args.out}: {e}; rerun the same command to resume (with fewer --workers if memory ran out)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    finally:
        build.close()
    return 0


def build(
    out: Union[str, os.PathLike],
    *,
    text: Iterable[Union[str, os.PathLike]] = (),
    wiki: Iterable[Union[str, os.PathLike]] = (),
    books: Iterable[Union[str, os.PathLike]] = (),
    **options,
) -> Path:
    """The build as a library call (tests, benchmarks, the comparison script):
    ``build("data-bin", text=["corpus.txt"], vocab_size=500, valid_docs=3)`` runs
    exactly what ``python -m preprocess.build --text corpus.txt --out data-bin
    --vocab-size 500 --valid-docs 3`` runs, with the same resume and ownership
    rules, but raises (``PreprocessError``, ``OutputError``) instead of printing.
    Options are the flags' names with ``_``; ``lowercase=False`` is ``--no-lowercase``.
    """
    argv = ["--out", str(out)]
    for flag, values in (("--wiki", wiki), ("--books", books), ("--text", text)):
        for value in values:
            argv += [flag, str(value)]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            if name in ("byte_fallback", "lowercase", "nfkc"):  # BooleanOptionalAction flags
                argv.append("--no-" + name.replace("_", "-"))
        elif value is not None:
            argv += [flag, str(value)]
    b = Build(parse_args(argv))
    try:
        if b.prepare():
            b.run()
    finally:
        b.close()
    return Path(out)


if __name__ == "__main__":
    sys.exit(main())
