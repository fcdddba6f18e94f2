"""A workflow's run as resumable stages (``preprocess.stages.Runner``) in one ``--out`` folder: what
every workflow's plan holds (:class:`RunPlan`) and the stages they share (:class:`Pipeline`), among
which each lists its own (its pre-training, its evaluation, its report):

    import      OUT/import/       the HuggingFace model given, imported (hf.import_)
    data        OUT/data-bin/     preprocess.build of the pre-training text, with a valid split of enough
                                  blocks (heldout.py): the import's tokenizer, or a new vocabulary
    retrieval   OUT/retrieval/    the retrieval set derived from documents of the corpus (unless given)
    bm25        OUT/bm25/         BM25 on the evaluation's split
    roundtrip   OUT/roundtrip/    the import exported unchanged, compared with the model as given
                                  (roundtrip.py: the reports say when it differs)
    generator   OUT/generator/    SimLM's generator: a masked LM, trained by fairseq-train
    export      (the workflow's)  a pre-trained checkpoint, exported to HuggingFace (hf.export)

Each stage declares the plan fields it reads (``PlanReads``: its body sees no other) and the stages
it reads: its fingerprint, so a rerun redoes exactly what changed and nothing when nothing did; the
stage records live in ``OUT/.stages``.  A redone stage deletes only the files it writes in its folder
(``Stage.writes``, or the record of the tool it runs): a user's notes or subfolder there stay.  A
stage killed half-way resumes with what it finished (fairseq-train from its ``checkpoint_last.pt``).
A stage's options hold what the user chose, never what is read from another stage's output (the
import's ``model_args.txt``): that is in the fingerprint of the stage it comes from, so the first
run and its rerun agree.  SIGINT, SIGTERM or SIGHUP stop the running fairseq-train with its process
group (interrupt.py).

A workflow's pipeline names the fields of its plan that the shared stages declare under their own
names: ``MODEL``, the model folder the import reads, and ``RETRIEVAL``, a retrieval set given
instead of derived.
"""

import argparse
import contextlib
import hashlib
import json
import shlex
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Tuple

from preprocess.stages import PlanReads, Runner, Stage

from ...base.fileio import sha256_file, write_json_atomic
from ...base.retrieval_data import load_data
from ...encoders.retrieval.config import FinetuneConfig
from ...encoders.retrieval.metrics import write_trec_run
from .argv import command
from .corpus import corpus_documents, write_retrieval_set
from .folder import STATE, StageError, check_stage_folders
from .heldout import build_data
from .objectives import PretrainSettings
from .roundtrip import export_and_compare
from .tools import child_env, run_logged

# What each stage writes in its folder (Stage.writes): a redone stage deletes exactly
# these files, and a user's notes or subfolder beside them stay.
FAIRSEQ_TRAIN_FILES = ("checkpoint*.pt", "train.log")  # fairseq-train's --save-dir, and its log
RETRIEVAL_FILES = ("source.txt", "corpus.jsonl", "queries.jsonl", "qrels/*.tsv")  # corpus.write_retrieval_set
BM25_RUN = "test.trec"
# import_from_hf, preprocess.build and export_to_hf keep a record of their files in the
# folder and replace exactly those themselves
OWN_RECORD = ()
IMPORT_SEED = 1  # the fresh MLM head of a model saved without one, unless the workflow's seed draws it
# the plan fields no product depends on (PlanReads.free): every workflow's, with the reason
FREE = {
    "threads": "CPU threads per process: the speed (results equal up to the order of float sums)",
    "out": "where the products go, not what they are (a moved --out is the same run)",
}


