"""The plugin's pre-training objectives as the tests see them: one entry each.

Adding an objective to the plugin adds one entry here; the contract suite
(``test_contract.py``) then checks it like every other objective.
"""

from dataclasses import dataclass, field
from typing import List, Tuple

# deliberately odd sizes: hidden 32, FFN 37, 2 heads
TINY_ENCODER = [
    "--encoder-layers",
    "2",
    "--encoder-embed-dim",
    "32",
    "--encoder-ffn-embed-dim",
    "37",
    "--encoder-attention-heads",
    "2",
]


@dataclass
class Objective:
    name: str
    task: str
    criterion: str
    arch: str
    model_args: List[str] = field(default_factory=list)
    # terms that may see the encoder only through [CLS]
    bottleneck_terms: Tuple[str, ...] = ()
    # every term the criterion logs
    terms: Tuple[str, ...] = ("mlm",)
    # state-dict prefixes that exist only for pre-training
    heads: Tuple[str, ...] = ()
    # (option, session fixture): files the objective needs, made by a fixture of
    # the contract suite (SimLM's generator checkpoint)
    needs: Tuple[Tuple[str, str], ...] = ()
    # terms whose per-unit loss depends on the other units of its batch (in-batch
    # negatives), gathered across workers but not across --update-freq micro-batches:
    # the worker split must still give the same update, an --update-freq split must
    # give exactly the count-weighted mean of the micro-batches' own losses instead
    in_batch_terms: Tuple[str, ...] = ()

    def args(self, **fixtures) -> List[str]:
        """The objective's fairseq-train arguments; ``fixtures`` gives the value of each of ``needs``."""
        extra = []
        for option, fixture in self.needs:
            if fixture not in fixtures:
                raise KeyError(f"objective {self.name!r} needs the fixture {fixture!r} for {option}")
            extra += [option, str(fixtures[fixture])]
        return [
            "--task",
            self.task,
            "--criterion",
            self.criterion,
            "--arch",
            self.arch,
            *TINY_ENCODER,
            *self.model_args,
            *extra,
        ]


OBJECTIVES = [
    Objective(
        "seed",
        "seed_pretrain",
        "seed_pretrain",
        "seed_encoder_tiny",
        ["--decoder-layers", "2"],
        bottleneck_terms=("dec",),
        terms=("mlm", "dec"),
        heads=("weak_decoder.",),
    ),
    Objective(
        "seed_full",
        "seed_pretrain",
        "seed_pretrain",
        "seed_encoder_tiny",
        ["--decoder-layers", "1", "--decoder-attention-window", "full"],
        bottleneck_terms=("dec",),
        terms=("mlm", "dec"),
        heads=("weak_decoder.",),
    ),
    Objective("mlm_only", "seed_pretrain", "seed_pretrain", "seed_encoder_mlm_only", []),
    Objective(
        "simlm",
        "simlm_pretrain",
        "simlm_pretrain",
        "simlm_tiny",
        [],
        bottleneck_terms=("dec",),
        terms=("enc", "dec"),
        heads=("simlm_decoder.",),
        needs=(("--generator-path", "simlm_generator"),),
    ),
    Objective(
        "cpdae",
        "cpdae_pretrain",
        "cpdae_pretrain",
        "cpdae_tiny",
        [],
        bottleneck_terms=("bow", "cl"),
        terms=("mlm", "bow", "cl"),
        heads=("bow_decoder.",),
        in_batch_terms=("cl",),
    ),
    Objective(
        "retromae",
        "retromae_pretrain",
        "retromae_pretrain",
        "retromae_tiny",
        ["--decoder-ffn-embed-dim", "23"],
        bottleneck_terms=("dec",),
        terms=("mlm", "dec"),
        heads=("enhanced_decoder.",),
    ),
    Objective(
        "dupmae",
        "dupmae_pretrain",
        "dupmae_pretrain",
        "dupmae_tiny",
        ["--decoder-ffn-embed-dim", "23"],
        bottleneck_terms=("dec",),
        terms=("mlm", "dec", "bow"),
        heads=("enhanced_decoder.",),
    ),
]

BY_NAME = {o.name: o for o in OBJECTIVES}
