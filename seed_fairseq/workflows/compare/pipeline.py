"""The comparison as resumable stages (``preprocess.stages.Runner``) inside one ``--out`` folder.

    import        OUT/import/             --init HF_DIR only: the imported encoder
    data          OUT/data-bin/           preprocess.build (the model's tokenizer with --init)
    retrieval     OUT/retrieval/          the retrieval set derived from the corpus (unless given)
    bm25          OUT/bm25/               BM25 run on the test split
    roundtrip     OUT/roundtrip/          --init only: the import exported unchanged, compared with
                                          the --init model (roundtrip.py; the report says when it differs)
    generator     OUT/generator/          SimLM's generator (seed_encoder_mlm_only, small encoder)
    flops         -                       FLOPs per update of every objective (counted, flops.py)
    pretrain-O-sS OUT/pretrain/O/sS/      fairseq-train of objective O with seed S (log: train.log)
    export-O-sS   OUT/hf/O/sS/            examples/export_to_hf.py's export
    eval-O-sS     OUT/eval/O/sS/          [CLS] cosine by length, zero-shot and few-shot fine-tuned runs
                                          (each model in its own representation: with --init, the
                                          import's pooling and similarity, which it was pre-trained on)
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
import shlex
import time
from dataclasses import asdict, replace
from typing import Any, Dict, List, Optional, Tuple

from preprocess.stages import PlanReads, Runner, Stage

from ...base.fileio import write_json_atomic
from ...base.retrieval_data import load_data
from ...encoders.retrieval.metrics import write_trec_run
from ..kit.argv import command
from ..kit.heldout import build_data
from ..kit.layout import (
    BM25_RUN,
    EVAL_FILES,
    FAIRSEQ_TRAIN_FILES,
    OWN_RECORD,
    RETRIEVAL_FILES,
    STATE,
    Layout,
    Plan,
    StageError,
    check_stage_folders,
    corpus_documents,
    file_fingerprint,
    log,
    run_name,
    write_retrieval_set,
)
from ..kit.objectives import (
    OBJECTIVES,
    PER_UPDATE_FIELDS,
    PretrainSettings,
    generator_args,
    objective_args,
    per_update_settings,
)
from ..kit.tools import child_env, run_logged
from ..measure.flops import count_update_flops
from .evaluation import evaluate_run
from .report import write_report

# How the stages read the plan (preprocess.stages.PlanReads): the fields no product depends
# on, and the fields that are the paths of the external inputs (their content is read too).
PLAN_READS = PlanReads(
    free={
        "threads": "CPU threads per process: the speed (results equal up to the order of float sums)",
        "out": "where the products go, not what they are (a moved --out is the same run)",
    },
    inputs={"corpus": "corpus", "init": "init", "retrieval_data": "retrieval_data"},
)

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
        from ...encoders.hf.import_ import read_model_args

        imported = self.out / "import"
        return [*(read_model_args(imported) or []), "--finetune-from-model", str(imported / "checkpoint.pt")]

    def settings_for_objectives(self, settings: Optional[PretrainSettings] = None) -> PretrainSettings:
        s = settings or self.plan.pretrain
        if self.plan.init:  # the imported model's own encoder sizes replace the preset's
            return replace(s, encoder_args=[], fairseq_args=[*s.fairseq_args, *self.init_args()])
        return s

    def pretrain_args(self, obj: str, seed: int, settings: Optional[PretrainSettings] = None) -> List[str]:
        """fairseq-train's arguments (after DATA) of ``obj``'s pre-training with ``seed`` (``settings``:
        the plan's, or the per-update ones the FLOPs are counted with)."""
        gen = str(self.generator_checkpoint()) if OBJECTIVES[obj].needs_generator else None
        return objective_args(OBJECTIVES[obj], self.settings_for_objectives(settings), seed, gen)

    def generator_train_args(self, settings: Optional[PretrainSettings] = None, planned: bool = False) -> List[str]:
        """SimLM's generator's fairseq-train arguments (``settings``: the per-update ones of the FLOPs
        count; ``planned``: before the import exists, without its model options)."""
        s = settings or self.plan.pretrain
        updates = self.plan.generator_updates if settings is None else s.updates
        gs = replace(s, updates=updates, warmup=min(s.warmup, updates // 10))
        model = shlex.split(" ".join(self.init_args()[:-2])) if self.plan.init and not planned else []
        # with --init: the imported model's options (positions, activation, ...), then the generator's sizes
        return generator_args(gs, 1, *s.fairseq_args, model=[*model, *self.plan.generator_args])

    def planned_args(self) -> List[str]:
        """The fairseq-train options the comparison sets itself (every objective's, the generator's,
        the import's as placeholders), without --fairseq-args: what --fairseq-args may not set."""
        p = self.plan
        s = replace(p.pretrain, fairseq_args=["--finetune-from-model", "IMPORT"] if p.init else [])
        args = [a for o in p.objectives for a in objective_args(OBJECTIVES[o], s, p.seeds[0], "GENERATOR")]
        if any(OBJECTIVES[o].needs_generator for o in p.objectives):
            args += self.generator_train_args(replace(s, updates=p.generator_updates), planned=True)
        return args

    # ---- stages ----
    def stage(self, name: str, body, fields=(), **kwargs) -> Stage:
        """A stage whose body reads exactly the plan ``fields`` it declares (``PLAN_READS``)."""
        return PLAN_READS.stage(self, name, body, fields, **kwargs)

    def stages(self) -> List[Stage]:
        """The stages; each one's options are the plan fields its body reads and its parameters,
        never anything read from another stage's output (that is in the fingerprint of the stage
        it comes from): the first run and its rerun list the same fingerprints."""
        p = self.plan
        st: List[Stage] = []
        init_reads: Tuple[str, ...] = ()
        if p.init:
            st.append(self.stage("import", self.stage_import, ("init",), folder="import", writes=OWN_RECORD))
            init_reads = ("import",)
        # with --init the import's tokenizer: --vocab-size is not read
        data_fields = ("init", "corpus", "valid_docs", "valid_blocks", "max_valid_docs", "pretrain.tokens_per_sample")
        st.append(
            self.stage(
                "data",
                self.stage_data,
                (*data_fields, *(() if p.init else ("vocab_size",))),
                reads=init_reads,
                folder="data-bin",
                writes=OWN_RECORD,
            )
        )
        if p.retrieval_data is None:
            st.append(
                self.stage(
                    "retrieval",
                    self.stage_retrieval,
                    ("corpus", "retrieval_docs", "retrieval_data"),
                    folder="retrieval",
                    writes=RETRIEVAL_FILES,
                )
            )
            rreads: Tuple[str, ...] = ("retrieval",)
        else:
            rreads = ()  # the retrieval_data field: its content (PLAN_READS.inputs)
        st.append(
            self.stage(
                "bm25",
                self.stage_bm25,
                ("retrieval_data", "test_split", "k"),
                reads=rreads,
                folder="bm25",
                writes=(BM25_RUN,),
            )
        )
        if p.init:
            st.append(
                self.stage(
                    "roundtrip",
                    self.stage_roundtrip,
                    ("init", "retrieval_data", "test_split", "pretrain.gpu"),
                    reads=("import", *rreads),
                    folder="roundtrip",
                    writes=OWN_RECORD,
                )
            )
        needs_gen = any(OBJECTIVES[o].needs_generator for o in p.objectives)
        gen_fields = ("pretrain", "generator_updates", "generator_args", "init")
        if needs_gen:
            st.append(
                self.stage(
                    "generator",
                    self.stage_generator,
                    gen_fields,
                    reads=("data", *init_reads),
                    folder="generator",
                    writes=FAIRSEQ_TRAIN_FILES,
                )
            )
        flops_reads = ("data", "generator") if needs_gen else ("data",)
        st.append(
            self.stage(
                "flops",
                self.stage_flops,
                # per update: the schedule's lengths do not change it (a new --updates keeps this stage)
                ("objectives", "init", *PER_UPDATE_FIELDS, *(("generator_args",) if needs_gen else ())),
                params={"seed": p.seeds[0]},
                reads=(*flops_reads, *init_reads),
            )
        )
        eval_fields = ("finetune", "fractions", "max_seq_length", "k", "train_split", "test_split", "cos_lengths",
                       "cos_pairs", "pretrain.gpu", "corpus", "retrieval_data")  # fmt: skip
        for o in p.objectives:
            for s in p.seeds:
                name = run_name(o, s)
                preads = ("data", "generator") if OBJECTIVES[o].needs_generator else ("data",)
                st.append(
                    self.stage(
                        f"pretrain-{name}",
                        self.stage_pretrain,
                        ("pretrain", "init"),
                        params={"obj": o, "seed": s},
                        reads=(*preads, *init_reads),
                        folder=f"pretrain/{o}/s{s}",
                        writes=(*FAIRSEQ_TRAIN_FILES, "attempts.json"),
                    )
                )
                st.append(
                    self.stage(
                        f"export-{name}",
                        self.stage_export,
                        params={"obj": o, "seed": s},
                        reads=(f"pretrain-{name}",),
                        folder=f"hf/{o}/s{s}",
                        writes=OWN_RECORD,
                    )
                )
                st.append(
                    self.stage(
                        f"eval-{name}",
                        self.stage_eval,
                        eval_fields,
                        params={"obj": o, "seed": s},
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
    def stage_import(self, results) -> dict:  # its MLM head (if the model has none): seed 1, whatever --seed
        from ...encoders.hf.import_ import import_model

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
            vocab_size=None if p.init else p.vocab_size,  # with --init: the import's tokenizer
        )
        return {"seconds": time.time() - t0, **built}

    def stage_retrieval(self, results) -> dict:
        t0 = time.time()
        stats = write_retrieval_set(corpus_documents(self.plan.corpus), self.plan.retrieval_docs, self.retrieval_dir)
        return {"seconds": time.time() - t0, **asdict(stats)}

    def stage_bm25(self, results) -> dict:
        from ...encoders.retrieval.bm25 import BM25

        t0 = time.time()
        test = load_data(self.retrieval_dir, self.plan.test_split)
        run = BM25(test.corpus).retrieve({q: test.queries[q] for q in test.query_ids()}, k=self.plan.k)
        write_trec_run(run, self.out / "bm25" / BM25_RUN, tag="bm25")
        return {"seconds": time.time() - t0}

    def stage_roundtrip(self, results) -> dict:
        """The import exported unchanged, compared with the --init model on the test split's texts."""
        import torch

        from ..kit.roundtrip import export_and_compare

        t0 = time.time()
        p = self.plan
        torch.set_num_threads(p.threads)
        test = load_data(self.retrieval_dir, p.test_split)
        check = export_and_compare(self.out / "import", p.init, self.out / "roundtrip", test, p.device)
        return {"seconds": time.time() - t0, **check}

    def stage_generator(self, results) -> dict:
        t0 = time.time()
        folder = self.out / "generator"
        cmd = command(self.data_bin, self.generator_train_args(), save_dir=folder)
        run_logged(cmd, folder / "train.log", self.env, append=True)
        return {"seconds": time.time() - t0}

    def stage_flops(self, results, seed: int) -> dict:
        """FLOPs per update, counted with the schedule's lengths left out (``per_update_settings``)."""
        t0 = time.time()
        out = {}
        settings = per_update_settings(self.plan.pretrain)
        for o in self.plan.objectives:
            out[o] = count_update_flops(self.data_bin, self.pretrain_args(o, seed, settings))
        if "generator" in results:
            out["generator"] = count_update_flops(self.data_bin, self.generator_train_args(settings))
        return {"seconds": time.time() - t0, "counts": out}  # totals: x updates, in the report

    def stage_pretrain(self, results, obj: str, seed: int) -> dict:
        folder = self.pretrain_dir(obj, seed)
        cmd = command(self.data_bin, self.pretrain_args(obj, seed), save_dir=folder)
        attempts = folder / "attempts.json"
        earlier = json.loads(attempts.read_text()) if attempts.is_file() else []
        t0 = time.time()
        log(f"pre-training {obj} (seed {seed}); log: {folder / 'train.log'}")
        run_logged(cmd, folder / "train.log", self.env, append=True)
        earlier.append(time.time() - t0)
        write_json_atomic(attempts, earlier)
        return {"seconds": sum(earlier), "attempts": len(earlier)}

    def stage_export(self, results, obj: str, seed: int) -> dict:
        from ...encoders.hf.export import ExportError, export

        t0 = time.time()
        out = self.hf_dir(obj, seed)
        try:
            export(self.pretrain_dir(obj, seed) / "checkpoint_last.pt", self.data_bin, out, force=True)
        except ExportError as e:
            raise StageError(out, f"export failed: {e}") from None
        return {"seconds": time.time() - t0}

    def stage_eval(self, results, obj: str, seed: int) -> dict:
        t0 = time.time()
        evaluate_run(self, obj, seed)
        return {"seconds": time.time() - t0}
