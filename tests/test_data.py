"""The seed_pretrain data pipeline on real binarized text, and bad data input."""

import shutil

import pytest
import torch
from conftest import build_task_model
from helpers import check, cli, run, train_cmd

from seed_fairseq.pretrain.data.update_counts import UPDATE_COUNTS, UpdateCountsEpochBatchIterator


@pytest.fixture(scope="module")
def loaded(demo_data_bin):
    task, model, criterion, cfg = build_task_model(demo_data_bin, tokens_per_sample=128)
    task.load_dataset("train")
    return task


def _items(task, split="train"):
    """Every item of a split, with NestedDictionaryDataset's flat keys nested again."""
    ds = task.datasets[split]
    items = []
    for i in range(len(ds)):
        item = {}
        for key, value in ds[i].items():
            *parents, leaf = key.split(".")
            node = item
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
        items.append(item)
    return items


def test_decoder_target_is_decoder_input_shifted_by_one(loaded):
    d = loaded.source_dictionary
    eos, bos = d.eos(), d.bos()
    ends_on_doc_boundary = consecutive_separators = 0
    for item in _items(loaded):
        src = item["net_input"]["src_tokens"]
        prev = item["net_input"]["prev_output_tokens"]
        tgt = item["dec_target"]
        assert len(prev) == len(tgt) == len(src) - 1
        assert torch.equal(tgt[:-1], prev[1:])  # target[t] == input[t+1] everywhere
        assert prev[0] == bos  # decoder input starts with [CLS]
        unmasked = torch.cat([prev, tgt[-1:]])  # the one sequence both are cut from
        assert d.index("<mask>") not in unmasked.tolist()
        # the encoder sees the same block, masked only where the MLM target is set
        keep = item["target"].eq(d.pad())
        assert torch.equal(src[keep], unmasked[keep])
        assert torch.equal(item["target"][~keep], unmasked[~keep])
        # [CLS] never is a decoder target; every separator is
        assert bos not in tgt.tolist()
        pairs = (tgt[1:] == eos) & (tgt[:-1] == eos)
        consecutive_separators += int(pairs.any())
        ends_on_doc_boundary += int(len(tgt) > 1 and tgt[-1] == eos and tgt[-2] == eos)
    # the real corpus must have exercised the edge cases
    assert consecutive_separators > 0 and ends_on_doc_boundary > 0


def test_blocks_respect_tokens_per_sample_and_mask_rate(loaded):
    items = _items(loaded)
    eos = loaded.source_dictionary.eos()
    for it in items:
        tgt = it["dec_target"]
        if len(tgt) + 1 > 128:
            # "complete" never cuts a sentence: only a single over-long
            # sentence may exceed the block (fairseq then skips it)
            assert int(tgt[:-1].eq(eos).sum()) == 0
    assert sum(len(it["dec_target"]) + 1 <= 128 for it in items) > 0.9 * len(items)
    pad = loaded.source_dictionary.pad()
    n_tok = sum(len(it["net_input"]["src_tokens"]) for it in items)
    n_mask = sum(int(it["target"].ne(pad).sum()) for it in items)
    assert 0.12 < n_mask / n_tok < 0.18  # 15% masking


def test_whole_word_masking_masks_whole_words(demo_data_bin):
    task, _, _, _ = build_task_model(demo_data_bin, "--mask-whole-words", tokens_per_sample=128)
    task.load_dataset("valid")
    d = task.source_dictionary
    starts = task.whole_word_mask()
    pad = d.pad()
    checked = 0
    for item in _items(task, "valid"):
        unmasked = torch.cat([item["net_input"]["prev_output_tokens"], item["dec_target"][-1:]])
        masked = item["target"].ne(pad)
        for t in range(1, len(unmasked) - 1):
            # a continuation piece is masked iff the piece before it is
            if not starts[unmasked[t]] and unmasked[t] != pad:
                assert masked[t] == masked[t - 1]
                checked += 1
    assert checked > 50


def test_iterator_attaches_counts_of_the_whole_update(loaded):
    pad = loaded.source_dictionary.pad()
    itr = loaded.get_batch_iterator(loaded.dataset("train"), max_sentences=4, seed=1)
    wrapped = UpdateCountsEpochBatchIterator(itr._epoch_iter, [3], loaded.term_counts)
    samples = list(wrapped.next_epoch_itr(shuffle=True))
    for g in range(0, len(samples) - 3, 3):
        group = samples[g : g + 3]
        for s in group:
            assert set(s[UPDATE_COUNTS]) == {"mlm", "dec"}
            assert int(s[UPDATE_COUNTS]["mlm"]) == sum(int(x["target"].ne(pad).sum()) for x in group)
            assert int(s[UPDATE_COUNTS]["dec"]) == sum(int(x["dec_target"].ne(pad).sum()) for x in group)


def test_missing_dictionary_is_a_clear_error(tmp_path):
    proc = run(train_cmd(tmp_path, tmp_path / "ckpt", max_update=1))
    assert proc.returncode != 0
    assert f"{tmp_path}/dict.txt: dictionary not found" in proc.stderr


def test_empty_split_is_a_clear_error(demo_data_bin, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(demo_data_bin / "dict.txt", data / "dict.txt")
    (tmp_path / "empty.txt").write_text("")
    symbols = [line.split()[0] for line in (data / "dict.txt").read_text(encoding="utf-8").splitlines()[10:40]]
    (tmp_path / "train.txt").write_text(" ".join(symbols) + "\n", encoding="utf-8")
    check(
        [
            cli("fairseq-preprocess"),
            "--only-source",
            "--srcdict",
            data / "dict.txt",
            "--trainpref",
            tmp_path / "train.txt",
            "--validpref",
            tmp_path / "empty.txt",
            "--destdir",
            data,
            "--workers",
            "1",
        ]
    )
    proc = run([a for a in train_cmd(data, tmp_path / "ckpt", max_update=1) if a != "--disable-validation"])
    assert proc.returncode != 0
    assert f"{data}/valid: the 'valid' split is empty" in proc.stderr


def test_window_below_one_on_the_command_line(demo_data_bin, tmp_path):
    proc = run(train_cmd(demo_data_bin, tmp_path, "--decoder-attention-window", "0", max_update=1))
    assert proc.returncode != 0
    assert "window must be an integer >= 1 or 'full', got 0" in proc.stderr


def test_iterator_resumes_mid_epoch_at_the_saved_position(loaded):
    """What fairseq records in a checkpoint brings the wrapped iterator back to the same batch."""
    dataset = loaded.dataset("train")

    def fresh():
        return loaded.get_batch_iterator(dataset, max_sentences=4, seed=1, disable_iterator_cache=True)

    first = fresh()
    epoch = first.next_epoch_itr(shuffle=True)
    for _ in range(6):
        next(epoch)
    state = first.state_dict()
    rest = [s["id"].tolist() for s in epoch]

    second = fresh()
    second.load_state_dict(state)
    resumed = second.next_epoch_itr(shuffle=True)
    assert resumed.n == 6 and len(resumed) == len(epoch)
    assert [s["id"].tolist() for s in resumed] == rest
    assert not resumed.has_next() and second.end_of_epoch()
