"""``scripts/gpu_check.sh`` / ``python -m seed_fairseq.workflows.gpucheck``: verify a CUDA machine in one command.

    OUT/.gpu_check        the tool's record: the folder is its own (a rerun replaces only its files)
    OUT/data-bin/         preprocess.build of the shipped demo corpus (reused by a rerun); not with
                          --data DIR, a preprocess.build folder read where it is (the device bundle's:
                          the Wikipedia sample, 32,768 pieces; scripts/device_bundle.sh)
    OUT/work/             SimLM's generator, the fairseq-train runs, the export (replaced by a rerun)
    OUT/gpu_check.json    everything measured, every check's status
    OUT/gpu_check.md      the same for people (docs/gpu.md explains each line)

The stages, each a parameter of one code path (``profile.py``):

1. data: ``--data DIR``, or ``preprocess.build`` of the demo corpus (repeated: enough blocks for the
   largest batch); the report states the vocabulary and where the text came from;
2. per objective of the registry and fairseq's ``masked_lm``, per precision: the largest batch that
   fits (``search.py``), then N updates (``runs.py``): losses finite and falling, loss-scale events,
   peak memory, words/s, FLOPs, MFU, the ratio to ``masked_lm``, the projection of the paper's run;
3. per objective and precision: one fixed batch against fp32 (loss and gradient norm within bands);
4. fairseq-train: 1 process x ``--update-freq 2`` and, with 2 devices, 2 processes (``checks.py``);
5. the HF export of that run, and HF vs fairseq on the device;
6. corpus encoding docs/s per precision; faiss-gpu vs faiss-cpu search.

With ``--budget-seconds`` the whole run ends inside the budget (``budget.py``): the training runs
share the time left, each takes as many updates as its share allows after measuring its own
update time in the batch search, and a check left without time is reported as *not run*.  The
report is rewritten after every check, so a run that is killed still leaves one (``RUNNING``).

Children (``fairseq-train``, ``torchrun`` and its workers) run in process groups of their own and
are stopped with gpu_check (``compare.interrupt``): on Ctrl-C, SIGTERM or SIGHUP, and when the
budget runs out.

Exit status: 0 all passed (or no CUDA device without --dry-run: one line says so), 1 a check
failed, 2 bad input (``error: FILE: problem``, before anything is written; also a data set that
cannot be built: non-UTF-8 text, a vocabulary the text cannot give, a full disk), 3 no check failed
but some were not run (out of time), 128 + N interrupted by signal N (the report says what ran).
"""

import argparse
import hashlib
import json
import math
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Optional

from ...base.errors import ENVIRONMENT_ERRNOS
from ...base.fileio import (
    OutputError,
    check_apart,
    check_out_path,
    check_output_dir,
    write_json_atomic,
    write_text_atomic,
)
from ..kit.interrupt import Interrupted, handle_interrupts
from . import report
from .budget import MIN_UPDATES, Budget, OutOfTime, updates_that_fit
from .profile import BASELINE, Profile, cuda_profile, dry_run_profile, generator_setup, setups
from .report import FAIL, NOT_RUN, PASS, SKIP, Check
from .search import largest_batch

TOOL = "seed_fairseq.gpucheck"
RECORD = ".gpu_check"
DEMO_CORPUS = Path(__file__).resolve().parents[3] / "examples" / "data" / "demo_corpus.txt"
# precision -> (loss, gradient norm) relative bands of the fixed-batch comparison with fp32:
# fp16 keeps 11 mantissa bits, bf16 8; a base model's loss in fp16 typically agrees to ~1e-3
BANDS = {"fp32": (1e-6, 1e-5), "fp16": (1e-2, 5e-2), "bf16": (3e-2, 1.5e-1)}
ENCODE_BATCH = {"cuda": 256, "cpu": 16}
DP_OBJECTIVE = "seed"  # the objective of the data-parallel check and the export (no in-batch terms)
MAX_VOCAB = 2**31 - 1  # sentencepiece's vocab_size is an int32
EXIT_NOT_RUN = 3  # no check failed, some were not run


