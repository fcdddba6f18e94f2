"""An eighth objective defined in the tests only (``toy_objective.py``: its own task,
criterion and model, registered under test names, no file of the plugin edited) passes
the contract every objective of the plugin passes (``test_contract.py``), the export
included, and the workflows plan it like the plugin's own (the comparison, adapt, gpucheck's
dry run): what an objective needs is its own files and its description."""

import dataclasses

import pytest
import toy_objective
from helpers import DEMO_CORPUS, REPO
from objectives import Objective
from test_contract import (
    POOLINGS,
    build,
    check_bottleneck,
    check_drop_heads,
    check_export,
    check_fused_vocabulary_loss,
    check_micro_batch_normalisation,
    check_resume,
    check_split_invariance,
    run_straight,
)

from seed_fairseq.pretrain.tasks.registry import objective_for, registered_objectives
from seed_fairseq.workflows.kit.objectives import OBJECTIVES, ORDER

TOY = Objective.from_description(objective_for("toy_pretrain", {}), preload=toy_objective.__name__)


@pytest.fixture(scope="module")
def toy_run(contract_data, tmp_path_factory):
    return run_straight(TOY, contract_data, tmp_path_factory)


def test_the_registry_lists_it():
    (toy,) = [d for d in registered_objectives() if d.task == "toy_pretrain"]
    assert toy.name == TOY.name == "toy" and toy.criterion == "toy_pretrain"


@pytest.mark.parametrize("pooling", list(POOLINGS))
def test_decoder_side_sees_the_encoder_only_through_the_pooling(pooling, contract_data):
    check_bottleneck(TOY, contract_data, pooling)


def test_update_is_the_count_weighted_mean_of_the_micro_batches(contract_data):
    check_micro_batch_normalisation(TOY, contract_data)


def test_its_mlm_term_is_computed_as_vocab_loss_says(contract_data, monkeypatch):
    """CONTRIBUTING's rule: the MLM prediction goes through ``vocabulary_term`` (fused by default)."""
    from seed_fairseq.pretrain.criterions import vocab_loss

    check_fused_vocabulary_loss(TOY, contract_data)
    calls = []

    def spy(hidden, weight, target, *args, **kwargs):
        calls.append(target.numel())
        return real(hidden, weight, target, *args, **kwargs)

    real = vocab_loss.vocab_term
    monkeypatch.setattr(vocab_loss, "vocab_term", spy)
    task, model, criterion = build(TOY, contract_data)
    task.load_dataset("valid")
    sample = next(task.get_batch_iterator(task.dataset("valid"), max_sentences=2, seed=1).next_epoch_itr(shuffle=False))
    criterion.compute_terms(model, sample)
    assert calls == [int(sample["target"].ne(task.source_dictionary.pad()).sum())]


@pytest.mark.slow
def test_update_does_not_depend_on_the_split(contract_data, tmp_path):
    check_split_invariance(TOY, contract_data, tmp_path)


@pytest.mark.slow
def test_resume_logs_the_same_next_losses(toy_run, contract_data, tmp_path):
    check_resume(toy_run, contract_data, tmp_path)


@pytest.mark.slow
def test_drop_heads_gives_a_stock_roberta(toy_run, contract_data, tmp_path):
    check_drop_heads(toy_run, contract_data, tmp_path)


@pytest.mark.slow
def test_export_equals_fairseq(toy_run, contract_data, tmp_path):
    check_export(toy_run, contract_data, tmp_path)


# ---------------------------------------------------------------------------
# the workflows: planned from its description, not skipped (cheap: nothing trains)
# ---------------------------------------------------------------------------


def _parses_as_toy(argv):
    """fairseq-train's parser takes ``argv`` (the toy's --user-dir last, so it counts) and makes the toy."""
    from fairseq import options

    ns = options.parse_args_and_arch(options.get_training_parser(), ["DATA", "--user-dir", "PLUGIN", *argv])
    assert (ns.task, ns.criterion, ns.arch, ns.user_dir) == ("toy_pretrain", "toy_pretrain", "toy_encoder_base",
                                                            toy_objective.TOY.user_dir)  # fmt: skip
    assert ns.vocab_loss == "chunked"  # the criterion's options are VocabLossConfig's


