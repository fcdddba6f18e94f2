"""The plugin's pre-training objectives as the tests see them: one entry each.

The entries are read off the task classes' own descriptions
(``BottleneckPretrainTask.objectives``, ``seed_fairseq/base/objectives.py``): adding an
objective to the plugin adds nothing here, and the contract suite
(``test_contract.py``) checks it like every other objective.
"""

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from seed_fairseq.base.objectives import ObjectiveDescription
from seed_fairseq.pretrain.tasks.registry import plugin_objectives
from seed_fairseq.workflows.kit.argv import train_args


# deliberately odd sizes: hidden 32, FFN 37, 2 heads
def tiny_encoder(layers: int = 2) -> List[str]:
    """The tests' encoder: hidden 32, FFN 37, 2 heads (deliberately odd sizes)."""
    return [
        "--encoder-layers",
        str(layers),
        "--encoder-embed-dim",
        "32",
        "--encoder-ffn-embed-dim",
        "37",
        "--encoder-attention-heads",
        "2",
    ]


TINY_ENCODER = tiny_encoder()


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
    # the model card's heading, "# {title} (exported from fairseq)"
    title: str = ""
    # a module to import before a tool runs in a subprocess (fairseq-train, seed-drop-heads,
    # the export): an objective registered outside the plugin (tests/toy_objective.py)
    preload: str = ""
    # what the registry says of it (the builder's input)
    description: Optional[ObjectiveDescription] = None

    @classmethod
    def from_description(cls, d, **overrides) -> "Objective":
        """The entry of one ``ObjectiveDescription`` (its ``task`` filled in by the registry)."""
        fields = dict(
            name=d.name,
            task=d.task,
            criterion=d.criterion,
            arch=d.test_arch,
            model_args=list(d.test_args),
            bottleneck_terms=d.bottleneck_terms,
            terms=d.terms,
            heads=d.heads,
            # SimLM's frozen generator: a fixture of the contract suite
            needs=(("--generator-path", "simlm_generator"),) if d.needs_generator else (),
            in_batch_terms=d.in_batch_terms,
            title=d.title,
            description=d,
        )
        fields.update(overrides)
        return cls(**fields)

    def args(self, model: Sequence[str] = TINY_ENCODER, **fixtures) -> List[str]:
        """The objective's fairseq-train arguments from the kit's builder (``kit/argv.train_args``) at the
        test shape (``model``: the encoder's sizes); ``fixtures`` gives the value of each of ``needs``."""
        given = {}
        for option, fixture in self.needs:
            if fixture not in fixtures:
                raise KeyError(f"objective {self.name!r} needs the fixture {fixture!r} for {option}")
            given[option] = str(fixtures[fixture])
        unknown = set(given) - {"--generator-path"}
        if unknown:
            raise KeyError(f"objective {self.name!r}: the builder knows no {sorted(unknown)}")
        return train_args(
            self.description, model=model, arch=self.arch, own=self.model_args, generator=given.get("--generator-path")
        )


def _plugin_objectives() -> List[Objective]:
    """The objectives of the plugin's own tasks (not of a test's, registered in this process too)."""
    return [Objective.from_description(d) for d in plugin_objectives()]


OBJECTIVES = _plugin_objectives()

BY_NAME = {o.name: o for o in OBJECTIVES}
