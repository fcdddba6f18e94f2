"""Reruns that stay honest (issue 32 items 1, 5, 8): the stage runner of adapt, the adaptation
study and the comparison (``preprocess.stages``), at the level of fingerprints and stage
records: fast, nothing is trained.

* Item 1: what a stage body reads of the plan is what its fingerprint holds.  Stages are
  listed with ``PlanReads``: the declared plan fields are the options, and the body sees a
  ``PlanView`` that raises on any other field (the real runs of test_adapt.py,
  test_adapt_study.py and test_compare.py go through it).  Here: the view itself; every
  declared field of every stage of the three tools, changed, moves that stage's fingerprint;
  ``--seed`` reaches the import (its fresh MLM head) and both fine-tunings; the report says
  "fine-tuned identically" only from the two fine-tunings' own records.
* Item 5: a stage's options never come from another stage's output: the comparison with
  ``--init`` lists the same fingerprints before and after its import wrote ``model_args.txt``,
  and the first unchanged rerun of every tool does nothing.
* Item 8: a finished stage whose products are gone is redone, and only it (``rm -rf OUT/model``).
"""

import dataclasses
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import DEMO_CORPUS
from hf_models import save_bert
from objectives import TINY_ENCODER

from preprocess.stages import (
    WHOLE_PLAN,
    PlanReads,
    PlanView,
    Runner,
    Stage,
    UndeclaredInput,
    field_value,
)
from seed_fairseq.base.derived_set import derive_retrieval_set
from seed_fairseq.workflows.adapt import cli as adapt_cli
from seed_fairseq.workflows.adapt import study
from seed_fairseq.workflows.adapt.pipeline import Adaptation
from seed_fairseq.workflows.adapt.report import finetune_settings
from seed_fairseq.workflows.compare import cli as compare_cli
from seed_fairseq.workflows.compare.pipeline import Comparison
from seed_fairseq.workflows.kit.checks import glue_option_values
from seed_fairseq.workflows.kit.objectives import OBJECTIVES

ADAPT = ["--objective", "simlm", "--updates", "4", "--batch-size", "8", "--validate-every", "2", "--resamples", "100"]
STUDY = ["--objectives", "seed,simlm", "--arms", "none,safeguarded", "--seeds", "1,2", "--updates", "4",
         "--batch-size", "8", "--resamples", "100"]  # fmt: skip
