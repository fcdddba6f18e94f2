"""The comparison as resumable stages (``preprocess.stages.Runner``) inside one ``--out`` folder.

    import        OUT/import/             --init HF_DIR only: the imported encoder
    data          OUT/data-bin/           preprocess.build (the model's tokenizer with --init)
    retrieval     OUT/retrieval/          the retrieval set derived from the corpus (unless given)
    bm25          OUT/bm25/               BM25 run on the test split
    generator     OUT/generator/          SimLM's generator (seed_encoder_mlm_only, small encoder)
    flops         -                       FLOPs per update of every objective (counted, flops.py)
    pretrain-O-sS OUT/pretrain/O/sS/      fairseq-train of objective O with seed S (log: train.log)
    export-O-sS   OUT/hf/O/sS/            examples/export_to_hf.py's export
    eval-O-sS     OUT/eval/O/sS/          [CLS] cosine by length, zero-shot and few-shot fine-tuned runs
    report        OUT/results.md, results.json, *.png

Each stage's fingerprint covers the options it reads and the stages it reads, so a
rerun redoes exactly what changed; stage records live in ``OUT/.stages``.  A redone
stage deletes only the files it writes in its folder (``Stage.writes``, or the
record of the tool it runs): a user's notes or subfolder there stay.  A stage
killed half-way resumes with what it finished (fairseq-train from its
``checkpoint_last.pt``, the evaluation run by run).  SIGINT, SIGTERM or SIGHUP
stop the running fairseq-train with its process group before the driver exits,
and a killed driver's fairseq-train stops too (interrupt.py).
"""

import json
import os
import shlex
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Dict, List

from preprocess.stages import Runner, Stage

from ..fileio import write_json_atomic
from ..retrieval.data import load_data
from ..retrieval.metrics import write_trec_run
from .evaluation import evaluate_run
from .flops import count_update_flops
from .heldout import build_data
from .interrupt import run_child
from .layout import (  # noqa: F401  (claim_out, lock_out, corpus_documents, eval_keys, ...: their 0.2 import path)
    BM25_RUN,
    EVAL_FILES,
    FAIRSEQ_TRAIN_FILES,
    OWN_RECORD,
    RECORD,
    RETRIEVAL_FILES,
    STATE,
    TOOL,
    Layout,
    Plan,
    StageError,
    check_stage_folders,
    claim_out,
    corpus_documents,
    eval_keys,
    file_fingerprint,
    is_own_record,
    lock_out,
    log,
    run_name,
    sample_documents,
    write_retrieval_set,
)
from .objectives import OBJECTIVES, PretrainSettings, common_args, objective_args, per_update_args
from .report import write_report

# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def fairseq_bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def child_env(threads: int) -> Dict[str, str]:
    """The environment of the tools the stages start: ``threads`` CPU threads, quiet, offline,
    and this checkout's plugin and preprocess package importable (fairseq-train's ``--user-dir``)."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        PYTHONWARNINGS="ignore",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def run_logged(cmd: List[str], log_file: Path, env: Dict[str, str], append: bool = False, say=log) -> None:
    """Run a command-line tool with its output in ``log_file``; :class:`StageError` with its tail on failure."""
    cmd = [str(c) for c in cmd]
    say(" ".join(shlex.quote(c) for c in cmd))
    with open(log_file, "a" if append else "w", encoding="utf-8") as f:
        returncode = run_child(cmd, f, env)  # an interrupt of the driver stops it first (interrupt.py)
    if returncode != 0:
        tail = log_file.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise StageError(log_file, f"{Path(cmd[0]).name} failed (exit {returncode}); see this log", tail)


# ---------------------------------------------------------------------------
# the pipeline
# ---------------------------------------------------------------------------


class Comparison(Layout):
    """The stages of one :class:`Plan` (``Layout``: where each writes)."""

    def __init__(self, plan: Plan):
        super().__init__(plan)
        self.env = child_env(plan.threads)

    def init_args(self) -> List[str]:
        """With --init: the imported encoder's sizes, and the checkpoint to start from (once:
        --finetune-from-model loads it only when the run has no checkpoint of its own yet)."""
        if not self.plan.init:
            return []
        from ..hf.import_ import read_model_args

        imported = self.out / "import"
        return [*(read_model_args(imported) or []), "--finetune-from-model", str(imported / "checkpoint.pt")]

    def settings_for_objectives(self) -> PretrainSettings:
        s = self.plan.pretrain
        if self.plan.init:  # the imported model's own encoder sizes replace the preset's
            return replace(s, encoder_args=[], fairseq_args=[*s.fairseq_args, *self.init_args()])
        return s

    def train_args(self, obj: str, seed: int) -> List[str]:
        gen = str(self.generator_checkpoint()) if OBJECTIVES[obj].needs_generator else None
        return objective_args(OBJECTIVES[obj], self.settings_for_objectives(), seed, gen)

    def generator_train_args(self) -> List[str]:
        s = self.plan.pretrain
        gs = replace(s, updates=self.plan.generator_updates, warmup=min(s.warmup, self.plan.generator_updates // 10))
        model = shlex.split(" ".join(self.init_args()[:-2])) if self.plan.init else []
        return [
            "--task",
            "seed_pretrain",
            "--criterion",
            "seed_pretrain",
            "--arch",
            "seed_encoder_mlm_only",
            "--mlm-weight",
            "1.0",
            *model,  # with --init: the imported model's options (positions, activation, ...)
            *self.plan.generator_args,
            "--batch-size",
            str(s.batch_size),
            *common_args(gs),
            "--disable-validation",
            "--seed",
            "1",
            *s.fairseq_args,
        ]

    # ---- stages ----
    def stages(self) -> List[Stage]:
        p = self.plan
        st: List[Stage] = []
        data_reads = ["corpus"]
        if p.init:
            st.append(
                Stage(
                    "import",
                    self.stage_import,
                    {"init": str(p.init)},
                    reads=("init",),
                    folder="import",
                    writes=OWN_RECORD,
                )
            )
            data_reads.append("import")
        st.append(
            Stage(
                "data",
                self.stage_data,
                {
                    "vocab_size": None if p.init else p.vocab_size,
                    "valid_docs": p.valid_docs,
                    "valid_blocks": [p.valid_blocks, p.max_valid_docs],
                    "tps": p.pretrain.tokens_per_sample,
                },
                reads=tuple(data_reads),
                folder="data-bin",
                writes=OWN_RECORD,
            )
        )
        if p.retrieval_data is None:
            st.append(
                Stage(
                    "retrieval",
                    self.stage_retrieval,
                    {"docs": p.retrieval_docs},
                    reads=("corpus",),
                    folder="retrieval",
                    writes=RETRIEVAL_FILES,
                )
            )
            rreads = ("retrieval",)
        else:
            rreads = ("retrieval_data",)
        st.append(
            Stage(
                "bm25",
                self.stage_bm25,
                {"k": p.k, "split": p.test_split},
                reads=rreads,
                folder="bm25",
                writes=(BM25_RUN,),
            )
        )
        needs_gen = any(OBJECTIVES[o].needs_generator for o in p.objectives)
        if needs_gen:
            st.append(
                Stage(
                    "generator",
                    self.stage_generator,
                    {"args": self.generator_train_args()},
                    reads=("data",),
                    folder="generator",
                    writes=FAIRSEQ_TRAIN_FILES,
                )
            )
        flops_reads = ("data", "generator") if needs_gen else ("data",)
        st.append(
            Stage(
                "flops",
                self.stage_flops,
                # per update: the schedule's lengths do not change it (a new --updates keeps this stage)
                {o: per_update_args(self.train_args(o, p.seeds[0])) for o in p.objectives},
                reads=flops_reads,
            )
        )
        ft = {k: v for k, v in asdict(p.finetune).items() if k not in ("show_progress", "seed", "train_fraction")}
        eval_options = {
            "finetune": ft,
            "fractions": p.fractions,
            "max_seq_length": p.max_seq_length,
            "k": p.k,
            "splits": [p.train_split, p.test_split],
            "cos": [p.cos_lengths, p.cos_pairs],
        }
        for o in p.objectives:
            for s in p.seeds:
                name = run_name(o, s)
                preads = ("data", "generator") if OBJECTIVES[o].needs_generator else ("data",)
                st.append(
                    Stage(
                        f"pretrain-{name}",
                        lambda r, o=o, s=s: self.stage_pretrain(o, s),
                        {"args": self.train_args(o, s)},
                        reads=preads,
                        folder=f"pretrain/{o}/s{s}",
                        writes=(*FAIRSEQ_TRAIN_FILES, "attempts.json"),
                    )
                )
                st.append(
                    Stage(
                        f"export-{name}",
                        lambda r, o=o, s=s: self.stage_export(o, s),
                        reads=(f"pretrain-{name}",),
                        folder=f"hf/{o}/s{s}",
                        writes=OWN_RECORD,
                    )
                )
                st.append(
                    Stage(
                        f"eval-{name}",
                        lambda r, o=o, s=s: self.stage_eval(o, s),
                        {**eval_options, "seed": s},
                        reads=(f"export-{name}", *rreads),
                        folder=f"eval/{o}/s{s}",
                        writes=EVAL_FILES,
                    )
                )
        return st

    def external(self) -> Dict[str, str]:
        p = self.plan
        ext = {"corpus": file_fingerprint(p.corpus)}
        if p.init:
            ext["init"] = file_fingerprint(p.init)
        if p.retrieval_data is not None:
            ext["retrieval_data"] = file_fingerprint(p.retrieval_data)
        return ext

    def runner(self) -> Runner:
        return Runner(self.out, self.stages(), self.external(), state_dir=self.out / STATE)

    def check_foreign(self, runner: Runner) -> None:
        """Refuse a stage folder the comparison cannot own (``layout.check_stage_folders``)."""
        check_stage_folders(self.out, runner, "the comparison")

    def run(self) -> Dict[str, Any]:
        runner = self.runner()
        self.check_foreign(runner)
        results = runner.run()
        return write_report(self, results)

    # ---- stage bodies (each returns a JSON result with its wall time) ----
    def stage_import(self, results) -> dict:
        from ..hf.import_ import import_model

        t0 = time.time()
        import_model(self.plan.init, self.out / "import", force=True)
        return {"seconds": time.time() - t0}

    def stage_data(self, results) -> dict:
        """The data, with a valid split of at least ``plan.valid_blocks`` blocks (heldout.py)."""
        p, t0 = self.plan, time.time()
        built = build_data(
            self.data_bin,
            p.corpus,
            p.pretrain.tokens_per_sample,
            p.valid_docs,
            p.valid_blocks,
            p.max_valid_docs,
            p.threads,
            tokenizer=self.out / "import" if p.init else None,
            vocab_size=p.vocab_size,
        )
        return {"seconds": time.time() - t0, **built}

    def stage_retrieval(self, results) -> dict:
        t0 = time.time()
        stats = write_retrieval_set(corpus_documents(self.plan.corpus), self.plan.retrieval_docs, self.retrieval_dir)
        return {"seconds": time.time() - t0, **asdict(stats)}

    def stage_bm25(self, results) -> dict:
        from ..retrieval.bm25 import BM25

        t0 = time.time()
        test = load_data(self.retrieval_dir, self.plan.test_split)
        run = BM25(test.corpus).retrieve({q: test.queries[q] for q in test.query_ids()}, k=self.plan.k)
        write_trec_run(run, self.out / "bm25" / BM25_RUN, tag="bm25")
        return {"seconds": time.time() - t0}

    def stage_generator(self, results) -> dict:
        t0 = time.time()
        folder = self.out / "generator"
        cmd = [fairseq_bin("fairseq-train"), self.data_bin, "--user-dir", USER_DIR, *self.generator_train_args()]
        run_logged([*cmd, "--save-dir", folder], folder / "train.log", self.env, append=True)
        return {"seconds": time.time() - t0}

    def stage_flops(self, results) -> dict:
        t0 = time.time()
        out = {}
        for o in self.plan.objectives:
            out[o] = count_update_flops(self.data_bin, self.train_args(o, self.plan.seeds[0]))
        if "generator" in results:
            out["generator"] = count_update_flops(self.data_bin, self.generator_train_args())
        return {"seconds": time.time() - t0, "counts": out}  # totals: x updates, in the report

    def stage_pretrain(self, obj: str, seed: int) -> dict:
        folder = self.pretrain_dir(obj, seed)
        cmd = [fairseq_bin("fairseq-train"), self.data_bin, "--user-dir", USER_DIR, *self.train_args(obj, seed)]
        attempts = folder / "attempts.json"
        earlier = json.loads(attempts.read_text()) if attempts.is_file() else []
        t0 = time.time()
        log(f"pre-training {obj} (seed {seed}); log: {folder / 'train.log'}")
        run_logged([*cmd, "--save-dir", folder], folder / "train.log", self.env, append=True)
        earlier.append(time.time() - t0)
        write_json_atomic(attempts, earlier)
        return {"seconds": sum(earlier), "attempts": len(earlier)}

    def stage_export(self, obj: str, seed: int) -> dict:
        from ..hf.export import ExportError, export

        t0 = time.time()
        out = self.hf_dir(obj, seed)
        try:
            export(self.pretrain_dir(obj, seed) / "checkpoint_last.pt", self.data_bin, out, force=True)
        except ExportError as e:
            raise StageError(out, f"export failed: {e}") from None
        return {"seconds": time.time() - t0}

    def stage_eval(self, obj: str, seed: int) -> dict:
        t0 = time.time()
        evaluate_run(self, obj, seed)
        return {"seconds": time.time() - t0}


USER_DIR = str(Path(__file__).resolve().parents[1])
