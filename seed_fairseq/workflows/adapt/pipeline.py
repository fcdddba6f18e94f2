"""The adaptation as resumable stages (``preprocess.stages.Runner``) inside one ``--out`` folder: the
stages every workflow has (``kit.pipeline``), then its own.

    import             OUT/import/              the HuggingFace model, imported
    split              OUT/corpus/              without --retrieval-dev: documents held out of pre-training
    retrieval          OUT/retrieval/           without --retrieval-dev: the retrieval set derived from them
    data               OUT/data-bin/            the pre-training text with the model's tokenizer
    generator          OUT/generator/           SimLM only: its generator (the import, or a head trained on it)
    pretrain           OUT/pretrain/            fairseq-train, continued from the import (log: train.log)
    export             OUT/model/               the best checkpoint (or the start, if none beat it), exported
    roundtrip          OUT/roundtrip/           the import exported unchanged, compared with --model
                                                (kit/roundtrip.py): the report says when it differs
    bm25               OUT/bm25/                BM25 on the report's split
    zeroshot-W         OUT/eval/zeroshot-W/     W = original, adapted: zero-shot run on the report's split
    finetune-W         OUT/eval/finetune-W/     with --train-queries: fine-tuned identically, then the run
    report             OUT/report.md, report.json, report.png

The original model, the reference of every comparison, is --model itself, loaded as the
retrieval tools load any model folder (its own pooling, normalisation and similarity:
``retrieval.search.load_model``); the adapted model is the export of a checkpoint continued
from its import, pre-trained and validated on the same representation (the import's
``model_args.txt``) and exported with it.  What every stage's fingerprint covers, what a
redone stage deletes and how a killed one resumes: ``kit.pipeline``.
"""

from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Tuple

from preprocess.stages import WHOLE_PLAN, PlanReads, Stage, jsonable

from ...base.fileio import write_json_atomic, write_text_atomic
from ..kit.corpus import corpus_documents
from ..kit.pipeline import FAIRSEQ_TRAIN_FILES, FREE, timed
from .plan import REPORT_FILES, RUN_FILES, SPLIT_FILES, AdaptPlan, heldout_split, log
from .progress import TrainProgress
from .report import METRICS, write_report
from .training import Training

WHO = ("original", "adapted")

# what a zero-shot evaluation reads of the plan, and a fine-tuning followed by one (the seed:
# the fine-tuning's, replace(finetune, seed=...))
EVALUATION = ("retrieval_dev", "test_split", "k", "max_seq_length", "pretrain.gpu", "finetune.encode_batch_size",
              "finetune.index")  # fmt: skip
FINETUNING = (*EVALUATION, "finetune", "seed")


