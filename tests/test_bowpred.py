"""Bag-of-Word Prediction's own pieces (the contract suite checks it like every objective): the bag
written out, the loss computed by hand, the weight's decay, the units, bfloat16."""

import math

import pytest
import torch
from objectives import BY_NAME
from test_contract import build

from seed_fairseq.pretrain.criterions.bowpred_pretrain import bow_term, decay_factor
from seed_fairseq.pretrain.tasks.bowpred_pretrain import bag_of_words

BOWPRED = BY_NAME["bowpred"]


def test_the_bag_is_the_set_of_distinct_ordinary_tokens():
    # fairseq's specials 0-3 (<s>=[CLS], <pad>, </s>, <unk>), <mask> = 9, vocabulary of 10
    tokens = torch.tensor([[0, 5, 7, 5, 9, 2, 1], [0, 4, 3, 2, 1, 1, 1], [0, 2, 1, 1, 1, 1, 1]])
    bag = bag_of_words(tokens, nspecial=4, mask_idx=9, vocab_size=10)
    expected = torch.zeros(3, 10, dtype=torch.bool)
    expected[0, [5, 7]] = True  # 5 twice: once in the set; <mask>, </s>, <pad> never
    expected[1, 4] = True  # <unk> is a special
    assert torch.equal(bag, expected)  # the third text has an empty bag


def test_the_loss_by_hand():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 0.0, 0.0, 0.0]])
    bag = torch.tensor([[False, True, False, True], [True, False, False, False]])
    logp = torch.log_softmax(logits, -1)
    text_0 = -(logp[0, 1] + logp[0, 3]) / 2  # the mean over its bag of 2
    text_1 = -logp[1, 0]
    assert float(bow_term(logits, bag, "text").loss) == pytest.approx(float(text_0 + text_1), rel=1e-6)
    by_pairs = bow_term(logits, bag, "distinct")  # summed: the task divides by the 3 pairs
    assert float(by_pairs.loss) == pytest.approx(float(2 * text_0 + text_1), rel=1e-6)
    # text 0's top-2 are ids 3 and 2: one of its two words; text 1's top-1 is id 0, its word
    assert int(by_pairs.correct) == 2


def test_the_weight_decays_along_a_cosine_as_the_reference_code():
    assert decay_factor(None, 500, 1000) == 1.0  # default: the paper's constant weight
    assert decay_factor(0.1, 0, 1000) == pytest.approx(1.0)
    assert decay_factor(0.1, 500, 1000) == pytest.approx(0.55)
    assert decay_factor(0.1, 250, 1000) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert decay_factor(0.1, 1000, 1000) == pytest.approx(0.1) == decay_factor(0.1, 5000, 1000)


@pytest.mark.parametrize("normalize", ["text", "distinct"])
def test_units_and_the_criterion_end_to_end(contract_data, normalize):
    """The term from the model's own pieces: the bottleneck vector through the MLM head; its units as
    ``--bow-normalize`` says; a decayed weight scales the update's loss and leaves the criterion's weights."""
    task, model, criterion = build(BOWPRED, contract_data, "--bow-normalize", normalize, "--dropout", "0")
    task.load_dataset("valid")
    sample = next(task.get_batch_iterator(task.dataset("valid"), max_sentences=3, seed=1).next_epoch_itr(shuffle=False))
    model.eval()
    src = sample["net_input"]["src_tokens"]
    bag, size = task.bag(sample)
    assert bag.sum() > 0 and not bag[:, : task.source_dictionary.nspecial].any() and not bag[:, task.mask_idx].any()
    counts = task.term_counts(sample)
    assert int(counts["bow"]) == (int(size.sum()) if normalize == "distinct" else int(size.gt(0).sum()))

    with torch.no_grad():
        features, _ = model(src, features_only=True)
        weight, bias = model.mlm_projection()
        logits = model.mlm_hidden(features[:, 0]) @ weight.T + bias  # [CLS] (the default pooling)
        logp = torch.log_softmax(logits.float(), -1)
        per_text = -(logp * bag).sum(-1)
        expected = (per_text / size.clamp(min=1)).sum() if normalize == "text" else per_text.sum()
        terms = criterion.compute_terms(model, sample)
    assert float(terms["bow"].loss) == pytest.approx(float(expected), rel=1e-5)

    with torch.no_grad():
        loss, _, log = criterion(model, sample)
        criterion.decay_to, criterion.max_update, model.num_updates = 0.1, 10, 10
        decayed, _, decayed_log = criterion(model, sample)
    assert criterion.weights == {"mlm": 1.0, "bow": 1.0}
    assert log["bow_weight"] == 1.0 and decayed_log["bow_weight"] == pytest.approx(0.1)
    bow_mean = float(terms["bow"].loss) / int(counts["bow"])
    assert float(loss - decayed) == pytest.approx(0.9 * bow_mean, rel=1e-4)


def test_bfloat16_logits_give_a_finite_loss():
    torch.manual_seed(0)
    logits = (torch.randn(4, 32003) * 30).bfloat16()
    bag = torch.rand(4, 32003) < 0.01
    assert torch.isfinite(bow_term(logits, bag, "text").loss) and torch.isfinite(bow_term(logits, bag, "distinct").loss)