COMPARE = ["--objectives", "seed,simlm", "--seeds", "2", "--vocab-size", "400", "--valid-docs", "4", "--updates", "4",
           "--warmup", "1", "--encoder-args", " ".join(TINY_ENCODER), "--tokens-per-sample", "48", "--batch-size", "8",
           "--validate-every", "2", "--probe-size", "16", "--max-seq-length", "48", "--k", "100",
           "--cos-lengths", "16,32"]  # fmt: skip


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny BERT saved without MLM head (its import draws one from the seed)."""
    return save_bert(tmp_path_factory.mktemp("fp_bert") / "bert", with_head=False)


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
    """A BEIR folder with train, dev and test splits (--train-queries, --retrieval-dev)."""
    root = tmp_path_factory.mktemp("fp_beir")
    derive_retrieval_set(DEMO_CORPUS, root / "beir", seed=1)
    return root / "beir"


def adaptation(out, bert, *extra):
    argv = ["--model", str(bert), "--corpus", str(DEMO_CORPUS), "--out", str(out), *ADAPT, *extra]
    return Adaptation(adapt_cli.build_plan(adapt_cli.parser().parse_args(argv), argv, "adapt.py"))


def the_study(out, bert, *extra):
    argv = ["--model", str(bert), "--corpus", str(DEMO_CORPUS), "--out", str(out), *STUDY, *extra]
    plan, objectives, arms, seeds = study.build(study.parser().parse_args(argv), argv, "adaptation_study.py")
    return study.Study(plan, objectives, arms, seeds)


def comparison(out, *extra):
    argv = ["--out", str(out), "--corpus", str(DEMO_CORPUS), *COMPARE, *extra]
    args = compare_cli.parser().parse_args(glue_option_values(argv, compare_cli.OPTION_LISTS))
    return Comparison(compare_cli.build_plan(args, argv, "compare_objectives.py"))


def fingerprints(tool):
    return Runner(tool.out, tool.stages(), tool.external()).fingerprints


# ---------------------------------------------------------------------------
# item 1: the plan view
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Inner:
    a: int
    b: int


@dataclasses.dataclass
class Plan:
    seed: int
    threads: int
    inner: Inner
    path: Path = Path("x")

    @property
    def doubled(self):
        return 2 * self.seed

    def sum_inner(self):
        return self.inner.a + self.inner.b


def test_a_stage_body_sees_only_the_fields_it_declares():
    plan = Plan(seed=3, threads=2, inner=Inner(1, 2))
    view = PlanView(plan, ("seed", "inner.a"), {"threads": "speed only"}, "import")
    assert view.seed == 3 and view.threads == 2 and view.inner.a == 1 and view.doubled == 6
    for read in (lambda: view.path, lambda: view.inner.b, lambda: view.sum_inner()):
        with pytest.raises(UndeclaredInput, match="stage import read plan"):
            read()
    with pytest.raises(UndeclaredInput):
        view.seed = 4
    with pytest.raises(UndeclaredInput, match=r"plan\.seed"):  # a property reads through the view too
        _ = PlanView(plan, (), {}, "s").doubled


def test_a_stage_gets_its_declared_fields_as_options_and_its_body_the_view():
    class Owner:
        plan = Plan(seed=3, threads=2, inner=Inner(1, 2))

    reads = PlanReads(free={"threads": "speed only"}, inputs={"path": "the_input"})
    seen = []
    stage = reads.stage(Owner, "s", lambda results, who: seen.append((who, Owner.plan.seed)) or {},
                        ("seed", "inner.a", "path"), params={"who": "me"})  # fmt: skip
    assert stage.options == {"seed": 3, "inner.a": 1, "path": "x", "param:who": "me"}
    assert stage.reads == ("the_input",)  # a declared input path: its content is read too
    stage.run({})
    assert seen == [("me", 3)] and isinstance(Owner.plan, Plan)  # the plan again after the body
    with pytest.raises(ValueError, match="never change a product"):
        reads.stage(Owner, "s", lambda r: {}, ("threads",))
    with pytest.raises(AttributeError, match="no field 'nope'"):
        reads.stage(Owner, "s", lambda r: {}, ("inner.nope",))
    whole = reads.stage(Owner, "report", lambda r: {}, (WHOLE_PLAN,))
    assert whole.options == {WHOLE_PLAN: {"seed": 3, "threads": 2, "inner": {"a": 1, "b": 2}, "path": "x"}}


# ---------------------------------------------------------------------------
# item 1: every declared field moves its stage's fingerprint, in every tool
# ---------------------------------------------------------------------------

# values to change fields to where "another value of the same type" is not a valid plan
OTHER = {"test_split": "dev", "best_metric": "dev_mrr10", "train_split": "dev"}


def _other(name, value, elsewhere):
    last = name.split(".")[-1]
    if last == "objective":  # adapt's: the parsed objective, fingerprinted by its name
        return OBJECTIVES["mlm"]
    if last in OTHER and OTHER[last] != value:
        return OTHER[last]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, Path):
        return elsewhere
    if isinstance(value, list):
        return [*value, value[-1] if value else "--x"]
    if isinstance(value, dict):
        return {**value, "changed": True}
    if value is None:
        paths = ("retrieval_dev", "train_queries", "init", "retrieval_data")
        return elsewhere if last in paths else 1
    raise AssertionError(f"no other value for {name}: {value!r}")


def _changed(plan, name, value):
    head, _, rest = name.partition(".")
    if not rest:
        return replace(plan, **{head: value})
    return replace(plan, **{head: _changed(getattr(plan, head), rest, value)})


def _leaves(plan, name):
    """``name`` and, for a dataclass field declared whole, each of its own fields (recursively); a value
    fingerprinted by its identity (``jsonable``: an objective, by its name) is one."""
    value = field_value(plan, name)
    if dataclasses.is_dataclass(value) and not hasattr(value, "fingerprint_identity"):
        return [leaf for f in dataclasses.fields(value) for leaf in _leaves(plan, f"{name}.{f.name}")]
    return [name]


def assert_every_declared_field_moves_its_stage(make, elsewhere, skip=lambda stage, leaf: False):
    """For every stage of ``make(plan)``'s list and every plan field it declares (each field of a
    dataclass declared whole): that field changed alone moves that stage's fingerprint.
    ``skip(stage, field)``: the field is not the tool's plan's in that stage (a study cell's seed)
    or cannot have another value (the study's --retrieval-dev)."""
    tool = make(None)
    before = fingerprints(tool)
    checked = 0
    for stage in tool.stages():
        declared = [k for k in stage.options if not k.startswith("param:")]
        if declared == [WHOLE_PLAN]:
            declared = [f.name for f in dataclasses.fields(tool.plan)]
        for leaf in (leaf for name in declared for leaf in _leaves(tool.plan, name) if not skip(stage.name, leaf)):
            plan = _changed(tool.plan, leaf, _other(leaf, field_value(tool.plan, leaf), elsewhere))
            after = fingerprints(make(plan))
            if stage.name in after:
                assert after[stage.name] != before[stage.name], f"{leaf} does not move stage {stage.name}"
                checked += 1
    return checked


def test_every_declared_field_moves_its_stage_in_adapt(tmp_path, bert, beir):
    base = adaptation(tmp_path / "out", bert, "--train-queries", str(beir))
    checked = assert_every_declared_field_moves_its_stage(
        lambda plan: base if plan is None else Adaptation(plan), tmp_path
    )
    assert checked > 100


def test_every_declared_field_moves_its_stage_in_the_study(tmp_path, bert):
    base = the_study(tmp_path / "out", bert)
    make = lambda plan: base if plan is None else study.Study(plan, base.objectives, base.arms, base.seeds)  # noqa: E731
    shared = {s.name for s in Adaptation.stages(base)} - {"report"}
    cell = ("objective", "seed", "freeze_updates", "encoder_warmup_updates", "encoder_lr_scale")  # study_plans

    def skip(stage, leaf):
        # the study derives its retrieval set (no --retrieval-dev, --train-queries); a cell's (and the
        # original's fine-tuning's) objective, seed and arm are its own plan's, set from --objectives, ...
        return leaf in ("retrieval_dev", "train_queries") or (stage not in shared and leaf in cell)

    assert assert_every_declared_field_moves_its_stage(make, tmp_path, skip) > 100


def test_every_declared_field_moves_its_stage_in_the_comparison(tmp_path, bert):
    for extra in ([], ["--init", str(bert), "--tokens-per-sample", "32", "--max-seq-length", "32"]):
        base = comparison(tmp_path / "out", *extra)
        checked = assert_every_declared_field_moves_its_stage(
            lambda plan, base=base: base if plan is None else Comparison(plan), tmp_path
        )
        assert checked > 50


def test_a_changed_seed_redoes_the_import_and_both_fine_tunings(tmp_path, bert, beir):
    """The issue's case: --seed 2 into an --out made with --seed 1 reused the seed-1 import (its fresh
    MLM head is drawn from the seed) and the seed-1 fine-tuning of the original."""
    one = fingerprints(adaptation(tmp_path / "out", bert, "--train-queries", str(beir)))
    two = fingerprints(adaptation(tmp_path / "out", bert, "--train-queries", str(beir), "--seed", "2"))
    moved = {name for name in one if one[name] != two[name]}
    assert {"import", "generator", "pretrain", "finetune-original", "finetune-adapted", "report"} <= moved
    # the study's shared import too (its cells have their own seeds)
    s1, s2 = fingerprints(the_study(tmp_path / "s", bert)), fingerprints(the_study(tmp_path / "s", bert, "--seed", "2"))
    assert s1["import"] != s2["import"]


def test_the_real_import_reads_only_what_it_declares(tmp_path, bert):
    """The guard on a real stage body, in-process (under a second each): the issue's case, the
    import that draws the model's fresh MLM head from the seed.  (The end-to-end tests of adapt,
    the study and the comparison run every other body through the same guard.)"""
    for tool in (
        adaptation(tmp_path / "a", bert),
        comparison(tmp_path / "c", "--init", str(bert), "--tokens-per-sample", "32", "--max-seq-length", "32"),
    ):
        imports = [s for s in tool.stages() if s.name == "import"]
        result = Runner(tool.out, imports, tool.external(), state_dir=tool.out / ".stages").run()["import"]
        assert (tool.out / "import" / "checkpoint.pt").is_file() and result["seconds"] >= 0


def _fake_import(out):
    (out / "import").mkdir(parents=True, exist_ok=True)
    (out / "import" / "model_args.txt").write_text("--encoder-layers 2 --encoder-embed-dim 32\n")
    record = {"mlm_head": "fresh", "fresh_heads": ["encoder.lm_head"]}
    (out / "import" / "seed_fairseq_import.json").write_text(json.dumps(record))


@pytest.mark.parametrize(
    "which",
    ["adapt", "adapt-probe", "adapt-dev", "study", "compare", "compare-init"],
)
def test_the_training_stages_read_only_what_they_declare(tmp_path, bert, beir, monkeypatch, which):
    """The real bodies of the stages that run fairseq-train (and of the FLOPs count), with
    fairseq-train and the counter replaced by stand-ins that keep the command: every variant's
    arguments are built under the guard, in a second (the end-to-end tests train one variant each)."""
    from seed_fairseq.workflows.compare import pipeline as compare_pipeline
    from seed_fairseq.workflows.kit import pipeline as kit_pipeline

    commands = []
    monkeypatch.setattr(kit_pipeline, "run_logged", lambda cmd, *a, **k: commands.append(cmd))
    monkeypatch.setattr(compare_pipeline, "count_update_flops", lambda data, args: commands.append(args) or {})
    out = tmp_path / "out"
    tool = {
        "adapt": lambda: adaptation(out, bert),
        "adapt-probe": lambda: adaptation(out, bert, "--best-checkpoint-metric", "probe_mrr10"),
        "adapt-dev": lambda: adaptation(out, bert, "--retrieval-dev", str(beir), "--freeze-encoder-updates", "1"),
        "study": lambda: the_study(out, bert),
        "compare": lambda: comparison(out),
        "compare-init": lambda: comparison(out, "--init", str(bert), "--tokens-per-sample", "32",
                                           "--max-seq-length", "32"),  # fmt: skip
    }[which]()
    _fake_import(out)
    training = [s for s in tool.stages() if s.name.split("-")[0] in ("generator", "pretrain", "flops")]
    done = {name: "x" for s in training for name in s.reads}
    results = Runner(out, training, done, state_dir=out / ".stages").run()
    assert set(results) == {s.name for s in training} and len(commands) >= len(training)


def test_both_fine_tunings_declare_the_same_inputs(tmp_path, bert, beir):
    stages = {s.name: s for s in adaptation(tmp_path / "out", bert, "--train-queries", str(beir)).stages()}
    original, adapted = stages["finetune-original"].options, stages["finetune-adapted"].options
    # the same options but the model: the original reads --model itself, the adapted one the export stage's
    assert {k: v for k, v in original.items() if k not in ("param:who", "model")} == {
        k: v for k, v in adapted.items() if k != "param:who"
    }
    assert "seed" in original and "finetune" in original and original["model"] == str(bert)
    assert "export" in stages["finetune-adapted"].reads and "model" in stages["finetune-original"].reads


def test_the_report_says_identically_only_from_the_records():
    same = {"data": "q", "lr": 2e-5, "seed": 1}
    results = {"finetune-original": {"settings": same}, "finetune-adapted": {"settings": dict(same)}}
    assert finetune_settings(results) == same
    results["finetune-adapted"]["settings"] = {**same, "seed": 2}
    with pytest.raises(RuntimeError, match="not identical"):
        finetune_settings(results)


# ---------------------------------------------------------------------------
# items 5 and 8: the first rerun does nothing; a missing product is rebuilt
# ---------------------------------------------------------------------------


def _fake_run(tool, stage):
    """A body that writes what the stage would (a file per pattern it declares, its products;
    the import's model_args.txt and record, which a listing must never read)."""

    def run(results, stage=stage):
        tool.ran.append(stage.name)
        if stage.folder is not None:
            folder = tool.out / stage.folder
            folder.mkdir(parents=True, exist_ok=True)
            for pattern in stage.writes or ("made.txt",):
                (folder / pattern.replace("*", "x")).parent.mkdir(parents=True, exist_ok=True)
                (folder / pattern.replace("*", "x")).write_text(stage.name)
            if stage.name == "import":
                (folder / "model_args.txt").write_text("--encoder-layers 3 --encoder-embed-dim 48\n")
                (folder / "seed_fairseq_import.json").write_text(json.dumps({"mlm_head": "fresh"}))
        for rel in stage.products:
            (tool.out / rel).write_text(stage.name)
        return {"seconds": 0.0}

    return run


def run_fake(tool):
    """The tool's stages, listed afresh, run with fake bodies; the names of those that ran."""
    tool.ran = []
    stages = [replace(s, run=_fake_run(tool, s)) for s in tool.stages()]
    Runner(tool.out, stages, tool.external(), state_dir=tool.out / ".stages").run()
    return tool.ran


@pytest.mark.parametrize("which", ["adapt", "study", "compare-init"])
def test_the_first_unchanged_rerun_does_nothing(tmp_path, bert, beir, which):
    make = {
        "adapt": lambda: adaptation(tmp_path / "out", bert, "--train-queries", str(beir)),
        "study": lambda: the_study(tmp_path / "out", bert),
        # the stage options used to read import/model_args.txt, which exists only after the import ran
        "compare-init": lambda: comparison(tmp_path / "out", "--init", str(bert), "--tokens-per-sample", "32",
                                           "--max-seq-length", "32"),  # fmt: skip
    }[which]
    listed = fingerprints(make())
    first = run_fake(make())
    assert first and "import" in first
    assert fingerprints(make()) == listed  # the same fingerprints once the import's files exist
    assert run_fake(make()) == []


def test_a_deleted_product_is_rebuilt_and_only_it(tmp_path, bert, beir):
    make = lambda: adaptation(tmp_path / "out", bert, "--train-queries", str(beir))  # noqa: E731
    run_fake(make())
    out = tmp_path / "out"
    shutil.rmtree(out / "model")  # the case: "nothing to do", then "model folder not found"
    assert run_fake(make()) == ["export"]
    assert (out / "model").is_dir()
    (out / "report.md").unlink()
    assert run_fake(make()) == ["report"]
    (out / "eval" / "zeroshot-adapted" / "run.trec").unlink()  # one file of a stage's folder
    assert run_fake(make()) == ["zeroshot-adapted"]
    (out / "eval" / "zeroshot-adapted" / "notes.txt").write_text("the user's")  # not a product: nothing redone
    assert run_fake(make()) == []
    # the comparison's and the study's stage folders are the same Runner's
    cmp = lambda: comparison(tmp_path / "cmp")  # noqa: E731
    run_fake(cmp())
    shutil.rmtree(tmp_path / "cmp" / "hf" / "seed" / "s1")
    assert run_fake(cmp()) == ["export-seed-s1"]


def test_the_runner_redoes_a_stage_whose_folder_or_file_is_gone(tmp_path):
    made = []

    def body(name, rel):
        def run(results):
            made.append(name)
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(name)
            return {}

        return run

    def stages():
        return [
            Stage("a", body("a", "a/out.bin"), folder="a", writes=("*.bin",)),
            Stage("b", body("b", "b/out.bin"), reads=("a",), folder="b", writes=()),
            Stage("c", body("c", "c.md"), reads=("b",), products=("c.md",)),
        ]

    Runner(tmp_path, stages(), {}).run()
    assert made == ["a", "b", "c"]
    shutil.rmtree(tmp_path / "a")
    Runner(tmp_path, stages(), {}).run()
    assert made[3:] == ["a"]  # the same fingerprint: what reads it is not redone
    (tmp_path / "b" / "out.bin").unlink()
    (tmp_path / "c.md").unlink()
    Runner(tmp_path, stages(), {}).run()
    assert made[4:] == ["b", "c"]
    Runner(tmp_path, stages(), {}).run()
    assert made[6:] == []
