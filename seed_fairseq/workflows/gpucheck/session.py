"""One gpu_check run: its checks in order (``GpuCheck``), each written to the report as it ends
(the command line: ``cli.py``; what it reads first: ``inputs.py``)."""

import hashlib
import math
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Optional

from ...base.fileio import write_text_atomic
from ..kit.argv import DEFAULT_OPTIMIZER, without_options
from . import report
from .budget import MIN_UPDATES, Budget, OutOfTime, profile_seconds, updates_that_fit
from .inputs import describe_data
from .profile import FAIRSEQ_BASELINE, REFERENCE, Profile, generator_setup, setups
from .report import FAIL, NOT_RUN, PASS, SKIP, Check
from .search import largest_batch
from .training import MIN_MEASURED

BANDS = {"fp32": (1e-6, 1e-5), "fp16": (1e-2, 5e-2), "bf16": (3e-2, 1.5e-1)}
ENCODE_BATCH = {"cuda": 256, "cpu": 16}
DP_OBJECTIVE = "seed"  # the objective of the data-parallel check and the export (no in-batch terms)


def say(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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
        kernel_profile: bool = True,
    ):
        self.p, self.out, self.corpus, self.only = profile, out, corpus, only
        self.kernel_profile = kernel_profile  # --profile: each run's kernel profile (kernels.py), time allowing
        self.kernel_profiles: List[Dict] = []  # one entry per training run, in order
        self.summing = profile.profile_seconds_per_update  # reading a profiled update's events: the last one's
        self.budget = budget or Budget(None)
        self.start = time.time()
        self.work = out / "work"
        # --data (check_data's description), or the data set this run builds from the corpus
        self.data_info = data or {}
        self.data = Path(data["folder"]) if data else out / "data-bin"
        self.checks: List[Check] = []
        self.objectives: Dict[str, Dict] = {}
        self.first_updates: Dict[tuple, Dict[str, float]] = {}
        self.found_batch: Dict[tuple, int] = {}  # a model's options -> the batch its first precision found
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
        result["kernel_profile"] = report.kernel_section(self.kernel_profiles)
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
        save_generator(self.data, self.p.run_args(list(g.args), self.p.reference, 2, 1), self.p.device, path)
        return Check("generator", PASS, f"SimLM's frozen generator (untrained, {' '.join(g.args[5:])}): {path}")

    def train_objective(
        self, name: str, setup: List[str], precision: str, share: float = math.inf, optimizer: Optional[str] = None
    ) -> Check:
        """The batch search, then as many updates (up to ``p.updates``) as ``share`` seconds allow after
        the search, with room for the fixed-batch comparison that follows and the kernel profile (which
        gives way first)."""
        from .runs import fits, train

        check_name = f"train {name} {precision}"
        until = time.monotonic() + share
        profiled = (self.p.profile_updates, self.p.profile_warmup) if self.kernel_profile else None
        why = "not run: --no-profile"
        record = {"objective": name, "precision": precision, "optimizer": optimizer or DEFAULT_OPTIMIZER}
        self.kernel_profiles.append(dict(record, status="not run", detail="not run: its training did not run"))
        probe_args = self.p.run_args(setup, precision, self.p.batch_start, self.p.updates, optimizer=optimizer)
        probe = fits(self.data, probe_args, self.p.device)
        # the second precision starts where the first one ended (16-bit activations either way), and the same
        # model with another optimizer where it did: one probe
        key = tuple(setup)
        start = self.found_batch.get(key, self.p.batch_start)
        limit = start if key in self.found_batch else self.p.batch_limit
        try:
            batch, tried = largest_batch(probe, start, limit, self.p.batch_probes)
        finally:
            probe.close()
        entry = self.objectives.setdefault(name, {}).setdefault("training", {})
        if batch == 0:
            entry[precision] = {"batch": 0, "search": tried}
            return Check(check_name, FAIL, f"no batch fits (tried {tried})")
        self.found_batch.setdefault(key, batch)
        updates = self.p.updates
        if self.budget.limited:
            build, step = probe.timings.get("build", 0.0), probe.timings.get(batch, 0.0)
            # the fixed-batch comparison's runs (none for another optimizer's run: its first update is the same)
            compare = (build + step) * (1 if (name, self.p.reference) in self.first_updates else 2)
            compare = 0.0 if optimizer else compare
            # the run's own build and its first update, counted under FlopCounterMode (slower), then the rest
            overhead = build + 3 * step
            extra = profile_seconds(step, *profiled, self.summing) if profiled else 0.0
            # the profile gives way to a steady words/s: it is taken when the share also holds the updates
            # measured after warm-up (training.py), else the run takes what its share holds without it
            steady = max(MIN_UPDATES, 1 + self.p.measure_warmup + MIN_MEASURED)
            left = until - time.monotonic() - compare
            updates = updates_that_fit(left, step, overhead + extra, self.p.updates, steady) if profiled else 0
            if not updates:
                if profiled:
                    profiled, why = None, f"not run: the time budget left no room for it ({extra:.1f} s estimated)"
                updates = updates_that_fit(left, step, overhead, self.p.updates)
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
        args = self.p.run_args(setup, precision, batch, updates, optimizer=optimizer)
        limit = until if self.budget.limited else None
        t = train(self.data, args, self.p.device, updates, batch, limit, warmup=self.p.measure_warmup, profile=profiled)
        self.kernel_profiles[-1] = dict(record, **(t.profile or {"status": "not run", "detail": why}))
        if t.profile and t.profile.get("status") == "ok":  # the next runs' estimate: this one's reading
            self.summing = t.profile["summing_seconds"] / t.profile["updates"]
        values = t.values(updates, tried, record["optimizer"], self.p.peak(precision))
        entry[precision] = values
        problems = t.problems(updates)
        scales = f" (loss scale {t.loss_scales[0]:g} -> {t.loss_scales[-1]:g})" if t.overflows and t.loss_scales else ""
        mem = f"{t.peak_memory / 1e9:.2f} GB" if t.peak_memory else "-"
        loss = f"loss {t.losses[0]:.3f} -> {t.losses[-1]:.3f}" if t.losses else "no loss"
        detail = (
            f"batch {batch} x {self.p.tokens_per_sample}; {loss}; "
            f"{t.overflows} overflows{scales}; peak {mem}; {t.words_per_second:,.0f} words/s"
            + t.speed_note()
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
                args = self.p.run_args(setup, p, batch, 1, dropout=False)
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

    def data_parallel(self) -> Check:
        from .checks import one_process, two_processes_equal

        setup = self.setup_args[DP_OBJECTIVE]
        batch = 4 if self.p.tiny else 8
        processes = 2 if self.p.dry_run else min(2, self.p.gpus)
        ddp = "legacy_ddp" if self.p.device == "cpu" else "pytorch_ddp"
        args = [*setup, *self.p.run_args([], self.p.reference, batch, 1)]
        args = without_options(args, ("--optimizer", "--lr", "--lr-scheduler", "--clip-norm", "--weight-decay"))
        args = without_options(args, ("--adam-betas", "--adam-eps", "--warmup-updates", "--total-num-update"))
        args = without_options(args, ("--max-update", "--batch-size"))
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
        # fairseq's masked_lm, and it with fairseq's adam when that is not the default
        always = (FAIRSEQ_BASELINE, REFERENCE)
        chosen = [s for s in all_setups if (s.name in self.only if self.only else s.default) or s.name in always]
        # precision by precision: the first (fp16 on CUDA, the papers') for every objective before the next,
        # so that a short budget leaves out the second precision's runs, not the papers' one
        runs = [(s, precision) for precision in self.p.precisions for s in chosen]
        ref = self.p.reference

        def names(s, p):  # its training; the fixed batch's first update does not depend on the optimizer
            return [f"train {s.name} {p}"] + ([f"{p} vs {ref} {s.name}"] if s.optimizer is None else [])

        self.planned = [
            "generator",
            *[f"train {p}" for p in self.p.skipped_precisions],
            *[n for s, p in runs for n in names(s, p)],
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
                for name in names(s, precision):
                    self.add(Check(name, FAIL, "no generator (see the generator check)"))
                continue
            # this run's share of what is left; the checks after the training runs keep their time
            share = self.budget.share(len(runs) - i, self.p.tail_seconds)
            began = time.monotonic()
            quickest = self.cheapest_run
            if quickest is not None and self.budget.left() - self.p.tail_seconds < quickest:  # why search then
                why = f"{self.budget.out_of_time('it')}: the quickest training run so far took {quickest:.0f} s"
                self.add(Check(f"train {s.name} {precision}", NOT_RUN, why))
                for compare in names(s, precision)[1:]:
                    self.add(Check(compare, NOT_RUN, "not run: no time was left for its training"))
                continue
            trained = self.attempt(
                f"train {s.name} {precision}", self.train_objective, s.name, list(s.args), precision, share, s.optimizer
            )
            if trained is not None and trained.status == NOT_RUN:  # its time went: the comparison's too
                why = f"not run: no time was left for its training run ({trained.detail})"
                for compare in names(s, precision)[1:]:
                    self.add(Check(compare, NOT_RUN, why))
                continue
            for compare in names(s, precision)[1:]:
                self.attempt(compare, self.compare_precision, s.name, list(s.args), precision)
            took = time.monotonic() - began
            self.cheapest_run = took if quickest is None else min(quickest, took)
        report.ratios_and_projection(self.objectives, FAIRSEQ_BASELINE, self.p.precisions[0], self.p.peak)
        self.attempt("data parallel", self.data_parallel)
        self.attempt("HF export", self.export)
        for precision in self.p.precisions:
            self.attempt(f"encode {precision}", self.encoding, precision)
        self.attempt("faiss", self.faiss)
        return self.write_report()
