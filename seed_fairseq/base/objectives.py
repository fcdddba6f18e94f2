"""What a pre-training objective is, as the tools outside its code need to know it.

Each task class of an objective carries a tuple of :class:`ObjectiveDescription`
(``BottleneckPretrainTask.objectives``): one per variant it serves (``seed_pretrain``
serves SEED-Encoder, its full-attention ablation and the MLM-only baseline).  The
exported model card, the comparison and the contract tests read them through
``seed_fairseq.pretrain.tasks.registry`` instead of keeping tables of their own, so adding an
objective adds no entry anywhere else: the benchmarks' setups, the comparison's report
prose, the workflows' help texts and the objectives' tables
(``scripts/objective_tables.py``) are written from these fields too.

This module is below everything (it imports nothing of the project nor fairseq):
a tool may hold descriptions without importing fairseq; listing the registered
ones (``tasks.registry.registered_objectives``) imports it.
"""

from dataclasses import dataclass
from typing import Callable, Optional, Tuple


@dataclass(frozen=True)
class ObjectiveDescription:
    """One pre-training objective (or variant) of a task class."""

    # -- identity -------------------------------------------------------------------------
    name: str  # unique over all objectives (the contract tests' ids: seed, seed_full, mlm_only ...)
    criterion: str  # the fairseq criterion it trains with
    # the task's registry name: filled in by the registry from the class's registration
    task: str = ""
    # a checkpoint's model config (dict) -> is it this variant?  None: the task's default
    # variant (the first without a predicate), used when no other variant matches
    matches: Optional[Callable[[dict], bool]] = None

    # -- what it is: the exported model card and the docs ---------------------------------
    title: str = ""  # the card's heading: "# {title} (exported from fairseq)"
    card_text: str = ""  # "A RoBERTa-style encoder pre-trained with {card_text}, ..."
    tag: str = "bottleneck-pretraining"  # the card's first tag
    paper: str = ""  # citation: authors, title, venue
    paper_url: str = ""
    doc: str = ""  # its page, from the repository's root: "docs/objectives/<name>.md" (the tables link it)
    # the pre-training heads in a phrase, for the objectives' table ("3 causal layers, attention window k=2")
    heads_text: str = ""

    # -- how it is trained at full size: the comparison -----------------------------------
    label: str = ""  # the comparison's row label
    compare_name: str = ""  # the comparison's --objectives spelling (default: name)
    arch: str = ""  # full-size architecture (the decoder follows the encoder's width)
    args: Tuple[str, ...] = ()  # fairseq-train options that make this variant (its paper's settings)
    texts_per_update_factor: float = 1.0  # texts per update relative to the others (two views: 0.5)
    # retrieval representations evaluated (retrieval/representations.py): the model's own vector
    representations: Tuple[str, ...] = ("own",)
    needs_generator: bool = False  # --generator-path (a frozen masked LM) is required
    notes: str = ""  # what differs from the others, in a phrase (the comparison's table)
    # the encoder's masking at its paper's settings, in a phrase (the comparison's report: "30% whole words")
    masking: str = "15%"
    # why texts_per_update_factor is not 1, completing "<label> ..., so it gets <share> the texts per update"
    texts_per_update_reason: str = ""
    # the --user-dir fairseq-train loads for it (a folder whose import registers it, after seed_fairseq);
    # empty: the plugin's own.  The workflows put it after their own --user-dir (the last one counts)
    user_dir: str = ""
    order: int = 100  # position in tables (the comparison's order), then the name

    # -- what the contract tests check (tests/objectives.py) ------------------------------
    test_arch: str = ""  # a tiny architecture (the tests add a tiny encoder's sizes)
    # the tests' further fairseq-train options (its own, not `args`: the tests pick their sizes)
    test_args: Tuple[str, ...] = ()
    terms: Tuple[str, ...] = ("mlm",)  # every term the criterion logs
    bottleneck_terms: Tuple[str, ...] = ()  # terms that see the encoder only through the bottleneck vector
    heads: Tuple[str, ...] = ()  # state-dict prefixes the model has only for pre-training
    # terms whose per-unit loss depends on the other units of the batch (in-batch negatives)
    in_batch_terms: Tuple[str, ...] = ()

    @property
    def comparison_name(self) -> str:
        return self.compare_name or self.name

    def user_dir_args(self) -> Tuple[str, ...]:
        """``("--user-dir", user_dir)`` for an objective registered outside the plugin, else ()."""
        return ("--user-dir", self.user_dir) if self.user_dir else ()


def variant_for(descriptions: Tuple[ObjectiveDescription, ...], model_cfg: dict) -> Optional[ObjectiveDescription]:
    """The description among one task's ``descriptions`` that a checkpoint with ``model_cfg`` was
    trained as: the first whose ``matches`` accepts it, else the first without a predicate."""
    for d in descriptions:
        if d.matches is not None and d.matches(model_cfg):
            return d
    return next((d for d in descriptions if d.matches is None), None)
