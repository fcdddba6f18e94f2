"""The adaptation as resumable stages (``preprocess.stages.Runner``) inside one ``--out`` folder.

    import             OUT/import/              the HuggingFace model, imported
    split              OUT/corpus/              without --retrieval-dev: documents held out of pre-training
    retrieval          OUT/retrieval/           without --retrieval-dev: the retrieval set derived from them
    data               OUT/data-bin/            the pre-training text with the model's tokenizer
    generator          OUT/generator/           SimLM only: its generator (the import, or a head trained on it)
    pretrain           OUT/pretrain/            fairseq-train, continued from the import (log: train.log)
    export             OUT/model/               the best checkpoint (or the start, if none beat it), exported
    roundtrip          OUT/roundtrip/           the import exported unchanged, compared with --model
                                                (compare/roundtrip.py): the report says when it differs
    bm25               OUT/bm25/                BM25 on the report's split
    zeroshot-W         OUT/eval/zeroshot-W/     W = original, adapted: zero-shot run on the report's split
    finetune-W         OUT/eval/finetune-W/     with --train-queries: fine-tuned identically, then the run
    report             OUT/report.md, report.json, report.png

The original model, the reference of every comparison, is --model itself, loaded as the
retrieval tools load any model folder (its own pooling, normalisation and similarity:
``retrieval.search.load_model``); the adapted model is the export of a checkpoint continued
from its import, pre-trained and validated on the same representation (the import's
``model_args.txt``) and exported with it.

As the comparison (``seed_fairseq/workflows/compare/pipeline.py``, whose helpers this reuses): each
stage's fingerprint covers the options it reads and the stages it reads, so a rerun
redoes exactly what changed and nothing when nothing did; a redone stage deletes only
the files it writes in its folder; fairseq-train resumes from its ``checkpoint_last.pt``;
SIGINT, SIGTERM or SIGHUP stop the running fairseq-train with its process group
(compare/interrupt.py).  A stage's options hold what the user chose, never what is read
from another stage's output (the import's ``model_args.txt``): that is covered by the
fingerprint of the stage it comes from, so the first run and its rerun agree.
"""

import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from preprocess.stages import WHOLE_PLAN, PlanReads, Runner, Stage, jsonable

from ...base.fileio import write_json_atomic, write_text_atomic
from ..kit.argv import command
from ..kit.heldout import build_data
from ..kit.layout import (
    BM25_RUN,
    FAIRSEQ_TRAIN_FILES,
    OWN_RECORD,
    RETRIEVAL_FILES,
    StageError,
    check_stage_folders,
    corpus_documents,
    file_fingerprint,
    write_retrieval_set,
)
from ..kit.tools import child_env, run_logged
from .plan import (
    REPORT_FILES,
    RUN_FILES,
    SPLIT_FILES,
    STATE,
    AdaptPlan,
    heldout_split,
    log,
)
from .progress import TrainProgress
from .report import METRICS, write_report
from .training import Training

WHO = ("original", "adapted")

# what a zero-shot evaluation reads of the plan, and a fine-tuning followed by one (the seed:
# the fine-tuning's, replace(finetune, seed=...))
EVALUATION = ("retrieval_dev", "test_split", "k", "max_seq_length", "pretrain.gpu", "finetune.encode_batch_size",
              "finetune.index")  # fmt: skip
FINETUNING = (*EVALUATION, "finetune", "seed")
# what the round-trip check reads besides --model: the texts it compares on and how they are encoded
ROUNDTRIP = ("retrieval_dev", "test_split", "pretrain.gpu")

# How the stages read the plan (preprocess.stages.PlanReads): the fields no product depends
# on, and the fields that are the paths of the external inputs (their content is read too).
PLAN_READS = PlanReads(
    free={
        "threads": "CPU threads per process: the speed (results equal up to the order of float sums)",
        "out": "where the products go, not what they are (a moved --out is the same run)",
        "derived": "whether the retrieval set is derived: it decides which stages exist and what they read",
    },
    inputs={"model": "model", "corpus": "corpus", "retrieval_dev": "retrieval_dev", "train_queries": "train_queries"},
)