class InputError(Exception):
    """Bad input found before anything is written: ``error: PATH: problem``, exit 2."""

    def __init__(self, path, problem: str):
        super().__init__(f"{path}: {problem}")


def say(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and status 2, the project's rule for bad input
        self.exit(2, f"error: {message}\n")


def _positive_number(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: not a number") from None
    if not math.isfinite(x) or x <= 0:
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number above 0")
    return x


def _int_in(low: int, high: int, why: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text}: not a whole number") from None
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"{text}: out of range ({why})")
        return n

    return parse


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = Parser(
        prog="gpu_check",
        description="Verify training, precision, data parallelism, export and search on this CUDA machine "
        "(no network); writes OUT/gpu_check.json and OUT/gpu_check.md. See docs/gpu.md.",
    )
    p.add_argument("--out", type=Path, default=Path("gpu_check_out"), help="output folder (default gpu_check_out)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="the same checks on the CPU at tiny shape (bf16 only: fp16 needs CUDA; gloo for NCCL, faiss-cpu twice)",
    )
    p.add_argument(
        "--updates",
        type=_int_in(MIN_UPDATES, 10**6, f"at least {MIN_UPDATES}: losses falling compares the first and last third"),
        default=None,
        help="updates per objective and precision (default 30; with --budget-seconds, at most this many)",
    )
    p.add_argument(
        "--peak-tflops", type=_positive_number, default=None, help="the device's dense peak (default: by its name)"
    )
    p.add_argument(
        "--budget-seconds",
        type=_positive_number,
        default=None,
        help="the whole run ends inside this many seconds: updates are chosen to fit, and a check left "
        "without time is reported as not run (exit 3 when nothing failed)",
    )
    p.add_argument("--objectives", default=None, help="comma-separated names (default: all, and masked_lm)")
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="a finished preprocess.build folder to train on (its vocabulary and text) instead of building one "
        "from --corpus",
    )
    p.add_argument(
        "--corpus",
        type=Path,
        default=DEMO_CORPUS,
        help="the text the data set is built from (UTF-8), and the documents encoded (default: the demo corpus)",
    )
    p.add_argument(
        "--vocab-size",
        type=_int_in(1, MAX_VOCAB, "sentencepiece takes 1 to 2^31 - 1; the text decides the real bounds"),
        default=None,
        help="sentencepiece pieces (default: 16384 on CUDA, 500 in the dry run)",
    )
    return p.parse_args(argv)


def check_corpus(path: Path) -> None:
    """:class:`InputError` unless ``path`` is a readable UTF-8 text file (checked before anything is written)."""
    if not path.is_file():
        raise InputError(path, "corpus not found (pass --corpus FILE)")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(path, f"cannot be read: {e.strerror}") from None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        problem = f"line {line}: not valid UTF-8 ({e.reason} at byte {e.start}); --corpus must be UTF-8 text"
        raise InputError(path, problem) from None
    if not data.strip():
        raise InputError(path, "is empty: --corpus needs text")


def check_data(path: Path) -> Dict:
    """The --data folder described for the report; :class:`InputError` unless it is a finished
    ``preprocess.build`` folder of one shard with every file its record lists (checked before anything
    is written)."""
    from preprocess.record import RECORD as BUILD_RECORD
    from preprocess.record import load_record, record_outputs

    usage = "--data takes the --out of python -m preprocess.build"
    if not path.is_dir():
        raise InputError(path, f"{'not a folder' if path.exists() else 'no such folder'}: {usage}")
    record = load_record(path)
    if record is None:
        raise InputError(path, f"no {BUILD_RECORD} of a finished build: {usage}")
    if record.get("shards", 1) != 1:
        raise InputError(path, f"a build of {record.get('shards')} shards: gpu_check reads one (build with --shards 1)")
    missing = [f for f in record_outputs(record) if not (path / f).is_file()]
    if missing:
        raise InputError(path / missing[0], f"listed in {BUILD_RECORD} but missing: an incomplete copy of the build")
    return describe_data(path, record, given=True)


