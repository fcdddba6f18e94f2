"""``scripts/gpu_check.sh`` / ``python -m seed_fairseq.gpucheck``: verify a CUDA machine in one command.

    OUT/.gpu_check        the tool's record: the folder is its own (a rerun replaces only its files)
    OUT/data-bin/         preprocess.build of the shipped demo corpus (reused by a rerun)
    OUT/work/             SimLM's generator, the fairseq-train runs, the export (replaced by a rerun)
    OUT/gpu_check.json    everything measured, every check's status
    OUT/gpu_check.md      the same for people (docs/gpu.md explains each line)

The stages, each a parameter of one code path (``profile.py``):

1. data: ``preprocess.build`` of the demo corpus (repeated: enough blocks for the largest batch);
2. per objective of the registry and fairseq's ``masked_lm``, per precision: the largest batch that
   fits (``search.py``), then N updates (``runs.py``): losses finite and falling, loss-scale events,
   peak memory, words/s, FLOPs, MFU, the ratio to ``masked_lm``, the projection of the paper's run;
3. per objective and precision: one fixed batch against fp32 (loss and gradient norm within bands);
4. fairseq-train: 1 process x ``--update-freq 2`` and, with 2 devices, 2 processes (``checks.py``);
5. the HF export of that run, and HF vs fairseq on the device;
6. corpus encoding docs/s per precision; faiss-gpu vs faiss-cpu search.

Exit status: 0 all passed (or no CUDA device without --dry-run: one line says so), 1 a check
failed, 2 bad input (``error: FILE: problem``).
"""

import argparse
import json
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Optional

from ..fileio import OutputError, check_output_dir, write_json_atomic, write_text_atomic
from . import report
from .profile import BASELINE, Profile, cuda_profile, dry_run_profile, generator_setup, setups
from .report import FAIL, PASS, SKIP, Check
from .search import largest_batch

TOOL = "seed_fairseq.gpucheck"
RECORD = ".gpu_check"
DEMO_CORPUS = Path(__file__).resolve().parents[2] / "examples" / "data" / "demo_corpus.txt"
# precision -> (loss, gradient norm) relative bands of the fixed-batch comparison with fp32:
# fp16 keeps 11 mantissa bits, bf16 8; a base model's loss in fp16 typically agrees to ~1e-3
BANDS = {"fp32": (1e-6, 1e-5), "fp16": (1e-2, 5e-2), "bf16": (3e-2, 1.5e-1)}
ENCODE_BATCH = {"cuda": 256, "cpu": 16}
DP_OBJECTIVE = "seed"  # the objective of the data-parallel check and the export (no in-batch terms)


