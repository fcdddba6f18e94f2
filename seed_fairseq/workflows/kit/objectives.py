"""The objectives the workflows run, as ``fairseq-train`` arguments over ONE encoder.

Every objective gets the same encoder options (``--encoder-*`` given, or an imported
model's ``model_args.txt``), data, blocks, optimiser, schedule, update count and
seed (:class:`PretrainSettings`); only the task, criterion, architecture (its
pre-training heads) and the objective's own settings (its paper's masking rates,
loss weights) differ.
The architectures are the ``*_base`` ones: with the encoder sizes given
explicitly, their decoders follow the encoder's width, as in the papers.

An objective that encodes several views of every text (CPDAE: two) gets that
share of the texts per update (``texts_per_update_factor``): the encoder then sees
the same number of tokens per update as every other objective.

``OBJECTIVES`` holds every registered objective with a full-size architecture that
fairseq-train can load (the plugin's own, or one whose description names its
``user_dir``); ``ORDER``, the default set, is the plugin's own: an objective of
another ``--user-dir`` runs when named.
"""

import argparse
import shlex
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from ...base.objectives import ObjectiveDescription
from .argv import ADAM_OPTIMIZERS, DEFAULT_OPTIMIZER, GENERATOR, train_args


@dataclass(frozen=True)
class ObjectiveSpec:
    """One objective as the workflows run it: the fields of its description they read, by its
    ``--objectives`` name."""

    name: str
    label: str
    task: str
    criterion: str
    arch: str
    # the objective's own settings (its paper's defaults are the task's defaults)
    extra: Tuple[str, ...] = ()
    # texts per update relative to the others (CPDAE: 2 views per text -> 1/2)
    texts_per_update_factor: float = 1.0
    # representations evaluated: the model's own vector ([CLS] + dot from scratch, the import's
    # pooling and similarity with --init), and DupMAE's own dense + sparse one
    representations: Tuple[str, ...] = ("own",)
    needs_generator: bool = False
    notes: str = ""
    # the --user-dir of an objective registered outside the plugin (objective_args adds it)
    user_dir: str = ""
    # what the report and the help texts say of it (seed_fairseq/base/objectives.py)
    description: Optional[ObjectiveDescription] = None

    def fingerprint_identity(self) -> str:
        """What a stage's fingerprint holds of it (``preprocess.stages.jsonable``): its name.  The rest
        is its registered description's, the code's own (and a callable, ``matches``, is no JSON)."""
        return self.name


class _Registered(Mapping):
    """The plugin's registered objectives as specs, by their ``--objectives`` name, in table order.
    Read from the task classes' descriptions (``seed_fairseq.base.objectives``) on first use, not at
    import: listing them imports fairseq, the workflows' libraries do not."""

    def __init__(self):
        self._specs: Optional[Dict[str, ObjectiveSpec]] = None

    def _load(self) -> Dict[str, ObjectiveSpec]:
        if self._specs is None:
            from ...pretrain.tasks.registry import runnable_objectives

            self._specs = {
                d.comparison_name: ObjectiveSpec(
                    d.comparison_name,
                    d.label,
                    d.task,
                    d.criterion,
                    d.arch,
                    d.args,
                    d.texts_per_update_factor,
                    d.representations,
                    d.needs_generator,
                    d.notes,
                    d.user_dir,
                    d,
                )
                for d in runnable_objectives()
            }
        return self._specs

    def __getitem__(self, name: str) -> ObjectiveSpec:
        return self._load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


class _Order(Sequence):
    """The default objectives: the plugin's own of ``OBJECTIVES`` (not another ``--user-dir``'s), in
    table order, read on first use like it."""

    def _names(self) -> Tuple[str, ...]:
        return tuple(name for name, spec in OBJECTIVES.items() if not spec.user_dir)

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())


OBJECTIVES: Mapping[str, ObjectiveSpec] = _Registered()
ORDER: Sequence[str] = _Order()


