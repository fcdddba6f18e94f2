"""The adaptation as resumable stages (``preprocess.stages.Runner``) inside one ``--out`` folder.

    import             OUT/import/              the HuggingFace model, imported
    split              OUT/corpus/              without --retrieval-dev: documents held out of pre-training
    retrieval          OUT/retrieval/           without --retrieval-dev: the retrieval set derived from them
    data               OUT/data-bin/            the pre-training text with the model's tokenizer
    generator          OUT/generator/           SimLM only: its generator (the import, or a head trained on it)
    pretrain           OUT/pretrain/            fairseq-train, continued from the import (log: train.log)
    export             OUT/model/               the best checkpoint (or the start, if none beat it), exported
    original           OUT/original/            the import exported unchanged: the reference
    bm25               OUT/bm25/                BM25 on the report's split
    zeroshot-W         OUT/eval/zeroshot-W/     W = original, adapted: zero-shot run on the report's split
    finetune-W         OUT/eval/finetune-W/     with --train-queries: fine-tuned identically, then the run
    report             OUT/report.md, report.json, report.png

As the comparison (``seed_fairseq/compare/pipeline.py``, whose helpers this reuses): each
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

from preprocess.stages import Runner, Stage

from ..compare.heldout import build_data
from ..compare.layout import (
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
from ..compare.pipeline import USER_DIR, child_env, fairseq_bin, run_logged
from ..fileio import write_json_atomic, write_text_atomic
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
    def stages(self) -> List[Stage]:
        p = self.plan
        st: List[Stage] = [Stage("import", self.stage_import, reads=("model",), folder="import", writes=OWN_RECORD)]
        text_reads: Tuple[str, ...] = ("corpus",)
        eval_reads: Tuple[str, ...] = ("retrieval_dev",)
        if p.derived:
            st.append(
                Stage(
                    "split",
                    self.stage_split,
                    {"heldout_docs": p.heldout_docs},
                    reads=("corpus",),
                    folder="corpus",
                    writes=SPLIT_FILES,
                )
            )
            st.append(Stage("retrieval", self.stage_retrieval, reads=("split",), folder="retrieval",
                            writes=RETRIEVAL_FILES))  # fmt: skip
            text_reads, eval_reads = ("split",), ("retrieval",)
        s = p.pretrain
        st.append(
            Stage(
                "data",
                self.stage_data,
                {"tps": s.tokens_per_sample, "valid": [p.valid_docs, p.valid_blocks, p.max_valid_docs]},
                reads=("import", *text_reads),
                folder="data-bin",
                writes=OWN_RECORD,
            )
        )
        pretrain_reads = ["import", "data"]
        if self.spec.needs_generator:
            st.append(
                Stage(
                    "generator",
                    self.stage_generator,
                    {"updates": p.generator_updates, "settings": asdict(s), "seed": p.seed},
                    reads=("import", "data"),
                    folder="generator",
                    writes=FAIRSEQ_TRAIN_FILES,
                )
            )
            pretrain_reads.append("generator")
        if p.dev_in_training:
            pretrain_reads.extend(eval_reads)
        pretrain_options = {
            "objective": p.objective,
            "settings": asdict(s),
            "seed": p.seed,
            "freeze": p.freeze_updates,  # None: chosen from the import (its fingerprint is read)
            "encoder": [p.encoder_warmup_updates, p.encoder_lr_scale, p.layer_lr_decay],
            "selection": [p.best_metric, p.dev_in_training],
        }
        st.append(
            Stage(
                "pretrain",
                self.stage_pretrain,
                pretrain_options,
                reads=tuple(pretrain_reads),
                folder="pretrain",
                writes=(*FAIRSEQ_TRAIN_FILES, "attempts.json"),
            )
        )
        st.append(Stage("export", self.stage_export, reads=("pretrain",), folder="model", writes=OWN_RECORD))
        st.append(Stage("original", self.stage_original, reads=("import",), folder="original", writes=OWN_RECORD))
        st.append(
            Stage(
                "bm25",
                self.stage_bm25,
                {"k": p.k, "split": p.test_split},
                reads=eval_reads,
                folder="bm25",
                writes=(BM25_RUN,),
            )
        )
        ev = p.finetune
        evaluation = {
            "k": p.k,
            "split": p.test_split,
            "max_seq_length": p.max_seq_length,
            "encode": [ev.encode_batch_size, ev.index],
            "device": p.device,
        }
        ft = {k: v for k, v in asdict(ev).items() if k not in ("show_progress", "encode_batch_size", "index")}
        report_reads = ["pretrain", "export", "bm25"]
        for who, model_stage in zip(WHO, ("original", "export")):
            st.append(
                Stage(
                    f"zeroshot-{who}",
                    lambda r, w=who: self.stage_zeroshot(w),
                    evaluation,
                    reads=(model_stage, *eval_reads),
                    folder=f"eval/zeroshot-{who}",
                    writes=RUN_FILES,
                )
            )
            report_reads.append(f"zeroshot-{who}")
            if p.train_queries is not None:
                st.append(
                    Stage(
                        f"finetune-{who}",
                        lambda r, w=who: self.stage_finetune(w),
                        {**evaluation, "finetune": ft},
                        reads=(model_stage, *eval_reads, "train_queries"),
                        folder=f"eval/finetune-{who}",
                        writes=RUN_FILES,
                    )
                )
                report_reads.append(f"finetune-{who}")
        st.append(
            Stage("report", self.stage_report, {"resamples": p.resamples, "command": p.command},
                  reads=tuple(report_reads))  # fmt: skip
        )
        return st

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
        if not all((self.out / f).is_file() for f in REPORT_FILES):
            runner.marker("report").unlink(missing_ok=True)  # a report the user removed is written again
        results = runner.run()
        if not self.ran:
            log("every stage was already done with these options and inputs: nothing to do")
        return results

    # ---- stage bodies (each returns a JSON result with its wall time) ----
    def stage_import(self, results) -> dict:
        from ..hf.import_ import import_model

        def body():
            import_model(self.plan.model, self.imported, force=True, seed=self.plan.seed)
            return {"mlm_head": self.import_record().get("mlm_head"), "new_heads": self.new_heads()}

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
        cmd = [fairseq_bin("fairseq-train"), self.data_bin, "--user-dir", USER_DIR, *self.generator_train_args()]
        return _timed(lambda: run_logged([*cmd, "--save-dir", folder], folder / "train.log", self.env, True, log))

    def stage_pretrain(self, results) -> dict:
        folder, p = self.pretrain_dir, self.plan
        new = self.new_heads()
        log(f"continuing {p.objective} for {p.pretrain.updates} updates; new heads: {', '.join(new) or 'none'}; "
            f"encoder frozen for {self.freeze_updates()} updates; log: {folder / 'train.log'}")  # fmt: skip
        cmd = [fairseq_bin("fairseq-train"), self.data_bin, "--user-dir", USER_DIR, *self.train_args()]
        attempts = folder / "attempts.json"
        earlier = json.loads(attempts.read_text()) if attempts.is_file() else []
        t0 = time.time()
        with TrainProgress(folder / "train.log", p.pretrain.updates, p.best_metric, log):
            run_logged([*cmd, "--save-dir", folder], folder / "train.log", self.env, append=True, say=log)
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

    def stage_original(self, results) -> dict:
        from ..hf.import_ import CHECKPOINT

        return _timed(lambda: self._export(self.imported / CHECKPOINT, self.imported, self.original_dir))

    def _export(self, checkpoint: Path, data: Path, out: Path) -> dict:
        from ..hf.export import ExportError, export

        try:  # the [CLS] representation, as the original is evaluated (a DupMAE export would add its own)
            export(checkpoint, data, out, force=True, representation="cls")
        except ExportError as e:
            raise StageError(out, f"export failed: {e}") from None
        return {}

    def stage_bm25(self, results) -> dict:
        from ..retrieval.bm25 import BM25
        from ..retrieval.data import load_data
        from ..retrieval.metrics import write_trec_run

        def body():
            test = load_data(self.eval_set, self.plan.test_split)
            run = BM25(test.corpus).retrieve({q: test.queries[q] for q in test.query_ids()}, k=self.plan.k)
            write_trec_run(run, self.out / "bm25" / BM25_RUN, tag="bm25")

        return _timed(body)

    def _model_folder(self, who: str) -> Path:
        return self.original_dir if who == "original" else self.model_dir

    def _search(self, model, test, folder: Path, tag: str) -> Dict[str, float]:
        from ..retrieval.evaluate import evaluate_model
        from ..retrieval.metrics import write_trec_run

        p = self.plan
        log(f"{tag}: encoding {len(test.corpus)} passages and {len(test.query_ids())} queries")
        metrics, run = evaluate_model(
            model, test, k=p.k, batch_size=p.finetune.encode_batch_size, index=p.finetune.index, show_progress=False
        )
        write_trec_run(run, folder / "run.trec", tag=tag)
        log(f"{tag}: " + ", ".join(f"{m} {metrics[m]:.4f}" for m in METRICS))  # R@1000 > --k would mislead
        return metrics

    def _load(self, who: str):
        import torch

        from ..retrieval.search import load_model

        torch.set_num_threads(self.plan.threads)
        p = self.plan
        return load_model(str(self._model_folder(who)), p.device, p.max_seq_length, representation="cls")

    def stage_zeroshot(self, who: str) -> dict:
        from ..retrieval.data import load_data

        def body():
            test = load_data(self.eval_set, self.plan.test_split)
            return {"metrics": self._search(self._load(who), test, self.eval_dir(f"zeroshot-{who}"), f"{who}-zeroshot")}

        return _timed(body)

    def stage_finetune(self, who: str) -> dict:
        from ..retrieval.data import load_data
        from ..retrieval.training import finetune

        p = self.plan

        def body():
            model = self._load(who)
            log(f"fine-tuning the {who} model on {self.train_set} (train split)")
            summary = finetune(model, load_data(self.train_set, "train"), replace(p.finetune, seed=p.seed))
            folder = self.eval_dir(f"finetune-{who}")
            metrics = self._search(model, load_data(self.eval_set, p.test_split), folder, f"{who}-finetuned")
            write_json_atomic(folder / "summary.json", summary)
            return {"metrics": metrics, "steps": summary["steps"], "train_queries": summary["train_queries"]}

        return _timed(body)

    def stage_report(self, results) -> dict:
        return _timed(lambda: {"files": write_report(self, results)})
