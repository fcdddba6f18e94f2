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
2. per objective of the registry and fairseq's ``masked_lm`` (and it with fairseq's ``adam`` when the
   default optimizer is another), per precision: the largest batch that fits (``search.py``), then N
   updates (``runs.py``): losses finite and falling, loss-scale events, peak memory, words/s after
   warm-up, FLOPs, MFU, the ratio to ``masked_lm``, the projection of the paper's run; then, with
   ``--profile`` (the default) where the budget leaves room, a kernel profile of a few more updates
   (``kernels.py``: the report's "Kernel profile");
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
import json
import math
import signal
import sys
from pathlib import Path
from typing import Callable, List, Optional

from ...base.errors import ENVIRONMENT_ERRNOS
from ...base.fileio import (
    OutputError,
    check_apart,
    check_out_path,
    check_output_dir,
    write_json_atomic,
)
from ..kit.interrupt import Interrupted, handle_interrupts
from . import report
from .budget import MIN_UPDATES, Budget, OutOfTime
from .inputs import InputError, check_data
from .profile import Profile, cuda_profile, dry_run_profile, setups
from .session import GpuCheck, say

TOOL = "seed_fairseq.gpucheck"
RECORD = ".gpu_check"
DEMO_CORPUS = Path(__file__).resolve().parents[3] / "examples" / "data" / "demo_corpus.txt"
# precision -> (loss, gradient norm) relative bands of the fixed-batch comparison with fp32:
# fp16 keeps 11 mantissa bits, bf16 8; a base model's loss in fp16 typically agrees to ~1e-3
MAX_VOCAB = 2**31 - 1  # sentencepiece's vocab_size is an int32
EXIT_NOT_RUN = 3  # no check failed, some were not run


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
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a kernel profile of a few updates of each run under torch.profiler, in the report's "
        "'Kernel profile' (default: on, where the time budget leaves room for it; --no-profile: off)",
    )
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
    check = GpuCheck(profile, args.out, args.corpus, only, budget, data, kernel_profile=args.profile)
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