def parse_objectives(text: str) -> List[str]:
    """``seed,mlm`` -> ['seed', 'mlm'] in the given order; ValueError names the unknown ones."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in OBJECTIVES]
    if unknown:
        raise ValueError(f"--objectives: unknown {', '.join(unknown)}; choose from {','.join(OBJECTIVES)}")
    if not names:
        raise ValueError(f"--objectives: none given; choose from {','.join(ORDER)}")
    if len(set(names)) != len(names):
        raise ValueError("--objectives: an objective is listed twice")
    return names


@dataclass
class PretrainSettings:
    """What every objective's pre-training shares (the identical budget)."""

    encoder_args: List[str]
    tokens_per_sample: int
    batch_size: int  # texts per process per step for a one-view objective
    update_freq: int
    updates: int
    warmup: int
    lr: float
    validate_every: int
    probe_size: int
    fairseq_args: List[str] = field(default_factory=list)
    gpu: bool = False
    save_every: int = 0

    @classmethod
    def from_args(cls, args: argparse.Namespace, **given: Any) -> "PretrainSettings":
        """The settings of the flags of the same names (``--encoder-args`` and ``--fairseq-args`` split
        as a shell would), and ``given``: the ones the workflow resolves itself."""
        values = dict(given)
        for f in fields(cls):
            if f.name not in values:
                value = getattr(args, f.name)
                values[f.name] = shlex.split(value) if f.name in ("encoder_args", "fairseq_args") else value
        return cls(**values)

    def batch_for(self, spec: ObjectiveSpec) -> int:
        b = self.batch_size * spec.texts_per_update_factor
        if b != int(b) or b < 1:
            raise ValueError(
                f"--batch-size {self.batch_size}: {spec.name} needs {spec.texts_per_update_factor} x it to be a "
                "whole number of texts (two views each); use an even --batch-size"
            )
        return int(b)


def common_args(s: PretrainSettings) -> List[str]:
    """The fairseq-train options shared by every objective and by the generator."""
    return [
        "--tokens-per-sample",
        str(s.tokens_per_sample),
        "--sample-break-mode",
        "complete",
        "--update-freq",
        str(s.update_freq),
        *optimizer_args(s.fairseq_args),
        "--adam-betas",
        "(0.9,0.999)",
        "--adam-eps",
        "1e-6",
        "--weight-decay",
        "0.01",
        "--lr",
        str(s.lr),
        "--lr-scheduler",
        "polynomial_decay",
        "--warmup-updates",
        str(s.warmup),
        "--total-num-update",
        str(s.updates),
        "--max-update",
        str(s.updates),
        "--clip-norm",
        "1.0",
        "--dropout",
        "0.1",
        "--attention-dropout",
        "0.1",
        "--no-epoch-checkpoints",
        "--log-format",
        "json",
        "--log-interval",
        "10",
        "--num-workers",
        "0",
        # CPU: denormal flush (the Adam moments of rare vocabulary rows; see --flush-denormal of the tasks)
        *([] if s.gpu else ["--cpu", "--flush-denormal"]),
    ]


def named_optimizer(args: Sequence[str]) -> Optional[str]:
    """The optimizer ``args`` name (``--optimizer X`` or ``--optimizer=X``, the last one), None if none."""
    named = None
    for i, a in enumerate(args):
        if a == "--optimizer" and i + 1 < len(args):
            named = args[i + 1]
        elif a.startswith("--optimizer="):
            named = a.split("=", 1)[1]
    return named


def optimizer_args(fairseq_args: Sequence[str]) -> List[str]:
    """``--optimizer DEFAULT_OPTIMIZER``, or nothing when ``--fairseq-args`` names the optimizer
    (``--optimizer adam``: fairseq's own, the default before torch_adam): then the user's stands alone
    (``check_fairseq_args`` accepts the ones of ``ADAM_OPTIMIZERS``, which take the options written here)."""
    return [] if named_optimizer(fairseq_args) else ["--optimizer", DEFAULT_OPTIMIZER]