def test_the_comparison_plans_it(tmp_path):
    from seed_fairseq.workflows.compare import cli
    from seed_fairseq.workflows.compare.pipeline import Comparison
    from seed_fairseq.workflows.compare.report import differences

    assert "toy" in OBJECTIVES and "toy" not in ORDER  # another --user-dir's: run when named
    argv = ["--objectives", "mlm,toy", "--out", str(tmp_path / "out"), "--updates", "4", "--warmup", "0"]
    comparison = Comparison(cli.build_plan(cli.parser().parse_args(argv), argv, "test"))
    assert any(s.name.startswith("pretrain-toy") for s in comparison.stages())
    args = comparison.pretrain_args("toy", 1)
    assert args[:2] == ["--user-dir", toy_objective.TOY.user_dir]
    _parses_as_toy([a for a in args if a not in ("--cpu", "--flush-denormal")])
    # the report's prose reads the descriptions: masking, fewer texts per update, the generator
    assert "`mlm` 15%, `toy` 15% (a toy's)" in differences(comparison.plan)[0]
    argv = ["--objectives", "cpdae,toy,simlm,mlm", "--out", str(tmp_path / "out2"), "--updates", "4", "--warmup", "0"]
    lines = differences(cli.build_plan(cli.parser().parse_args(argv), argv, "test"))
    assert "(`cpdae`/`mlm` 15%, `toy` 15% (a toy's), `simlm` 30% (50% for the decoder) replaced by" in lines[0]
    assert lines[1].startswith("* CPDAE encodes two masked views of every text, so it gets half the texts per update")
    assert lines[2].startswith("* The frozen generator of SimLM is trained first") and len(lines) == 3


def test_adapt_plans_it(tmp_path):
    from hf_models import save_sentence_model

    from seed_fairseq.workflows.adapt import cli
    from seed_fairseq.workflows.adapt.pipeline import Adaptation

    assert ", ".join(ORDER) in " ".join(cli.parser().format_help().split())  # the help: the default set
    model = save_sentence_model(tmp_path / "bert", "mean", normalize=True)
    argv = ["--model", str(model), "--corpus", str(DEMO_CORPUS), "--out", str(tmp_path / "out"),
            "--objective", "toy", "--updates", "4", "--batch-size", "8", "--validate-every", "2",
            "--probe-size", "16"]  # fmt: skip
    adaptation = Adaptation(cli.build_plan(cli.parser().parse_args(argv), argv, "test"))
    assert "pretrain" in [s.name for s in adaptation.stages()]
    args = adaptation.pretrain_args(planned=True)
    assert args[:2] == ["--user-dir", toy_objective.TOY.user_dir] and "toy_pretrain" in args


def test_gpucheck_lists_it_and_runs_it_when_named(tmp_path, capsys):
    from seed_fairseq.workflows.gpucheck import cli
    from seed_fairseq.workflows.gpucheck.profile import dry_run_profile, setups

    found = {s.name: s for s in setups(dry_run_profile(), "generator.pt")}
    toy = found["toy"]
    assert toy.args[:2] == ("--user-dir", toy_objective.TOY.user_dir) and "toy_encoder_tiny" in toy.args
    assert not toy.default and all(found[n].default for n in ORDER if n in found)
    # named, it is known (only the unknown name is refused, before anything runs)
    assert cli.main(["--dry-run", "--out", str(tmp_path / "out"), "--objectives", "toy,nonesuch"]) == 2
    err = capsys.readouterr().err
    assert "unknown nonesuch;" in err and "toy" in err.split("choose from")[1]


def test_a_description_without_its_user_dir_is_left_to_its_own_process(monkeypatch):
    """Registered in this process but not loadable by fairseq-train: the workflows leave it out."""
    from seed_fairseq.workflows.gpucheck.profile import dry_run_profile, setups
    from seed_fairseq.workflows.kit.objectives import _Registered

    lost = dataclasses.replace(toy_objective.TOY, user_dir="")
    monkeypatch.setattr(toy_objective.ToyPretrainTask, "objectives", (lost,))
    assert "toy" not in _Registered()  # a fresh table: read on first use
    assert "toy" not in [s.name for s in setups(dry_run_profile(), "generator.pt")]


def test_the_benchmarks_measure_every_objective_of_the_plugin(monkeypatch):
    """benchmarks/step_time.py and data_pipeline.py read the registry: every objective of the plugin is a
    setup (fairseq-train there loads the plugin alone, so not another --user-dir's), its generator flagged."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # the benchmarks import each other by name
    import data_pipeline
    import step_time

    plugin = [o for o in OBJECTIVES.values() if not o.user_dir]
    for known in (step_time.setups(), data_pipeline.setups()):
        assert "toy" not in known and known["masked_lm"].task == "masked_lm"
        by_task = {(d.task, d.arch): d.needs_generator for d in known.values()}
        assert all(by_task[(o.task, o.arch)] == o.needs_generator for o in plugin)
    assert step_time.setups()["seed_plain"].args[-2:] == ("--vocab-loss", "plain")
