"""An eighth objective defined in the tests only (``toy_objective.py``: its own task,
criterion and model, registered under test names, no file of the plugin edited) passes
the contract every objective of the plugin passes (``test_contract.py``), the export
included: what an objective needs is its own files and its description."""

import pytest
import toy_objective
from objectives import Objective
from test_contract import (
    POOLINGS,
    check_bottleneck,
    check_drop_heads,
    check_export,
    check_micro_batch_normalisation,
    check_resume,
    check_split_invariance,
    run_straight,
)

from seed_fairseq.pretrain.tasks.registry import objective_for, registered_objectives

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