def describe_data(folder: Path, record: Dict, given: bool) -> Dict:
    """What the report says of the data set: where it is, its vocabulary, the text it was built from."""
    pieces = (record.get("sentencepiece") or {}).get("vocab_size") or (record.get("config") or {}).get("vocab_size")
    sources = [
        {"kind": s.get("kind"), "file": Path(str(s.get("path", ""))).name, "sha256": s.get("sha256")}
        for s in record.get("sources") or []
        if isinstance(s, dict)
    ]
    return {
        "folder": str(folder),
        "given": given,  # --data, or built by this run
        "vocab_size": pieces,
        "dictionary": (record.get("fairseq_dictionary") or {}).get("size_with_specials"),
        "sources": sources,
        "train_tokens": ((record.get("splits") or {}).get("train0") or {}).get("tokens"),
    }


def fail_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


class GpuCheck:
    def __init__(
        self,
        profile: Profile,
        out: Path,
        corpus: Path,
        only: Optional[List[str]],
        budget: Optional[Budget] = None,
        data: Optional[Dict] = None,
    ):
        self.p, self.out, self.corpus, self.only = profile, out, corpus, only
        self.budget = budget or Budget(None)
        self.start = time.time()
        self.work = out / "work"
        # --data (check_data's description), or the data set this run builds from the corpus
        self.data_info = data or {}
        self.data = Path(data["folder"]) if data else out / "data-bin"
        self.checks: List[Check] = []
        self.objectives: Dict[str, Dict] = {}
        self.first_updates: Dict[tuple, Dict[str, float]] = {}
        self.found_batch: Dict[str, int] = {}  # objective -> the batch its first precision found
        self.planned: List[str] = []  # every check's name, in order (set by run)
        self.cheapest_run: Optional[float] = None  # seconds of the quickest training run (and comparison) so far

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        say(f"{check.status.upper()} {check.name}: {check.detail}")
        self.write_report(running=True)  # a killed run still leaves the checks it finished
        return check

    def report(self, running: bool = False) -> Dict:
        result = report.build(
            self.p, self.checks, self.objectives, time.time() - self.start, self.budget.seconds, running=running
        )
        result["encoding"] = getattr(self, "encoding_results", {})
        result["data"] = self.data_info
        return result

    def write_report(self, running: bool = False) -> Dict:
        result = self.report(running)
        report.write(self.out, result)
        return result

    def not_run(self, why: str) -> None:
        """Every planned check that has no line yet: ``not run`` with ``why``."""
        done = {c.name for c in self.checks}
        missing = [name for name in self.planned if name not in done]
        for name in missing:
            self.checks.append(Check(name, NOT_RUN, why))
        if missing:
            say(f"NOT RUN {len(missing)} checks: {why}")

    def attempt(self, name: str, fn: Callable[..., Check], *args) -> Optional[Check]:
        """``fn(*args)``'s check; an exception is this check failing (the others still run); no time
        left before or during it, ``not run``."""
        from .checks import CheckFailed
        from .runs import Unsupported

        try:
            with self.budget.deadline(name):
                return self.add(fn(*args))
        except OutOfTime as e:
            return self.add(Check(name, NOT_RUN, str(e)))
        except Unsupported as e:
            return self.add(Check(name, SKIP, str(e)))
        except CheckFailed as e:
            return self.add(Check(name, FAIL, str(e)))
        except Exception as e:  # noqa: BLE001  (a crash of one check is its failure, reported with the rest)
            with open(self.work / "tracebacks.log", "a", encoding="utf-8") as f:
                f.write(f"== {name}\n{traceback.format_exc()}\n")
            return self.add(Check(name, FAIL, f"{fail_line(e)} (traceback: {self.work / 'tracebacks.log'})"))

    # ---- stages ----
    def build_data(self) -> None:
        from preprocess.build import build

        text = self.corpus
        if self.p.corpus_copies > 1:
            text = self.work / "corpus.txt"
            body = self.corpus.read_text(encoding="utf-8").rstrip("\n")
            write_text_atomic(text, "\n\n".join([body] * self.p.corpus_copies) + "\n")
        say(f"data: preprocess.build of {text} -> {self.data}")
        # one paragraph per line: sentence splitting needs blingfire (a 40 MB wheel, not on the GPU image nor
        # in the device bundle); with --sample-break-mode none the blocks are the same token stream either way
        build(
            self.data,
            text=[text],
            vocab_size=self.p.vocab_size,
            valid_docs=3,
            test_docs=2,
            workers=1,
            line_unit="paragraph",
        )
        from preprocess.record import load_record

        self.data_info = describe_data(self.data, load_record(self.data) or {}, given=False)
        digest = hashlib.sha256(self.corpus.read_bytes()).hexdigest()  # the text before its copies
        self.data_info.update(sources=[{"kind": "text", "file": self.corpus.name, "sha256": digest}])
        self.data_info["copies"] = self.p.corpus_copies

    def make_generator(self) -> Check:
        from .runs import save_generator

        path = self.work / "generator.pt"
        g = generator_setup(self.p)
        save_generator(self.data, self.p.train_args(list(g.args), self.p.reference, 2, 1), self.p.device, path)
        return Check("generator", PASS, f"SimLM's frozen generator (untrained, {' '.join(g.args[5:])}): {path}")

    def train_objective(self, name: str, setup: List[str], precision: str, share: float = math.inf) -> Check:
        """The batch search, then as many updates (up to ``p.updates``) as ``share`` seconds allow after
        the search, with room for the fixed-batch comparison that follows."""
        from .runs import fits, train

        check_name = f"train {name} {precision}"
        until = time.monotonic() + share
        probe_args = self.p.train_args(setup, precision, self.p.batch_start, self.p.updates)
        probe = fits(self.data, probe_args, self.p.device)
        # the second precision starts where the first one ended (16-bit activations either way): one probe
        start = self.found_batch.get(name, self.p.batch_start)
        limit = start if name in self.found_batch else self.p.batch_limit
        try:
            batch, tried = largest_batch(probe, start, limit, self.p.batch_probes)
        finally:
            probe.close()
        entry = self.objectives.setdefault(name, {}).setdefault("training", {})
        if batch == 0:
            entry[precision] = {"batch": 0, "search": tried}
            return Check(check_name, FAIL, f"no batch fits (tried {tried})")
        self.found_batch.setdefault(name, batch)
        updates = self.p.updates
        if self.budget.limited:
            build, step = probe.timings.get("build", 0.0), probe.timings.get(batch, 0.0)
            compare = (build + step) * (1 if (name, self.p.reference) in self.first_updates else 2)
            # the run's own build and its first update, counted under FlopCounterMode (slower), then the rest
            overhead = build + 3 * step
            updates = updates_that_fit(until - time.monotonic() - compare, step, overhead, self.p.updates)
            if not updates:
                # its share holds fewer than the minimum: the minimum, if what is left of the whole budget
                # holds it (the runs after it get less; the last ones may not run, rather than all of them)
                whole = self.budget.left() - self.p.tail_seconds
                updates = updates_that_fit(whole - compare, step, overhead, MIN_UPDATES)
                until = time.monotonic() + whole
                if not updates:
                    entry[precision] = {"batch": batch, "search": tried}
                    raise OutOfTime(
                        f"not run: {max(0.0, whole):.0f} s of the time budget were left for the training runs "
                        f"after its batch search: fewer than {MIN_UPDATES} updates of {step:.2f} s (batch {batch}) "
                        "and the fixed-batch check"
                    )
            until -= compare
        args = self.p.train_args(setup, precision, batch, updates)
        t = train(self.data, args, self.p.device, updates, batch, until=until if self.budget.limited else None)
        peak = self.p.peak(precision)
        values = {
            "batch": batch,
            "updates": t.updates,
            "updates_planned": updates,
            "stopped_early": t.stopped_early,
            "search": tried,
            "losses": t.losses,
            "gnorms": t.gnorms,
            "loss_scales": t.loss_scales,
            "overflows": t.overflows,
            "loss_scale_changes": sum(1 for a, b in zip(t.loss_scales, t.loss_scales[1:]) if a != b),
            "peak_memory": t.peak_memory,
            "words_per_second": t.words_per_second,
            "seconds_per_update": t.seconds / max(1, t.updates - 1),
            "flops_per_token": t.flops_per_token,
            "flops_per_update": t.flops_per_update,
            "tokens_per_update": t.tokens_per_update,
            "mfu": t.mfu(peak),
            "peak_tflops": peak,
        }
        entry[precision] = values
        problems = []
        if not t.finite:
            problems.append("non-finite loss")
        elif not t.falling:
            problems.append("loss not falling")
        if t.overflows >= t.updates // 2:
            problems.append(f"{t.overflows} of {t.updates} updates overflowed")
        mem = f"{t.peak_memory / 1e9:.2f} GB" if t.peak_memory else "-"
        detail = (
            f"batch {batch} x {self.p.tokens_per_sample}; loss {t.losses[0]:.3f} -> {t.losses[-1]:.3f}; "
            f"{t.overflows} overflows; peak {mem}; {t.words_per_second:,.0f} words/s"
            + (f"; MFU {values['mfu']:.1%}" if values["mfu"] is not None else "")
            + f"; {t.updates} updates"
            + (" (its share of the time budget ended)" if t.stopped_early else "")
        )
        return Check(check_name, FAIL if problems else PASS, "; ".join(problems + [detail]), {"batch": batch})

    def compare_precision(self, name: str, setup: List[str], precision: str) -> Check:
        from .runs import one_batch

        batch = max(2, min(self.p.batch_start, 8))

        def first_update(p: str) -> Dict[str, float]:  # once per objective and precision (fp32: for every other)
            key = (name, p)
            if key not in self.first_updates:
                args = self.p.train_args(setup, p, batch, 1, dropout=False)
                self.first_updates[key] = one_batch(self.data, args, self.p.device)
            return self.first_updates[key]

        ref, got = first_update(self.p.reference), first_update(precision)
        loss_band, gnorm_band = BANDS[precision]
        rel = {k: abs(got[k] - ref[k]) / max(abs(ref[k]), 1e-12) for k in ("loss", "gnorm")}
        values = {"reference": ref, precision: got, "relative_difference": rel, "bands": [loss_band, gnorm_band]}
        self.objectives.setdefault(name, {}).setdefault("fixed_batch", {})[precision] = values
        ok = rel["loss"] <= loss_band and rel["gnorm"] <= gnorm_band
        detail = (
            f"loss {got['loss']:.4f} vs {ref['loss']:.4f} (rel {rel['loss']:.1e} <= {loss_band:g}), "
            f"gnorm {got['gnorm']:.4f} vs {ref['gnorm']:.4f} (rel {rel['gnorm']:.1e} <= {gnorm_band:g})"
        )
        return Check(f"{precision} vs {self.p.reference} {name}", PASS if ok else FAIL, detail, values)

    def ratios_and_projection(self) -> None:
        base = self.objectives.get(BASELINE, {}).get("training", {})
        first = self.p.precisions[0]
        for entry in self.objectives.values():
            for precision, r in entry.get("training", {}).items():
                b = base.get(precision, {})
                if b.get("words_per_second") and r.get("words_per_second"):
                    r["speed_vs_masked_lm"] = r["words_per_second"] / b["words_per_second"]
                if b.get("flops_per_token") and r.get("flops_per_token"):
                    r["flops_vs_masked_lm"] = r["flops_per_token"] / b["flops_per_token"]
                if b.get("peak_memory") and r.get("peak_memory"):
                    r["memory_vs_masked_lm"] = r["peak_memory"] / b["peak_memory"]
            r = entry.get("training", {}).get(first)
            if r and r.get("flops_per_token"):
                entry["projection"] = report.projection(
                    r["flops_per_token"], r.get("words_per_second"), self.p.peak(first)
                )

    def data_parallel(self) -> Check:
        from .checks import one_process, two_processes_equal

        setup = self.setup_args[DP_OBJECTIVE]
        batch = 4 if self.p.tiny else 8
        processes = 2 if self.p.dry_run else min(2, self.p.gpus)
        ddp = "legacy_ddp" if self.p.device == "cpu" else "pytorch_ddp"
        args = [*setup, *self.p.train_args([], self.p.reference, batch, 1)]
        args = _without(args, ("--optimizer", "--lr", "--lr-scheduler", "--clip-norm", "--weight-decay"))
        args = _without(args, ("--adam-betas", "--adam-eps", "--warmup-updates", "--total-num-update", "--max-update"))
        args = _without(args, ("--batch-size",))
        atol, rtol = (1e-6, 1e-4) if self.p.device == "cpu" else (1e-5, 1e-3)
        dp_dir = self.work / "data-parallel"
        dp_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint = one_process(self.data, dp_dir, args, batch, say)  # also the export's checkpoint
        if processes < 2:
            return Check(
                "data parallel", SKIP, f"{self.p.gpus} GPU: the 2-process run needs 2 (1 process x --update-freq 2 ran)"
            )
        got = two_processes_equal(self.data, dp_dir, args, batch, self.checkpoint, self.p.backend, ddp, say, atol, rtol)
        return Check(
            "data parallel",
            PASS,
            f"2 processes ({self.p.backend}) = 1 process x --update-freq 2: weights within {atol:g} + {rtol:g} x |w| "
            f"(worst excess {got['max_excess']:.2g})",
            got,
        )

    def export(self) -> Check:
        from .checks import export_and_compare

        if getattr(self, "checkpoint", None) is None or not self.checkpoint.is_file():
            return Check("HF export", SKIP, "no checkpoint: the fairseq-train run of the data-parallel check failed")
        texts = self.documents()[:8]
        atol = 1e-4 if self.p.device == "cpu" else 1e-3
        self.export_dir = self.work / "hf"
        got = export_and_compare(self.checkpoint, self.data, self.export_dir, self.p.device, texts, atol)
        return Check(
            "HF export",
            PASS,
            f"exported {DP_OBJECTIVE}; HF = fairseq on {self.p.device}: "
            f"max abs diff {got['max_abs_diff']:.2g} <= {atol:g}",
            got,
        )

    def documents(self) -> List[str]:
        text = self.corpus.read_text(encoding="utf-8")
        docs = [" ".join(p.strip() for p in d.splitlines() if p.strip()) for d in text.split("\n\n") if d.strip()]
        return docs

    def encoding(self, precision: str) -> Check:
        from .checks import encode_corpus

        if getattr(self, "export_dir", None) is None:
            return Check(f"encode {precision}", SKIP, "no exported model (the export failed)")
        docs = self.documents()
        docs = (docs * (self.p.encode_docs // max(1, len(docs)) + 1))[: self.p.encode_docs]
        got = encode_corpus(self.export_dir, self.p.device, docs, precision, ENCODE_BATCH[self.p.device])
        self.embeddings = got.pop("embeddings")
        self.encoding_results = getattr(self, "encoding_results", {})
        self.encoding_results[precision] = got
        return Check(
            f"encode {precision}", PASS, f"{got['docs_per_second']:,.1f} docs/s ({got['docs']} documents)", got
        )

    def faiss(self) -> Check:
        from .checks import faiss_cpu_available, faiss_equal, faiss_gpu_available

        if getattr(self, "embeddings", None) is None:
            return Check("faiss", SKIP, "no embeddings (the encoding failed)")
        why = faiss_gpu_available() if self.p.device == "cuda" else faiss_cpu_available()
        if why:  # the lent GPU machine's image has no faiss, nor does its bundle
            return Check("faiss", SKIP, why)
        got = faiss_equal(self.embeddings, use_gpu=self.p.device == "cuda")
        other = "faiss-gpu" if self.p.device == "cuda" else "a second faiss-cpu index"
        return Check(
            "faiss",
            PASS,
            f"{other} = faiss-cpu: {got['ids_equal']:.0%} of top-{got['k']} ids equal, scores within "
            f"{got['score_max_abs_diff']:.1g}",
            got,
        )

    def prepare(self) -> None:
        """The scratch folder and the data set: ``PreprocessError`` / ``OutputError`` for data that cannot
        be built, ``OSError`` for a full disk or another error of the machine."""
        if self.work.exists():
            shutil.rmtree(self.work)  # this tool's own scratch folder (the record says the folder is ours)
        self.work.mkdir(parents=True)
        if self.data_info.get("given"):
            say(f"data: {self.data} (--data), {self.data_info['vocab_size']} pieces")
        else:
            self.build_data()

    def run(self) -> Dict:
        generator = self.work / "generator.pt"
        all_setups = setups(self.p, str(generator))
        self.setup_args = {s.name: list(s.args) for s in all_setups}
        chosen = [s for s in all_setups if (s.name in self.only if self.only else s.default) or s.name == BASELINE]
        # precision by precision: the first (fp16 on CUDA, the papers') for every objective before the next,
        # so that a short budget leaves out the second precision's runs, not the papers' one
        runs = [(s, precision) for precision in self.p.precisions for s in chosen]
        ref = self.p.reference
        self.planned = [
            "generator",
            *[f"train {p}" for p in self.p.skipped_precisions],
            *[n for s, p in runs for n in (f"train {s.name} {p}", f"{p} vs {ref} {s.name}")],
            "data parallel",
            "HF export",
            *[f"encode {p}" for p in self.p.precisions],
            "faiss",
        ]
        got = self.attempt("generator", self.make_generator)
        for precision, why in self.p.skipped_precisions.items():
            self.add(Check(f"train {precision}", SKIP, why))
        for i, (s, precision) in enumerate(runs):
            if "--generator-path" in s.args and got.status != PASS:
                for name in (f"train {s.name} {precision}", f"{precision} vs {ref} {s.name}"):
                    self.add(Check(name, FAIL, "no generator (see the generator check)"))
                continue
            # this run's share of what is left; the checks after the training runs keep their time
            share = self.budget.share(len(runs) - i, self.p.tail_seconds)
            began = time.monotonic()
            quickest = self.cheapest_run
            if quickest is not None and self.budget.left() - self.p.tail_seconds < quickest:  # why search then
                why = f"{self.budget.out_of_time('it')}: the quickest training run so far took {quickest:.0f} s"
                self.add(Check(f"train {s.name} {precision}", NOT_RUN, why))
                self.add(Check(f"{precision} vs {ref} {s.name}", NOT_RUN, "not run: no time was left for its training"))
                continue
            trained = self.attempt(
                f"train {s.name} {precision}", self.train_objective, s.name, list(s.args), precision, share
            )
            compare = f"{precision} vs {ref} {s.name}"
            if trained is not None and trained.status == NOT_RUN:  # its time went: the comparison's too
                self.add(Check(compare, NOT_RUN, f"not run: no time was left for its training run ({trained.detail})"))
                continue
            self.attempt(compare, self.compare_precision, s.name, list(s.args), precision)
            took = time.monotonic() - began
            self.cheapest_run = took if quickest is None else min(quickest, took)
        self.ratios_and_projection()
        self.attempt("data parallel", self.data_parallel)
        self.attempt("HF export", self.export)
        for precision in self.p.precisions:
            self.attempt(f"encode {precision}", self.encoding, precision)
        self.attempt("faiss", self.faiss)
        return self.write_report()


def _without(args: List[str], options) -> List[str]:
    """``args`` without each of ``options`` and the value after it."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in options:
            skip = True
        else:
            out.append(a)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    budget = Budget(args.budget_seconds)  # from the start: imports and the data set count too
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(
            f"gpu_check: no CUDA device on this machine (torch {torch.__version__}): nothing to check; "
            "--dry-run runs the same checks on the CPU at tiny shape"
        )
        return 0
    try:
        check_corpus(args.corpus)
        data = check_data(args.data) if args.data else None
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if data and args.vocab_size and args.vocab_size != data["vocab_size"]:
        print(f"error: --vocab-size {args.vocab_size}: --data {args.data} has {data['vocab_size']} pieces; "
              "leave --vocab-size out", file=sys.stderr)  # fmt: skip
        return 2
    only = [n.strip() for n in args.objectives.split(",") if n.strip()] if args.objectives else None
    if only:
        known = [s.name for s in setups(dry_run_profile(), "generator.pt")]
        unknown = [n for n in only if n not in known]
        if unknown:
            print(f"error: --objectives: unknown {', '.join(unknown)}; choose from {','.join(known)}", file=sys.stderr)
            return 2
    try:
        check_out_path(args.out)
        check_apart(args.out, [("--corpus", args.corpus), ("--data", args.data)], TOOL)
        check_output_dir(args.out, RECORD, TOOL)
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        profile = dry_run_profile(args.peak_tflops)
    else:
        profile = cuda_profile(args.updates or 30, args.peak_tflops)
    if args.updates:
        profile.updates = args.updates
    if args.vocab_size:
        profile.vocab_size = args.vocab_size
    if data:
        profile.vocab_size, profile.corpus_copies = data["vocab_size"], 0
    check = GpuCheck(profile, args.out, args.corpus, only, budget, data)
    with handle_interrupts():
        try:
            return _run(check, args, profile, budget)
        except Interrupted as e:
            name = signal.Signals(e.signum).name
            check.not_run(f"not run: gpu_check was interrupted ({name})")
            if args.out.is_dir():
                check.write_report()
            where = args.out / report.MARKDOWN_NAME
            print(f"interrupted ({name}); the report lists what ran: {where}", file=sys.stderr)
            return e.exit_code


def _run(check: GpuCheck, args: argparse.Namespace, profile: Profile, budget: Budget) -> int:
    from preprocess.errors import PreprocessError, environment_problem

    try:
        args.out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(
            args.out / RECORD, {"tool": TOOL, "files": ["data-bin", "work", report.JSON_NAME, report.MARKDOWN_NAME]}
        )
        budget_text = f"; budget {budget.seconds:g} s" if budget.limited else ""
        say(f"{profile.device_name} x {max(1, profile.gpus)}: precisions {', '.join(profile.precisions)}; "
            f"out {args.out}{budget_text}")  # fmt: skip
        with budget.deadline("the data set"):
            check.prepare()
    except (PreprocessError, OutputError) as e:  # "PATH: problem": text the data set cannot be built from
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, the file-size limit, permissions: one line naming the file
        if e.errno not in ENVIRONMENT_ERRNOS:
            raise
        print(f"error: {e.filename or args.out}: {environment_problem(e)}", file=sys.stderr)
        return 2
    except OutOfTime as e:
        print(f"error: {args.out}: the data set was not built within the time budget ({e})", file=sys.stderr)
        return EXIT_NOT_RUN
    result = check.run()
    if result["failed"]:
        status = f"FAILED: {', '.join(result['failed'])}"
    elif result["not_run"]:
        status = f"INCOMPLETE: not run (out of time): {', '.join(result['not_run'])}"
    else:
        status = "passed"
    say(f"{status}; report {args.out / report.MARKDOWN_NAME}")
    summary = {"passed": result["passed"], "failed": result["failed"], "not_run": result["not_run"]}
    print(json.dumps({**summary, "report": str(args.out / report.JSON_NAME)}))
    if result["failed"]:
        return 1
    return EXIT_NOT_RUN if result["not_run"] else 0
