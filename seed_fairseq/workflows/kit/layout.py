"""Where the comparison keeps everything, and the resolved plan: what the stages, the
evaluation, the report and the up-front checks share (none of them imports ``pipeline``).

    OUT/compare.json           the tool's record: the folder is its own
    OUT/.stages/               the stage records (preprocess.stages.Runner)
    OUT/import/  data-bin/  retrieval/  bm25/  generator/
    OUT/pretrain/O/sS/  hf/O/sS/  eval/O/sS/
"""

import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from ...base.derived_set import derive_retrieval_set
from ...base.fileio import OutputError, sha256_file
from ...encoders.retrieval.config import FinetuneConfig
from .folder import ToolFolder, tool_log
from .objectives import PretrainSettings, eval_models

TOOL = "seed_fairseq.compare"
RECORD = "compare.json"  # the tool's record in --out: the folder is its own
COMPARISON = ToolFolder(TOOL, RECORD, "the comparison (examples/compare_objectives.py)", "comparison")
STATE = ".stages"

# What each stage writes in its folder (Stage.writes): a redone stage deletes exactly
# these files, and a user's notes or subfolder beside them stay.
FAIRSEQ_TRAIN_FILES = ("checkpoint*.pt", "train.log")  # fairseq-train's --save-dir, and its log
RETRIEVAL_FILES = ("source.txt", "corpus.jsonl", "queries.jsonl", "qrels/*.tsv")  # data.write_beir
BM25_RUN = "test.trec"
EVAL_FILES = ("cls_similarity.json", "*.zeroshot.trec", "*.ft*.trec", "*.ft*.json")  # evaluation.py
# import_from_hf, preprocess.build and export_to_hf keep a record of their files in the
# folder and replace exactly those themselves
OWN_RECORD = ()


class StageError(Exception):
    """A stage failed in a way the user can act on; ``str()`` is ``PATH: problem``."""

    def __init__(self, path, problem: str, detail: str = ""):
        self.path, self.problem, self.detail = str(path), problem, detail
        super().__init__(f"{self.path}: {problem}")


log = tool_log("compare")


@dataclass
class Plan:
    """Everything a run does, resolved from the flags and the preset."""

    out: Path
    objectives: List[str]
    seeds: List[int]
    corpus: Path
    init: Optional[Path]
    vocab_size: int
    valid_docs: int  # held out first (heldout.py: the data stage adds more when they give too few blocks)
    valid_blocks: int  # validation blocks every run needs (0: no validation)
    max_valid_docs: int  # the most documents held out automatically
    pretrain: PretrainSettings
    generator_args: List[str]
    generator_updates: int
    retrieval_data: Optional[Path]
    retrieval_docs: int
    train_split: str
    test_split: str
    finetune: FinetuneConfig
    fractions: List[float]
    max_seq_length: int
    k: int
    resamples: int
    cos_lengths: List[int]
    cos_pairs: int
    threads: int
    command: str
    preset: str
    settings: Dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> str:
        return "cuda" if self.pretrain.gpu else "cpu"


# ---------------------------------------------------------------------------
# --out: the tool's own folder
# ---------------------------------------------------------------------------


def check_stage_folders(out: Path, runner, owner: str) -> None:
    """Refuse, before any stage of ``runner`` runs, a stage folder ``owner`` (the tool, in words)
    cannot own: one that holds files while no stage of the tool ever started there (someone
    else's), or one reached through a symbolic link or a file (a redo deletes only inside
    ``out``, never through a link).  A started stage's folder may hold the user's files too:
    redoing the stage deletes only the files it writes (``Stage.writes``)."""
    for stage in runner.stages:
        if stage.folder is None:
            continue
        path = out
        for part in Path(stage.folder).parts:
            path = path / part
            if path.is_symlink() or (path.exists() and not path.is_dir()):
                raise OutputError(
                    path,
                    f"is a {'symbolic link' if path.is_symlink() else 'file'} where {owner} keeps its "
                    f"{stage.folder} folder; it writes and deletes only inside --out: move it away",
                )
        folder = out / stage.folder
        if folder.is_dir() and any(folder.iterdir()) and not runner.started_marker(stage.name).exists():
            raise OutputError(
                folder,
                "holds files this tool did not write there (no stage record for it); move them away or "
                "choose another --out",
            )


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


def corpus_documents(path: Path) -> List[List[str]]:
    """Documents (lists of paragraphs) of a text in the project's format."""
    text = path.read_text(encoding="utf-8")
    return [[p.strip() for p in d.splitlines() if p.strip()] for d in text.split("\n\n") if d.strip()]


def sample_documents(docs: List[List[str]], limit: int, seed: int) -> List[List[str]]:
    """At most ``limit`` documents (0: all), a seeded choice kept in corpus order."""
    if not limit or limit >= len(docs):
        return docs
    keep = set(random.Random(seed).sample(range(len(docs)), limit))
    return [d for i, d in enumerate(docs) if i in keep]


def write_retrieval_set(docs: List[List[str]], limit: int, folder: Path):
    """The retrieval set derived from ``limit`` of the corpus ``docs`` (0: all) in ``folder``; its
    ``DerivedSetStats``.  Also what the up-front check derives into a temporary folder (checks.py)."""
    source = folder / "source.txt"
    chosen = sample_documents(docs, limit, seed=1)
    source.write_text("\n\n".join("\n".join(d) for d in chosen) + "\n", encoding="utf-8")
    return derive_retrieval_set(source, folder, seed=1)


def run_name(obj: str, seed: int) -> str:
    return f"{obj}-s{seed}"


def fraction_label(f: float) -> str:
    """0.1 -> '10' (the file suffix and the table's column)."""
    return f"{f * 100:g}"


def eval_keys(plan: Plan) -> List[str]:
    return [m.key for m in eval_models(plan.objectives)]


class Layout:
    """The folders of one plan's run."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.out = plan.out

    # ---- paths ----
    @property
    def data_bin(self) -> Path:
        return self.out / "data-bin"

    @property
    def retrieval_dir(self) -> Path:
        return self.plan.retrieval_data or self.out / "retrieval"

    def pretrain_dir(self, obj: str, seed: int) -> Path:
        return self.out / "pretrain" / obj / f"s{seed}"

    def hf_dir(self, obj: str, seed: int) -> Path:
        return self.out / "hf" / obj / f"s{seed}"

    def eval_dir(self, obj: str, seed: int) -> Path:
        return self.out / "eval" / obj / f"s{seed}"

    def generator_checkpoint(self) -> Path:
        return self.out / "generator" / "checkpoint_last.pt"