def file_fingerprint(path: Path) -> str:
    """Content identity of a file (sha256), or of a folder (names, sizes and mtimes of its files)."""
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.relative_to(path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def timed(body: Callable[[], Optional[dict]]) -> dict:
    """A stage's result: what ``body`` returns, with its wall time in ``seconds``."""
    t0 = time.time()
    return {**(body() or {}), "seconds": time.time() - t0}


@dataclass
class RunPlan:
    """What every workflow's plan holds, resolved from its flags."""

    out: Path
    corpus: Path  # the pre-training text
    test_split: str  # the retrieval split the evaluation reports
    pretrain: PretrainSettings
    valid_docs: int  # held out first (heldout.py: the data stage adds more when they give too few blocks)
    valid_blocks: int  # validation blocks every run needs (0: no validation)
    max_valid_docs: int  # the most documents held out automatically
    generator_updates: int  # SimLM's generator's updates
    finetune: FinetuneConfig
    max_seq_length: int  # tokens per text in evaluation and fine-tuning
    k: int  # ranked documents per query
    resamples: int  # the paired permutation test's resamples
    threads: int  # CPU threads per process
    command: str  # the command line, as the reports state it
    settings: Dict[str, Any]  # every flag, resolved

    @property
    def device(self) -> str:
        return "cuda" if self.pretrain.gpu else "cpu"

    @staticmethod
    def as_flagged(args: argparse.Namespace, argv: List[str], prog: str) -> Dict[str, Any]:
        """The fields the flags give as they are: --out (resolved), --k, --resamples, --threads, the
        command line and every flag (``settings``)."""
        return dict(out=Path(args.out).resolve(), k=args.k, resamples=args.resamples, threads=args.threads,
                    command=shlex.join(["python", prog, *argv]), settings=dict(vars(args)))  # fmt: skip


class Pipeline:
    """The stages of one plan in its ``out``: a workflow's subclass lists them (``stages``), the shared
    ones with the factories below, in the order they run; ``say`` is the workflow's log line."""

    PLAN_READS: PlanReads  # how the stages read the plan: the fields that never change a product, the inputs
    MODEL = ""  # the plan's field of the HuggingFace model folder the import reads (None: nothing imported)
    RETRIEVAL = ""  # the plan's field of a retrieval set given instead of derived (None: derived)
    WHAT = ""  # the workflow, in words: a stage folder it cannot own is refused in its name

    def __init__(self, plan: RunPlan, say: Callable[[str], None]):
        self.plan, self.out, self.say = plan, plan.out, say
        self.env = child_env(plan.threads)
        self.ran: List[str] = []  # the stages this process ran (the others were reused)

    # ---- folders ----
    @property
    def imported(self) -> Path:
        return self.out / "import"

    @property
    def data_bin(self) -> Path:
        return self.out / "data-bin"

    @property
    def retrieval_dir(self) -> Path:
        """The retrieval set the evaluation scores on: the one given, or the one derived."""
        return getattr(self.plan, self.RETRIEVAL) or self.out / "retrieval"

    @property
    def roundtrip_dir(self) -> Path:
        return self.out / "roundtrip"

    @property
    def generator_dir(self) -> Path:
        return self.out / "generator"

    @property
    def pretrain_text(self) -> Path:
        """The text the data stage builds: the corpus."""
        return self.plan.corpus

    # ---- the stages ----
    def stages(self) -> List[Stage]:
        raise NotImplementedError

    def stage(self, name: str, body: Callable[..., dict], fields: Sequence[str] = (), **kwargs: Any) -> Stage:
        """A stage whose body reads exactly the plan ``fields`` it declares (``PLAN_READS``)."""
        return self.PLAN_READS.stage(self, name, body, fields, **kwargs)

    @property
    def import_reads(self) -> Tuple[str, ...]:
        """What reads the imported model reads: the import stage (nothing when there is none)."""
        return ("import",) if getattr(self.plan, self.MODEL) is not None else ()

    @property
    def retrieval_reads(self) -> Tuple[str, ...]:
        """What reads the retrieval set reads: the stage that derives it (a given one: its field)."""
        return () if getattr(self.plan, self.RETRIEVAL) is not None else ("retrieval",)

    def import_stage(self, *fields: str) -> Stage:
        """The model of the plan's ``MODEL`` field imported; ``fields``: what else it reads (``import_seed``)."""
        return self.stage("import", self.stage_import, (self.MODEL, *fields), folder="import", writes=OWN_RECORD)

    def data_stage(self, *fields: str, reads: Sequence[str] = ()) -> Stage:
        """``pretrain_text`` built with ``data_options``; ``fields`` and ``reads``: what those come from."""
        held_out = ("valid_docs", "valid_blocks", "max_valid_docs", "pretrain.tokens_per_sample")
        return self.stage("data", self.stage_data, (*held_out, *fields), reads=(*self.import_reads, *reads),
                          folder="data-bin", writes=OWN_RECORD)  # fmt: skip

    def retrieval_stage(self, *fields: str, reads: Sequence[str] = ()) -> Stage:
        """The set derived from ``retrieval_text``; ``fields`` and ``reads``: what that comes from."""
        return self.stage("retrieval", self.stage_retrieval, (self.RETRIEVAL, *fields), reads=reads,
                          folder="retrieval", writes=RETRIEVAL_FILES)  # fmt: skip

    def bm25_stage(self) -> Stage:
        return self.stage("bm25", self.stage_bm25, (self.RETRIEVAL, "test_split", "k"), reads=self.retrieval_reads,
                          folder="bm25", writes=(BM25_RUN,))  # fmt: skip

    def roundtrip_stage(self) -> Stage:
        """The import's round trip against the model as given, on texts of the evaluation's split."""
        fields = (self.MODEL, self.RETRIEVAL, "test_split", "pretrain.gpu")
        return self.stage("roundtrip", self.stage_roundtrip, fields, reads=("import", *self.retrieval_reads),
                          folder="roundtrip", writes=OWN_RECORD)  # fmt: skip

    def generator_stage(self, *fields: str) -> Stage:
        """``generator_train_args``' run; ``fields``: what else they read."""
        return self.stage("generator", self.stage_generator, ("pretrain", "generator_updates", *fields),
                          reads=("data", *self.import_reads), folder="generator",
                          writes=FAIRSEQ_TRAIN_FILES)  # fmt: skip

    def export_stage(self, name: str, pretrain: str, folder: str, fields: Sequence[str] = (), **params: Any) -> Stage:
        """``stage_export`` of a checkpoint of the stage ``pretrain`` into ``folder``; ``params``: its arguments."""
        return self.stage(name, self.stage_export, fields, params=params, reads=(pretrain,), folder=folder,
                          writes=OWN_RECORD)  # fmt: skip

    # ---- what the workflow decides ----
    def import_seed(self) -> int:
        """The seed the import draws a fresh MLM head from (a model saved without one)."""
        return IMPORT_SEED

    def data_options(self) -> Dict[str, Any]:
        """The data's vocabulary (``build_data``): the import's tokenizer."""
        return {"tokenizer": self.imported}

    def retrieval_text(self) -> Tuple[Path, int]:
        """The text the retrieval set is derived from, and how many of its documents (0: all)."""
        raise NotImplementedError

    def generator_train_args(self) -> List[str]:
        raise NotImplementedError

    # ---- the shared bodies (each returns a JSON result with its wall time) ----
    def stage_import(self, results) -> dict:
        from ...encoders.hf.import_ import import_model

        def body():
            import_model(getattr(self.plan, self.MODEL), self.imported, force=True, seed=self.import_seed())

        return timed(body)

    def stage_data(self, results) -> dict:
        """The data, with a valid split of at least ``plan.valid_blocks`` blocks (heldout.py)."""
        p = self.plan
        return timed(lambda: build_data(self.data_bin, self.pretrain_text, p.pretrain.tokens_per_sample, p.valid_docs,
                                        p.valid_blocks, p.max_valid_docs, p.threads, **self.data_options(),
                                        say=self.say))  # fmt: skip

    def stage_retrieval(self, results) -> dict:
        text, limit = self.retrieval_text()
        return timed(lambda: asdict(write_retrieval_set(corpus_documents(text), limit, self.retrieval_dir)))

    def stage_bm25(self, results) -> dict:
        from ...encoders.retrieval.bm25 import BM25

        def body():
            test = load_data(self.retrieval_dir, self.plan.test_split)
            run = BM25(test.corpus).retrieve({q: test.queries[q] for q in test.query_ids()}, k=self.plan.k)
            write_trec_run(run, self.out / "bm25" / BM25_RUN, tag="bm25")

        return timed(body)

    def stage_roundtrip(self, results) -> dict:
        def body():
            import torch

            p = self.plan
            torch.set_num_threads(p.threads)
            test = load_data(self.retrieval_dir, p.test_split)
            check = export_and_compare(self.imported, getattr(p, self.MODEL), self.roundtrip_dir, test, p.device)
            self.say("the import -> export round trip " + ("reproduces" if check["exact"] else "does NOT reproduce")
                     + f" the model: max abs difference {check['max_abs_diff']} on {check['texts']} texts")  # fmt: skip
            return check

        return timed(body)

    def stage_generator(self, results) -> dict:
        cmd = command(self.data_bin, self.generator_train_args(), save_dir=self.generator_dir)
        return timed(lambda: run_logged(cmd, self.generator_dir / "train.log", self.env, say=self.say, append=True))

    def stage_export(self, results, **params: Any) -> dict:
        raise NotImplementedError

    # ---- what the workflows' own bodies share ----
    def train(self, args: List[str], folder: Path, watch: Optional[ContextManager] = None) -> dict:
        """fairseq-train with ``args`` (after DATA) into ``folder`` (its save-dir; log: train.log), resumed
        from its last checkpoint, while ``watch`` is entered; every attempt's wall time (attempts.json),
        summed: ``{"seconds", "attempts"}``."""
        cmd = command(self.data_bin, args, save_dir=folder)
        attempts = folder / "attempts.json"
        earlier = json.loads(attempts.read_text()) if attempts.is_file() else []
        t0 = time.time()
        with watch or contextlib.nullcontext():
            run_logged(cmd, folder / "train.log", self.env, say=self.say, append=True)
        earlier.append(time.time() - t0)
        write_json_atomic(attempts, earlier)
        return {"seconds": sum(earlier), "attempts": len(earlier)}

    def export(self, checkpoint: Path, data: Path, folder: Path, representation: Optional[str] = None) -> None:
        """``checkpoint`` exported to HuggingFace into ``folder`` (``representation``: its exporter, default
        the model's); :class:`StageError` when the export fails."""
        from ...encoders.hf.export import ExportError, export

        try:
            export(checkpoint, data, folder, force=True, representation=representation)
        except ExportError as e:
            raise StageError(folder, f"export failed: {e}") from None

    # ---- the run ----
    def external(self) -> Dict[str, str]:
        """The fingerprints of the external inputs the plan names (``PLAN_READS.inputs``)."""
        named = {name: getattr(self.plan, f) for f, name in self.PLAN_READS.inputs.items()}
        return {name: file_fingerprint(path) for name, path in named.items() if path is not None}

    def runner(self) -> Runner:
        return Runner(
            self.out, [self._announced(s) for s in self.stages()], self.external(), state_dir=self.out / STATE
        )

    def _announced(self, stage: Stage) -> Stage:
        """``stage`` with a line when it starts and one when it ends, and its name in ``self.ran``."""

        def run(results, body=stage.run, name=stage.name):
            self.say(f"{name}: running")
            self.ran.append(name)
            result = body(results)
            self.say(f"{name}: done in {result.get('seconds', 0):.0f} s")
            return result

        return replace(stage, run=run)

    def check_foreign(self, runner: Runner) -> None:
        """Refuse a stage folder the workflow cannot own (``folder.check_stage_folders``)."""
        check_stage_folders(self.out, runner, self.WHAT)

    def run_stages(self) -> Dict[str, Any]:
        """Every stage not done yet with these options and inputs; the results of all."""
        runner = self.runner()
        self.check_foreign(runner)
        results = runner.run()  # a product the user removed (a report, a model folder) is made again
        if not self.ran:
            self.say("every stage was already done with these options and inputs: nothing to do")
        return results