def _timed(body: Callable[[], Optional[dict]]) -> dict:
    t0 = time.time()
    return {**(body() or {}), "seconds": time.time() - t0}


class Adaptation(Training):
    """The stages of one :class:`AdaptPlan` (``Training``: what fairseq-train gets; ``Paths``: where each
    stage writes)."""

    def __init__(self, plan: AdaptPlan):
        super().__init__(plan)
        self.env = child_env(plan.threads)
        self.ran: List[str] = []  # the stages this process ran (the others were reused)

    # ---- the stages ----
    def stage(self, name: str, body: Callable[..., dict], fields=(), **kwargs) -> Stage:
        """A stage whose body reads exactly the plan ``fields`` it declares (``PLAN_READS``)."""
        return PLAN_READS.stage(self, name, body, fields, **kwargs)

    def stages(self) -> List[Stage]:
        p = self.plan
        # the plan fields each body reads (its options): a body that reads another fails (PlanView)
        evaluation, finetuning = EVALUATION, FINETUNING
        st: List[Stage] = [
            # the fresh MLM head of a model saved without one is drawn from the seed
            self.stage("import", self.stage_import, ("model", "seed"), folder="import", writes=OWN_RECORD)
        ]
        text_reads: Tuple[str, ...] = ()
        eval_reads: Tuple[str, ...] = ()
        if p.derived:
            st.append(self.stage("split", self.stage_split, ("corpus", "heldout_docs"), folder="corpus",
                                 writes=SPLIT_FILES))  # fmt: skip
            st.append(self.stage("retrieval", self.stage_retrieval, ("retrieval_dev",), reads=("split",),
                                 folder="retrieval", writes=RETRIEVAL_FILES))  # fmt: skip
            text_reads, eval_reads = ("split",), ("retrieval",)
        data_fields = ("pretrain.tokens_per_sample", "valid_docs", "valid_blocks", "max_valid_docs")
        st.append(
            self.stage(
                "data",
                self.stage_data,
                (*data_fields, *(() if p.derived else ("corpus",))),  # derived: the split's pretrain.txt
                reads=("import", *text_reads),
                folder="data-bin",
                writes=OWN_RECORD,
            )
        )
        pretrain_reads = ["import", "data"]
        if self.spec.needs_generator:
            st.append(
                self.stage(
                    "generator",
                    self.stage_generator,
                    ("pretrain", "generator_updates", "seed"),
                    reads=("import", "data"),
                    folder="generator",
                    writes=FAIRSEQ_TRAIN_FILES,
                )
            )
            pretrain_reads.append("generator")
        if p.dev_in_training:
            pretrain_reads.extend(eval_reads)
        st.append(
            self.stage(
                "pretrain",
                self.stage_pretrain,
                self.pretrain_fields(),
                reads=tuple(pretrain_reads),
                folder="pretrain",
                writes=(*FAIRSEQ_TRAIN_FILES, "attempts.json"),
            )
        )
        st.append(self.stage("export", self.stage_export, ("best_metric",), reads=("pretrain",), folder="model",
                             writes=OWN_RECORD))  # fmt: skip
        st.append(self.stage("roundtrip", self.stage_roundtrip, ("model", *ROUNDTRIP), reads=("import", *eval_reads),
                             folder="roundtrip", writes=OWN_RECORD))  # fmt: skip
        st.append(self.stage("bm25", self.stage_bm25, ("retrieval_dev", "test_split", "k"), reads=eval_reads,
                             folder="bm25", writes=(BM25_RUN,)))  # fmt: skip
        report_reads = ["pretrain", "export", "bm25"]
        report_reads.append("roundtrip")
        for who in WHO:
            # the original is --model itself (an external input), the adapted model the export stage's
            model_field, model_stage = (("model",), ()) if who == "original" else ((), ("export",))
            st.append(
                self.stage(
                    f"zeroshot-{who}",
                    self.stage_zeroshot,
                    (*evaluation, *model_field),
                    params={"who": who},
                    reads=(*model_stage, *eval_reads),
                    folder=f"eval/zeroshot-{who}",
                    writes=RUN_FILES,
                )
            )
            report_reads.append(f"zeroshot-{who}")
            if p.train_queries is not None:
                # both models alike: the same fields (seed included), only the model differs
                st.append(
                    self.stage(
                        f"finetune-{who}",
                        self.stage_finetune,
                        (*finetuning, "train_queries", *model_field),
                        params={"who": who},
                        reads=(*model_stage, *eval_reads),
                        folder=f"eval/finetune-{who}",
                        writes=RUN_FILES,
                    )
                )
                report_reads.append(f"finetune-{who}")
        # the report states the whole plan (its command and settings)
        st.append(self.stage("report", self.stage_report, (WHOLE_PLAN,), reads=tuple(report_reads),
                             products=REPORT_FILES))  # fmt: skip
        return st

    def pretrain_fields(self) -> Tuple[str, ...]:
        """What the continued pre-training reads (``Training.pretrain_args``)."""
        selection = ("best_metric", "dev_in_training", *(("retrieval_dev",) if self.plan.dev_in_training else ()))
        return ("objective", "pretrain", "seed", "freeze_updates", "encoder_warmup_updates", "encoder_lr_scale",
                "layer_lr_decay", *selection)  # fmt: skip

    def external(self) -> Dict[str, str]:
        p = self.plan
        ext = {"model": file_fingerprint(p.model), "corpus": file_fingerprint(p.corpus)}
        if p.retrieval_dev is not None:
            ext["retrieval_dev"] = file_fingerprint(p.retrieval_dev)
        if p.train_queries is not None:
            ext["train_queries"] = file_fingerprint(p.train_queries)
        return ext

    def runner(self) -> Runner:
        stages = [self._announced(s) for s in self.stages()]
        return Runner(self.out, stages, self.external(), state_dir=self.out / STATE)

    def _announced(self, stage: Stage) -> Stage:
        """``stage`` with a line when it starts and one when it ends, and its name in ``self.ran``."""

        def run(results, body=stage.run, name=stage.name):
            log(f"{name}: running")
            self.ran.append(name)
            result = body(results)
            log(f"{name}: done in {result.get('seconds', 0):.0f} s")
            return result

        return replace(stage, run=run)

    def run(self) -> Dict[str, Any]:
        runner = self.runner()
        check_stage_folders(self.out, runner, "the adaptation")
        results = runner.run()  # a product the user removed (a report, model/) is made again
        if not self.ran:
            log("every stage was already done with these options and inputs: nothing to do")
        return results

    # ---- stage bodies (each returns a JSON result with its wall time) ----
    def stage_import(self, results) -> dict:
        from ...encoders.hf.import_ import import_model

        def body():
            import_model(self.plan.model, self.imported, force=True, seed=self.plan.seed)
            return {"mlm_head": self.import_record().get("mlm_head")}  # the new heads: the objective's (pretrain)

        return _timed(body)

    def stage_split(self, results) -> dict:
        def body():
            docs = corpus_documents(self.plan.corpus)
            keep, held = heldout_split(len(docs), self.plan.heldout_docs)
            for name, ids in (("pretrain.txt", keep), ("heldout.txt", held)):
                write_text_atomic(self.out / "corpus" / name, "\n\n".join("\n".join(docs[i]) for i in ids) + "\n")
            return {"documents": len(docs), "heldout": len(held)}

        return _timed(body)

    def stage_retrieval(self, results) -> dict:
        # as the comparison derives its set, and the up-front check (cli.check_derived_set) did
        held = corpus_documents(self.out / "corpus" / "heldout.txt")
        return _timed(lambda: asdict(write_retrieval_set(held, 0, self.eval_set)))

    def stage_data(self, results) -> dict:
        p = self.plan
        return _timed(
            lambda: build_data(
                self.data_bin,
                self.pretrain_text,
                p.pretrain.tokens_per_sample,
                p.valid_docs,
                p.valid_blocks,
                p.max_valid_docs,
                p.threads,
                tokenizer=self.imported,
                say=log,
            )
        )

    def stage_generator(self, results) -> dict:
        if self.import_record().get("mlm_head") != "fresh":
            log("the model's own MLM head is SimLM's generator (the import)")
            return {"seconds": 0.0, "trained": False}
        folder = self.out / "generator"
        log(f"training SimLM's generator: the model's fresh MLM head on the frozen model, "
            f"{self.plan.generator_updates} updates")  # fmt: skip
        cmd = command(self.data_bin, self.generator_train_args(), save_dir=folder)
        return _timed(lambda: run_logged(cmd, folder / "train.log", self.env, True, log))

    def stage_pretrain(self, results) -> dict:
        folder, p = self.pretrain_dir, self.plan
        new = self.new_heads()
        log(f"continuing {p.objective} for {p.pretrain.updates} updates; new heads: {', '.join(new) or 'none'}; "
            f"encoder frozen for {self.freeze_updates()} updates; log: {folder / 'train.log'}")  # fmt: skip
        cmd = command(self.data_bin, self.pretrain_args(), save_dir=folder)
        attempts = folder / "attempts.json"
        earlier = json.loads(attempts.read_text()) if attempts.is_file() else []
        t0 = time.time()
        with TrainProgress(folder / "train.log", p.pretrain.updates, p.best_metric, log):
            run_logged(cmd, folder / "train.log", self.env, append=True, say=log)
        earlier.append(time.time() - t0)
        write_json_atomic(attempts, earlier)
        return {"seconds": sum(earlier), "attempts": len(earlier), "freeze_updates": self.freeze_updates(),
                "new_heads": new}  # fmt: skip

    def stage_export(self, results) -> dict:
        chosen = self.choose_checkpoint()
        if chosen["kept_start"]:
            log(f"no checkpoint scored above the starting model by {chosen['metric']}: the adapted model is the "
                "original")  # fmt: skip
        else:
            log(f"the best checkpoint: update {chosen['update']}, {chosen['metric']} {chosen['value']:.4f}")
        data = self.imported if chosen["kept_start"] else self.data_bin
        return _timed(lambda: {**chosen, **self._export(Path(chosen["checkpoint"]), data, self.model_dir)})

    def stage_roundtrip(self, results) -> dict:
        """The import exported unchanged, compared with --model on the evaluation's texts."""
        from ...base.retrieval_data import load_data
        from ..kit.roundtrip import export_and_compare

        def body():
            import torch

            torch.set_num_threads(self.plan.threads)
            p = self.plan
            test = load_data(self.eval_set, p.test_split)
            check = export_and_compare(self.imported, p.model, self.roundtrip_dir, test, p.device)
            log("the import -> export round trip " + ("reproduces" if check["exact"] else "does NOT reproduce")
                + f" the model: max abs difference {check['max_abs_diff']} on {check['texts']} texts")  # fmt: skip
            return check

        return _timed(body)

    def _export(self, checkpoint: Path, data: Path, out: Path) -> dict:
        from ...encoders.hf.export import ExportError, export

        try:  # the model's own representation, as it was pre-trained (a DupMAE export would add its own)
            export(checkpoint, data, out, force=True, representation="own")
        except ExportError as e:
            raise StageError(out, f"export failed: {e}") from None
        return {}

    def stage_bm25(self, results) -> dict:
        from ...base.retrieval_data import load_data
        from ...encoders.retrieval.bm25 import BM25
        from ...encoders.retrieval.metrics import write_trec_run

        def body():
            test = load_data(self.eval_set, self.plan.test_split)
            run = BM25(test.corpus).retrieve({q: test.queries[q] for q in test.query_ids()}, k=self.plan.k)
            write_trec_run(run, self.out / "bm25" / BM25_RUN, tag="bm25")

        return _timed(body)

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
            test = load_data(self.eval_set, self.plan.test_split)
            return {"metrics": self._search(self._load(who), test, self.eval_dir(f"zeroshot-{who}"), f"{who}-zeroshot")}

        return _timed(body)

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
            metrics = self._search(model, load_data(self.eval_set, p.test_split), folder, f"{who}-finetuned")
            write_json_atomic(folder / "summary.json", summary)
            # what the report's "fine-tuned identically" is checked against (report.finetune_settings)
            used = {"data": str(self.train_set), **jsonable(settings)}
            return {"metrics": metrics, "steps": summary["steps"], "train_queries": summary["train_queries"],
                    "settings": used}  # fmt: skip

        return _timed(body)

    def stage_report(self, results) -> dict:
        return _timed(lambda: {"files": write_report(self, results)})
