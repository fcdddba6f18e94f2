"""What one comparison does, resolved from the flags and the preset, and where it keeps everything
(the stages, the evaluation, the report and the up-front checks share it; none imports ``pipeline``).

    OUT/compare.json           the tool's record: the folder is its own
    OUT/.stages/               the stage records (preprocess.stages.Runner)
    OUT/import/  data-bin/  retrieval/  bm25/  roundtrip/  generator/    the shared stages' (kit.pipeline)
    OUT/pretrain/O/sS/  hf/O/sS/  eval/O/sS/
    OUT/results.md  results.json  *.png
"""

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from ..kit.folder import ToolFolder, tool_log
from ..kit.pipeline import RunPlan

TOOL = "seed_fairseq.compare"
RECORD = "compare.json"  # the tool's record in --out: the folder is its own
COMPARISON = ToolFolder(TOOL, RECORD, "the comparison (examples/compare_objectives.py)", "comparison")
EVAL_FILES = ("cls_similarity.json", "*.zeroshot.trec", "*.ft*.trec", "*.ft*.json")  # evaluation.py

log = tool_log("compare")


@dataclass
class Plan(RunPlan):
    """Everything a run does, resolved from the flags and the preset."""

    objectives: List[str]
    seeds: List[int]
    init: Optional[Path]  # --init: the HuggingFace model every objective continues
    vocab_size: int
    generator_args: List[str]
    retrieval_data: Optional[Path]  # a BEIR / MS MARCO folder, else the set is derived from the corpus
    retrieval_docs: int
    train_split: str
    fractions: List[float]
    cos_lengths: List[int]
    cos_pairs: int
    preset: str


def run_name(obj: str, seed: int) -> str:
    return f"{obj}-s{seed}"


def fraction_label(f: float) -> str:
    """0.1 -> '10' (the file suffix and the table's column)."""
    return f"{f * 100:g}"