class Adaptation(Training):
    """The stages of one :class:`AdaptPlan` (``Training``: what fairseq-train gets; ``Paths``: where each
    stage writes)."""

    # How the stages read the plan (preprocess.stages.PlanReads): the fields no product depends
    # on, and the fields that are the paths of the external inputs (their content is read too).
    PLAN_READS = PlanReads(
        {**FREE, "derived": "whether the retrieval set is derived: it decides which stages exist and what they read"},
        inputs={f: f for f in ("model", "corpus", "retrieval_dev", "train_queries")},
    )
    MODEL, RETRIEVAL, WHAT = "model", "retrieval_dev", "the adaptation"

    def __init__(self, plan: AdaptPlan):
        super().__init__(plan, log)

    # ---- the stages ----
    def stages(self) -> List[Stage]:
        """The plan fields each body reads are its options: a body that reads another fails (PlanView)."""
        p = self.plan
        st = self.preparation(self.spec.needs_generator)
        st += [self.pretrain_stage(), self.export_stage("export", "pretrain", "model", ("best_metric",)),
               self.roundtrip_stage(), self.bm25_stage()]  # fmt: skip
        report_reads = ["pretrain", "export", "bm25", "roundtrip"]
        for who in WHO:
            st.append(self.run_stage("zeroshot", who, f"zeroshot-{who}", f"eval/zeroshot-{who}"))
            report_reads.append(f"zeroshot-{who}")
            if p.train_queries is not None:
                # both models alike: the same fields (seed included), only the model differs
                st.append(
                    self.run_stage("finetune", who, f"finetune-{who}", f"eval/finetune-{who}", ("train_queries",))
                )
                report_reads.append(f"finetune-{who}")
        # the report states the whole plan (its command and settings)
        st.append(self.stage("report", self.stage_report, (WHOLE_PLAN,), reads=tuple(report_reads),
                             products=REPORT_FILES))  # fmt: skip
        return st

    def preparation(self, generator: bool) -> List[Stage]:
        """What the pre-training reads: the import (the fresh MLM head of a model saved without one is
        drawn from the seed), without --retrieval-dev the held-out documents and the set derived from
        them, the data, and SimLM's generator when ``generator``."""
        p = self.plan
        st = [self.import_stage("seed")]
        if p.derived:
            st.append(self.stage("split", self.stage_split, ("corpus", "heldout_docs"), folder="corpus",
                                 writes=SPLIT_FILES))  # fmt: skip
            st.append(self.retrieval_stage(reads=("split",)))
        # derived: the split's pretrain.txt, else the corpus itself
        st.append(self.data_stage(*(() if p.derived else ("corpus",)), reads=("split",) if p.derived else ()))
        if generator:
            st.append(self.generator_stage("seed"))
        return st

    def pretrain_stage(self, name: str = "pretrain", folder: str = "pretrain") -> Stage:
        """The continued pre-training; it reads the dev set when it validates on it."""
        reads = ("import", "data", *(("generator",) if self.spec.needs_generator else ()),
                 *(self.retrieval_reads if self.plan.dev_in_training else ()))  # fmt: skip
        return self.stage(name, self.stage_pretrain, self.pretrain_fields(), reads=reads, folder=folder,
                          writes=(*FAIRSEQ_TRAIN_FILES, "attempts.json"))  # fmt: skip

    def run_stage(self, kind: str, who: str, name: str, folder: str, fields=(), export: str = "export") -> Stage:
        """The run of the ``who`` model, zero-shot (``kind`` zeroshot) or fine-tuned first (finetune):
        the original is --model itself (an external input), the adapted model the stage ``export``'s."""
        body, declared = (self.stage_zeroshot, EVALUATION) if kind == "zeroshot" else (self.stage_finetune, FINETUNING)
        model_field, model_stage = (("model",), ()) if who == "original" else ((), (export,))
        return self.stage(name, body, (*declared, *fields, *model_field), params={"who": who},
                          reads=(*model_stage, *self.retrieval_reads), folder=folder, writes=RUN_FILES)  # fmt: skip

    def pretrain_fields(self) -> Tuple[str, ...]:
        """What the continued pre-training reads (``Training.pretrain_args``)."""
        selection = ("best_metric", "dev_in_training", *(("retrieval_dev",) if self.plan.dev_in_training else ()))
        return ("objective", "pretrain", "seed", "freeze_updates", "encoder_warmup_updates", "encoder_lr_scale",
                "layer_lr_decay", *selection)  # fmt: skip

    def import_seed(self) -> int:
        return self.plan.seed

    def retrieval_text(self) -> Tuple[Path, int]:
        # as the up-front check (cli.check_derived_set) derived it: every held-out document
        return self.out / "corpus" / "heldout.txt", 0

    def run(self) -> Dict[str, Any]:
        return self.run_stages()

    # ---- stage bodies (each returns a JSON result with its wall time) ----
    def stage_import(self, results) -> dict:
        # the new heads: the objective's (pretrain)
        return {**super().stage_import(results), "mlm_head": self.import_record().get("mlm_head")}

    def stage_split(self, results) -> dict:
        def body():
            docs = corpus_documents(self.plan.corpus)
            keep, held = heldout_split(len(docs), self.plan.heldout_docs)
            for name, ids in (("pretrain.txt", keep), ("heldout.txt", held)):
                write_text_atomic(self.out / "corpus" / name, "\n\n".join("\n".join(docs[i]) for i in ids) + "\n")
            return {"documents": len(docs), "heldout": len(held)}

        return timed(body)

    def stage_generator(self, results) -> dict:
        if self.import_record().get("mlm_head") != "fresh":
            log("the model's own MLM head is SimLM's generator (the import)")
            return {"seconds": 0.0, "trained": False}
        log(f"training SimLM's generator: the model's fresh MLM head on the frozen model, "
            f"{self.plan.generator_updates} updates")  # fmt: skip
        return super().stage_generator(results)

    def stage_pretrain(self, results) -> dict:
        folder, p = self.pretrain_dir, self.plan
        new = self.new_heads()
        log(f"continuing {p.objective.name} for {p.pretrain.updates} updates; new heads: {', '.join(new) or 'none'}; "
            f"encoder frozen for {self.freeze_updates()} updates; log: {folder / 'train.log'}")  # fmt: skip
        watch = TrainProgress(folder / "train.log", p.pretrain.updates, p.best_metric, log)
        return {**self.train(self.pretrain_args(), folder, watch), "freeze_updates": self.freeze_updates(),
                "new_heads": new}  # fmt: skip

    def stage_export(self, results) -> dict:
        chosen = self.choose_checkpoint()
        if chosen["kept_start"]:
            log(f"no checkpoint scored above the starting model by {chosen['metric']}: the adapted model is the "
                "original")  # fmt: skip
        else:
            log(f"the best checkpoint: update {chosen['update']}, {chosen['metric']} {chosen['value']:.4f}")
        data = self.imported if chosen["kept_start"] else self.data_bin

        def body():  # the model's own representation, as it was pre-trained (a DupMAE export would add its own)
            self.export(Path(chosen["checkpoint"]), data, self.model_dir, "own")
            return chosen

        return timed(body)

    def _model_folder(self, who: str) -> Path:
        """The original: --model as the user gave it; the adapted model: the export stage's."""
        return self.plan.model if who == "original" else self.model_dir

    def _search(self, model, test, folder: Path, tag: str) -> Dict[str, float]:
        from ...encoders.retrieval.evaluate import evaluate_model
        from ...encoders.retrieval.metrics import write_trec_run

        p = self.plan
        log(f"{tag}: encoding {len(test.corpus)} passages and {len(test.query_ids())} queries")
        metrics, run = evaluate_model(
            model, test, k=p.k, batch_size=p.finetune.encode_batch_size, index=p.finetune.index,
            show_progress=False, names=METRICS,
        )  # fmt: skip
        write_trec_run(run, folder / "run.trec", tag=tag)
        log(f"{tag}: " + ", ".join(f"{m} {metrics[m]:.4f}" for m in METRICS))
        return metrics

    def _load(self, who: str):
        import torch

        from ...encoders.retrieval.search import load_model

        torch.set_num_threads(self.plan.threads)
        p = self.plan
        # each model in the representation its folder declares: its own pooling, normalisation, similarity
        return load_model(str(self._model_folder(who)), p.device, p.max_seq_length)

    def stage_zeroshot(self, results, who: str) -> dict:
        from ...base.retrieval_data import load_data

        def body():
            test = load_data(self.retrieval_dir, self.plan.test_split)
            return {"metrics": self._search(self._load(who), test, self.eval_dir(f"zeroshot-{who}"), f"{who}-zeroshot")}

        return timed(body)

    def stage_finetune(self, results, who: str) -> dict:
        from ...base.retrieval_data import load_data
        from ...encoders.retrieval.training import finetune

        p = self.plan

        def body():
            model = self._load(who)
            log(f"fine-tuning the {who} model on {self.train_set} (train split)")
            settings = replace(p.finetune, seed=p.seed)
            summary = finetune(model, load_data(self.train_set, "train"), settings)
            folder = self.eval_dir(f"finetune-{who}")
            metrics = self._search(model, load_data(self.retrieval_dir, p.test_split), folder, f"{who}-finetuned")
            write_json_atomic(folder / "summary.json", summary)
            # what the report's "fine-tuned identically" is checked against (report.finetune_settings)
            used = {"data": str(self.train_set), **jsonable(settings)}
            return {"metrics": metrics, "steps": summary["steps"], "train_queries": summary["train_queries"],
                    "settings": used}  # fmt: skip

        return timed(body)

    def stage_report(self, results) -> dict:
        return timed(lambda: {"files": write_report(self, results)})