def objective_args(spec: ObjectiveSpec, s: PretrainSettings, seed: int, generator: str = None) -> List[str]:
    """fairseq-train arguments (after DATA) of one objective's pre-training run (``argv.train_args``)."""
    # validation (and its diagnostics) every validate_every updates only, not also at every epoch end
    # of a small corpus; checkpoints at the same updates (fairseq validates at every mid-epoch save)
    validation = (
        [
            "--validate-interval-updates",
            str(s.validate_every),
            "--validate-interval",
            "1000000",
            "--retrieval-probe-size",
            str(s.probe_size),
        ]
        if s.validate_every
        else ["--disable-validation"]
    )
    return train_args(
        spec.description,
        "--batch-size",
        str(s.batch_for(spec)),
        *common_args(s),
        *validation,
        "--save-interval-updates",
        str(s.validate_every or s.save_every),
        "--keep-interval-updates",
        "1",
        "--seed",
        str(seed),
        *s.fairseq_args,
        model=s.encoder_args,
        generator=generator,
    )


def generator_args(s: PretrainSettings, seed: int, *rest: str, model: Sequence[str] = ()) -> List[str]:
    """SimLM's generator's fairseq-train arguments (after DATA): the MLM-only encoder (``argv.GENERATOR``)
    with ``model``'s sizes, trained with the shared options of ``s`` and no validation, then ``rest``."""
    return train_args(
        GENERATOR,
        "--batch-size", str(s.batch_size), *common_args(s), "--disable-validation", "--seed", str(seed), *rest,
        model=model,
    )  # fmt: skip


# ---------------------------------------------------------------------------
# --fairseq-args: added options, never a second value for a planned one
# ---------------------------------------------------------------------------


def _training_options() -> Mapping[str, str]:
    """fairseq-train's option strings -> their destination (``--max-sentences`` is ``batch_size``)."""
    from fairseq import options

    return {opt: action.dest for opt, action in options.get_training_parser()._option_string_actions.items()}


def _options(args: Sequence[str], dests: Mapping[str, str]) -> Dict[str, str]:
    """{destination: the option as written} of the options in ``args`` (values and negative numbers skipped)."""
    found: Dict[str, str] = {}
    for a in args:
        if not a.startswith("-") or a[1:2].isdigit() or a[1:2] == ".":
            continue
        opt = a.split("=", 1)[0]
        found.setdefault(dests.get(opt, opt.lstrip("-").replace("-", "_")), opt)
    return found


def check_fairseq_args(user: Sequence[str], planned: Sequence[str], flag: str = "--fairseq-args") -> None:
    """ValueError when ``user`` (``--fairseq-args``) sets an option of ``planned`` (the tool's own
    fairseq-train arguments), under its name or an alias (``--max-sentences`` for ``--batch-size``):
    fairseq would take the last value, while the tool's report states its planned one.  Options the
    tool does not set (``--fp16``, ``--required-batch-size-multiple``) are what the flag is for.  The
    one planned option the flag may set is ``--optimizer``, to another of ``ADAM_OPTIMIZERS`` (the
    tools then write the user's instead of theirs: ``optimizer_args``)."""
    dests = _training_options()
    mine = _options(planned, dests)
    named = named_optimizer(user)
    if named is not None and named not in ADAM_OPTIMIZERS:
        raise ValueError(
            f"{flag}: --optimizer {named}: the tools write adam's options (--adam-betas, --adam-eps, "
            f"--weight-decay); choose {' or '.join(ADAM_OPTIMIZERS)}"
        )
    for dest, opt in _options(user, dests).items():
        if dest == "optimizer":
            continue  # one of ADAM_OPTIMIZERS (above)
        if dest in mine:
            raise ValueError(
                f"{flag}: {opt} is planned by the tool (as {mine[dest]}), and its report states the planned value; "
                "set it with the tool's own flag (see --help) instead of overriding it"
            )
