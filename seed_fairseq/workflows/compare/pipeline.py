"""The comparison as resumable stages (``preprocess.stages.Runner``) inside one ``--out`` folder: the
stages every workflow has (``kit.pipeline``), then its own.

    import        OUT/import/             --init HF_DIR only: the imported encoder
    data          OUT/data-bin/           preprocess.build (the model's tokenizer with --init)
    retrieval     OUT/retrieval/          the retrieval set derived from the corpus (unless given)
    bm25          OUT/bm25/               BM25 run on the test split
    roundtrip     OUT/roundtrip/          --init only: the import exported unchanged, compared with
                                          the --init model (kit/roundtrip.py; the report says when it differs)
    generator     OUT/generator/          SimLM's generator (seed_encoder_mlm_only, small encoder)
    flops         -                       FLOPs per update of every objective (counted, measure/flops.py)
    pretrain-O-sS OUT/pretrain/O/sS/      fairseq-train of objective O with seed S (log: train.log)
    export-O-sS   OUT/hf/O/sS/            examples/export_to_hf.py's export
    eval-O-sS     OUT/eval/O/sS/          [CLS] cosine by length, zero-shot and few-shot fine-tuned runs
                                          (each model in its own representation: with --init, the
                                          import's pooling and similarity, which it was pre-trained on)
    report        OUT/results.md, results.json, *.png

What every stage's fingerprint covers, what a redone stage deletes and how a killed one resumes:
``kit.pipeline``.  The evaluation resumes run by run.
"""

import shlex
import time
from dataclasses import replace
from typing import Any, Dict, List, Optional

from preprocess.stages import PlanReads, Stage

from ..kit.objectives import OBJECTIVES, PretrainSettings, generator_args, objective_args
from ..kit.pipeline import FAIRSEQ_TRAIN_FILES, FREE, Pipeline, timed
from ..measure.flops import count_update_flops
from .evaluation import evaluate_run
from .objectives import PER_UPDATE_FIELDS, per_update_settings
from .plan import EVAL_FILES, Plan, log, run_name
from .report import write_report


class Comparison(Pipeline):
    """The stages of one :class:`Plan`."""

    # How the stages read the plan (preprocess.stages.PlanReads): the fields no product depends
    # on, and the fields that are the paths of the external inputs (their content is read too).
    PLAN_READS = PlanReads(FREE, inputs={f: f for f in ("corpus", "init", "retrieval_data")})
    MODEL, RETRIEVAL, WHAT = "init", "retrieval_data", "the comparison"

    def __init__(self, plan: Plan):
        super().__init__(plan, log)

    # ---- folders ----
    def pretrain_dir(self, obj: str, seed: int):
        return self.out / "pretrain" / obj / f"s{seed}"

    def hf_dir(self, obj: str, seed: int):
        return self.out / "hf" / obj / f"s{seed}"

    def eval_dir(self, obj: str, seed: int):
        return self.out / "eval" / obj / f"s{seed}"

    def generator_checkpoint(self):
        return self.generator_dir / "checkpoint_last.pt"

    # ---- fairseq-train's arguments ----
    def init_args(self) -> List[str]:
        """With --init: the imported encoder's sizes, and the checkpoint to start from (once:
        --finetune-from-model loads it only when the run has no checkpoint of its own yet)."""
        if not self.plan.init:
            return []
        from ...encoders.hf.import_ import read_model_args

        return [*(read_model_args(self.imported) or []), "--finetune-from-model", str(self.imported / "checkpoint.pt")]

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
    def stages(self) -> List[Stage]:
        """The stages; each one's options are the plan fields its body reads and its parameters,
        never anything read from another stage's output (that is in the fingerprint of the stage
        it comes from): the first run and its rerun list the same fingerprints."""
        p = self.plan
        st: List[Stage] = [self.import_stage()] if p.init else []
        # with --init the import's tokenizer: --vocab-size is not read
        st.append(self.data_stage("init", "corpus", *(() if p.init else ("vocab_size",))))
        if p.retrieval_data is None:
            st.append(self.retrieval_stage("corpus", "retrieval_docs"))
        st.append(self.bm25_stage())
        if p.init:
            st.append(self.roundtrip_stage())
        needs_gen = any(OBJECTIVES[o].needs_generator for o in p.objectives)
        if needs_gen:
            st.append(self.generator_stage("generator_args", "init"))
        st.append(
            self.stage(
                "flops",
                self.stage_flops,
                # per update: the schedule's lengths do not change it (a new --updates keeps this stage)
                ("objectives", "init", *PER_UPDATE_FIELDS, *(("generator_args",) if needs_gen else ())),
                params={"seed": p.seeds[0]},
                reads=("data", *(("generator",) if needs_gen else ()), *self.import_reads),
            )
        )
        eval_fields = ("finetune", "fractions", "max_seq_length", "k", "train_split", "test_split", "cos_lengths",
                       "cos_pairs", "pretrain.gpu", "corpus", "retrieval_data")  # fmt: skip
        for o in p.objectives:
            for s in p.seeds:
                name, run = run_name(o, s), {"obj": o, "seed": s}
                preads = ("data", "generator") if OBJECTIVES[o].needs_generator else ("data",)
                st += [
                    self.stage(f"pretrain-{name}", self.stage_pretrain, ("pretrain", "init"), params=run,
                               reads=(*preads, *self.import_reads), folder=f"pretrain/{o}/s{s}",
                               writes=(*FAIRSEQ_TRAIN_FILES, "attempts.json")),
                    self.export_stage(f"export-{name}", f"pretrain-{name}", f"hf/{o}/s{s}", **run),
                    self.stage(f"eval-{name}", self.stage_eval, eval_fields, params=run,
                               reads=(f"export-{name}", *self.retrieval_reads), folder=f"eval/{o}/s{s}",
                               writes=EVAL_FILES),
                ]  # fmt: skip
        return st

    def data_options(self) -> Dict[str, Any]:
        """With --init the import's tokenizer, else a new vocabulary of --vocab-size."""
        return super().data_options() if self.plan.init else {"vocab_size": self.plan.vocab_size}

    def retrieval_text(self):
        return self.plan.corpus, self.plan.retrieval_docs

    def run(self) -> Dict[str, Any]:
        return write_report(self, self.run_stages())

    # ---- the comparison's own stage bodies (each returns a JSON result with its wall time) ----
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
        log(f"pre-training {obj} (seed {seed}); log: {folder / 'train.log'}")
        return self.train(self.pretrain_args(obj, seed), folder)

    def stage_export(self, results, obj: str, seed: int) -> dict:
        checkpoint = self.pretrain_dir(obj, seed) / "checkpoint_last.pt"
        return timed(lambda: self.export(checkpoint, self.data_bin, self.hf_dir(obj, seed)))

    def stage_eval(self, results, obj: str, seed: int) -> dict:
        return timed(lambda: evaluate_run(self, obj, seed))
