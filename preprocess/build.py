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
(seed_fairseq.base.fileio). ``--out`` must be missing, empty, or hold this tool's
own record (preprocess.record); nothing else in it is ever written or deleted.
Nothing in it is ever read as input: an input inside ``--out`` is refused, and
the ``--books`` listing leaves out every folder holding a build (an ``--out``
inside the books folder).

Where the parts live: the options (preprocess.options), the inputs' identity
(preprocess.inputs), what may be done to ``--out`` (preprocess.ownership), the
stage bodies (preprocess.steps); this module puts them together and holds the
command (``main``) and the library call (``build``).
"""

import logging
import os
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from seed_fairseq.base.fileio import OutputError, listed_path

from . import ownership
from . import record as rec
from .errors import ENVIRONMENT_ERRNOS, WRITE_ERRNOS, PreprocessError, environment_problem, writing
from .inputs import InputHasher
from .options import SPM_DEFAULTS, STAGES, BuildOptions, OptionsError, parse_args, parser
from .parallel import WorkerDied
from .record import RECORD, TOOL, WORK
from .stages import Runner, Stage, fingerprint
from .steps import StageBodies

__all__ = ["SPM_DEFAULTS", "STAGES", "Build", "BuildOptions", "PreprocessError", "build", "main", "parse_args"]

logger = logging.getLogger("preprocess")


class Build(StageBodies):
    """One run of the tool on ``opts``: :meth:`prepare` (what OUT is, the inputs'
    identity), then :meth:`run` (the stages, preprocess.steps), then :meth:`close`."""

    def __init__(self, opts: BuildOptions):
        self.opts = opts
        self.out = Path(opts.out)
        self.work = self.out / WORK
        self.sources = opts.sources
        self.hasher: Optional[InputHasher] = None
        self.identities: List[Dict[str, Any]] = []
        self.runner: Optional[Runner] = None
        self.out_lock = ownership.OutLock(self.out)
        self.tokenizer_dir: Optional[Path] = None
        self.tokenizer_sha256: Optional[str] = None

    @property
    def args(self) -> BuildOptions:
        """The options under their name before :class:`BuildOptions` (an argparse namespace)."""
        return self.opts

    # ---- identity -------------------------------------------------------------------------

    def options(self) -> Dict[str, Any]:
        """Every option that changes what is written (:meth:`BuildOptions.identity`)."""
        return self.opts.identity(self.tokenizer_sha256)

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
        if self.opts.tokenizer:
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
        from seed_fairseq.base.vocabulary.tokenizer import (
            TokenizerError,
            load_fast_tokenizer,
            tokenizer_folder,
            vocab_from_tokenizer,
        )

        try:
            self.tokenizer_dir = tokenizer_folder(self.opts.tokenizer)
            tok = load_fast_tokenizer(self.tokenizer_dir)
            vocab = vocab_from_tokenizer(tok, self.tokenizer_dir)
        except TokenizerError as e:
            raise PreprocessError(e.path, e.problem) from None
        self.tokenizer_sha256 = vocab.sha256

    def identify_inputs(self, cache: Dict[str, Any]) -> None:
        if self.opts.tokenizer:
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
        out, force = self.out, self.opts.force
        ownership.check_paths(out, self.sources)
        # What OUT is; nothing is written before this is known.
        record, own_work = ownership.inspect_out(out)
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
            raise OutputError(
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
            listed_path(out, rel)
        expected_tokenizer = rec.EXPECTED_TOKENIZER_FILES if self.opts.tokenizer else None
        ownership.check_collisions(out, rec.possible_outputs(self.opts.shards, expected_tokenizer), owned)

        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(out, f"cannot create the folder ({e.strerror or e})") from None
        self.lock()
        if record is not None:  # --force on a finished build
            ownership.discard_finished(out, record)
            state = rec.WorkState(out)
        elif own_work and force:
            ownership.discard_unfinished(out, state)
            state = rec.WorkState(out)
        elif own_work and not (self.work / rec.STATE).exists():
            # Unfinished build of the code before state.json (or an empty .work):
            # its stage markers carry no fingerprint and will all be redone.
            (self.work / "config.json").unlink(missing_ok=True)
        state.input_files = dict(self.hasher.used)
        with writing(state.path):
            state.save()
        return True

    def lock(self) -> None:
        """One build at a time in OUT: a second one is refused, it never waits."""
        self.out_lock.take()

    def close(self) -> None:
        self.out_lock.release()

    def run(self) -> Dict[str, Any]:
        # The stages name the files they write; what is left unnamed (the runner's
        # markers) is in the work folder.
        with writing(self.work):
            return self.runner.run(self.opts.stop_after)


def main(argv: Optional[Sequence[str]] = None) -> int:
    opts = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(name)s | %(message)s", stream=sys.stderr)
    build = Build(opts)
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
        path = e.filename or (opts.out if e.errno in WRITE_ERRNOS else None)
        if e.errno not in ENVIRONMENT_ERRNOS or not path:
            raise
        print(f"error: {path}: {environment_problem(e)}", file=sys.stderr)
        return 2
    except WorkerDied as e:
        # killed (out of memory?) or crashed in C code: what it finished is kept
        print(
            f"error: {opts.out}: {e}; rerun the same command to resume (with fewer --workers if memory ran out)",
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
    Options are the flags' names with ``_``; ``lowercase=False`` is ``--no-lowercase``
    (:meth:`BuildOptions.from_call`; both make the same :class:`BuildOptions`).
    """
    try:
        opts = BuildOptions.from_call(out, text=text, wiki=wiki, books=books, **options)
    except OptionsError as e:
        parser().error(str(e))  # as the command line: the usage line, exit status 2
    b = Build(opts)
    try:
        if b.prepare():
            b.run()
    finally:
        b.close()
    return Path(out)


if __name__ == "__main__":
    sys.exit(main())