def say(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
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
    p.add_argument("--updates", type=int, default=None, help="updates per objective and precision (default 30)")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's dense peak (default: by its name)")
    p.add_argument("--objectives", default=None, help="comma-separated names (default: all, and masked_lm)")
    p.add_argument("--corpus", type=Path, default=DEMO_CORPUS, help="the text the data set is built from")
    p.add_argument(
        "--vocab-size", type=int, default=None, help="sentencepiece pieces (default: 16384 on CUDA, 500 in the dry run)"
    )
    args = p.parse_args(argv)
    if args.updates is not None and args.updates < 3:
        p.error("--updates must be at least 3 (losses falling compares the first and last third)")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        p.error("--peak-tflops must be positive")
    return args


def fail_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


class GpuCheck:
    def __init__(self, profile: Profile, out: Path, corpus: Path, only: Optional[List[str]]):
        self.p, self.out, self.corpus, self.only = profile, out, corpus, only
        self.work = out / "work"
        self.data = out / "data-bin"
        self.checks: List[Check] = []
        self.objectives: Dict[str, Dict] = {}
        self.first_updates: Dict[tuple, Dict[str, float]] = {}

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        say(f"{check.status.upper()} {check.name}: {check.detail}")
        return check

    def attempt(self, name: str, fn: Callable[..., Check], *args) -> Optional[Check]:
        """``fn(*args)``'s check; an exception is this check failing (the others still run)."""
        from .checks import CheckFailed
        from .runs import Unsupported

        try:
            return self.add(fn(*args))
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
        build(self.data, text=[text], vocab_size=self.p.vocab_size, valid_docs=3, test_docs=2, workers=1)

    def make_generator(self) -> Check:
        from .runs import save_generator

        path = self.work / "generator.pt"
        g = generator_setup(self.p)
        save_generator(self.data, self.p.train_args(list(g.args), self.p.reference, 2, 1), self.p.device, path)
        return Check("generator", PASS, f"SimLM's frozen generator (untrained, {' '.join(g.args[5:])}): {path}")

    def train_objective(self, name: str, setup: List[str], precision: str) -> Check:
        from .runs import fits, train

        check_name = f"train {name} {precision}"
        probe_args = self.p.train_args(setup, precision, self.p.batch_start, self.p.updates)
        probe = fits(self.data, probe_args, self.p.device)
        try:
            batch, tried = largest_batch(probe, self.p.batch_start, self.p.batch_limit, self.p.batch_probes)
        finally:
            probe.close()
        entry = self.objectives.setdefault(name, {}).setdefault("training", {})
        if batch == 0:
            entry[precision] = {"batch": 0, "search": tried}
            return Check(check_name, FAIL, f"no batch fits (tried {tried})")
        args = self.p.train_args(setup, precision, batch, self.p.updates)
        t = train(self.data, args, self.p.device, self.p.updates, batch)
        peak = self.p.peak(precision)
        values = {
            "batch": batch,
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
        from .checks import faiss_equal, faiss_gpu_available

        if getattr(self, "embeddings", None) is None:
            return Check("faiss", SKIP, "no embeddings (the encoding failed)")
        if self.p.device == "cuda":
            why = faiss_gpu_available()
            if why:
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
        """The scratch folder and the data set; ``ValueError`` (``PATH: problem``) for bad input."""
        self.start = time.time()
        if self.work.exists():
            shutil.rmtree(self.work)  # this tool's own scratch folder (the record says the folder is ours)
        self.work.mkdir(parents=True)
        self.build_data()

    def run(self) -> Dict:
        start = self.start
        generator = self.work / "generator.pt"
        got = self.attempt("generator", self.make_generator)
        all_setups = setups(self.p, str(generator))
        self.setup_args = {s.name: list(s.args) for s in all_setups}
        chosen = [s for s in all_setups if not self.only or s.name in self.only or s.name == BASELINE]
        for precision, why in self.p.skipped_precisions.items():
            self.add(Check(f"train {precision}", SKIP, why))
        for s in chosen:
            if "--generator-path" in s.args and got.status != PASS:
                self.add(Check(f"train {s.name}", FAIL, "no generator (see the generator check)"))
                continue
            for precision in self.p.precisions:
                self.attempt(f"train {s.name} {precision}", self.train_objective, s.name, list(s.args), precision)
                name = f"{precision} vs {self.p.reference} {s.name}"
                self.attempt(name, self.compare_precision, s.name, list(s.args), precision)
        self.ratios_and_projection()
        self.attempt("data parallel", self.data_parallel)
        self.attempt("HF export", self.export)
        for precision in self.p.precisions:
            self.attempt(f"encode {precision}", self.encoding, precision)
        self.attempt("faiss", self.faiss)
        result = report.build(self.p, self.checks, self.objectives, time.time() - start)
        result["encoding"] = getattr(self, "encoding_results", {})
        return result


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
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(
            f"gpu_check: no CUDA device on this machine (torch {torch.__version__}): nothing to check; "
            "--dry-run runs the same checks on the CPU at tiny shape"
        )
        return 0
    if not args.corpus.is_file():
        print(f"error: {args.corpus}: corpus not found (pass --corpus FILE)", file=sys.stderr)
        return 2
    only = [n.strip() for n in args.objectives.split(",") if n.strip()] if args.objectives else None
    if only:
        known = [s.name for s in setups(dry_run_profile(), "generator.pt")]
        unknown = [n for n in only if n not in known]
        if unknown:
            print(f"error: --objectives: unknown {', '.join(unknown)}; choose from {','.join(known)}", file=sys.stderr)
            return 2
    try:
        check_output_dir(args.out, RECORD, TOOL)
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        args.out / RECORD, {"tool": TOOL, "files": ["data-bin", "work", report.JSON_NAME, report.MARKDOWN_NAME]}
    )
    if args.dry_run:
        profile = dry_run_profile(args.peak_tflops)
    else:
        profile = cuda_profile(args.updates or 30, args.peak_tflops)
    if args.updates:
        profile.updates = args.updates
    if args.vocab_size:
        profile.vocab_size = args.vocab_size
    say(f"{profile.device_name} x {max(1, profile.gpus)}: precisions {', '.join(profile.precisions)}; out {args.out}")
    check = GpuCheck(profile, args.out, args.corpus, only)
    try:
        check.prepare()
    except ValueError as e:  # preprocess.errors.PreprocessError, fileio.OutputError: "PATH: problem"
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = check.run()
    report.write(args.out, result)
    status = "passed" if result["passed"] else f"FAILED: {', '.join(result['failed'])}"
    say(f"{status}; report {args.out / report.MARKDOWN_NAME}")
    print(
        json.dumps({"passed": result["passed"], "failed": result["failed"], "report": str(args.out / report.JSON_NAME)})
    )
    return 0 if result["passed"] else 1
