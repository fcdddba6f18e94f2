"""Training SEED-Encoder through fairseq's real Trainer and CLIs: the gradient of
an --update-freq split, loss going down on real text, tensorboard, safe loading
and bad checkpoints.  What every objective guarantees (split invariance through
the CLI, exact resume, head dropping, export) is in test_contract.py."""

import copy
import json

import pytest
import torch
from conftest import build_task_model
from helpers import SGD_ONE_STEP, check, cli, run, train_cmd


def _log_records(text, kind="train_inner"):
    records = []
    for line in text.splitlines():
        if f"| {kind} |" in line:
            records.append(json.loads(line.split(f"| {kind} | ", 1)[1]))
    return records


LOSS_KEYS = ("loss", "mlm_loss", "dec_loss", "mlm_ntokens", "dec_ntokens", "mlm_acc", "dec_acc")


# ---------------------------------------------------------------------------
# split invariance
# ---------------------------------------------------------------------------


def _trainer(data):
    from fairseq import metrics  # noqa: F401
    from fairseq.trainer import Trainer

    task, model, criterion, cfg = build_task_model(
        data, *SGD_ONE_STEP, "--batch-size", "4", "--update-freq", "2", tokens_per_sample=96
    )
    return task, Trainer(cfg, task, model, criterion)


def _train_step(trainer, samples):
    from fairseq import metrics

    with metrics.aggregate(new_root=True) as agg:
        trainer.train_step(samples)
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return grads, agg.get_smoothed_values()


def test_update_freq_gives_the_gradient_of_the_whole_batch(demo_data_bin):
    task, trainer = _trainer(demo_data_bin)
    task.load_dataset("train")
    dataset = task.dataset("train")
    itr = task.get_batch_iterator(dataset, max_sentences=4, seed=5).next_epoch_itr(shuffle=True)
    micro = [next(itr), next(itr)]
    pad = task.source_dictionary.pad()
    counts = [(int(m["target"].ne(pad).sum()), int(m["dec_target"].ne(pad).sum())) for m in micro]
    # the test means something only if the halves differ in both counts
    assert counts[0][0] != counts[1][0] and counts[0][1] != counts[1][1]
    ids = torch.cat([m["id"] for m in micro]).tolist()
    whole = dataset.collater([dataset[i] for i in ids])

    initial = copy.deepcopy(trainer.model.state_dict())
    g_split, log_split = _train_step(trainer, micro)
    trainer.model.load_state_dict(initial)
    g_whole, log_whole = _train_step(trainer, [whole])

    assert g_split.keys() == g_whole.keys() and len(g_whole) > 10
    for name in g_whole:
        torch.testing.assert_close(g_split[name], g_whole[name], rtol=1e-4, atol=1e-6, msg=name)
    for key in LOSS_KEYS:
        assert log_split[key] == pytest.approx(log_whole[key], rel=1e-6), key


# ---------------------------------------------------------------------------
# end to end on real text
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def straight_run(demo_data_bin, tmp_path_factory):
    """60 uninterrupted updates with --update-freq 2 and a tensorboard log."""
    out = tmp_path_factory.mktemp("straight")
    proc = check(
        train_cmd(
            demo_data_bin,
            out / "ckpt",
            "--update-freq",
            "2",
            "--tensorboard-logdir",
            out / "tb",
            max_update=60,
            tokens_per_sample=96,
            batch_size=4,
        )
    )
    return out, _log_records(proc.stderr + proc.stdout)


def test_both_losses_fall_on_real_text(straight_run):
    out, records = straight_run
    assert [int(r["num_updates"]) for r in records] == list(range(1, 61))
    for key in ("mlm_loss", "dec_loss"):
        first = sum(float(r[key]) for r in records[:5]) / 5
        last = sum(float(r[key]) for r in records[-5:]) / 5
        assert last < first - 1.0, (key, first, last)  # bits per token
    assert (out / "ckpt" / "checkpoint_last.pt").is_file()
    events = list((out / "tb").rglob("events.out.tfevents.*"))
    assert events, "no tensorboard event file"


def test_plain_torch_load_stays_safe(straight_run):
    """Only fairseq's checkpoint code trusts pickles; torch.load keeps its default."""
    out, _ = straight_run
    ckpt = out / "ckpt" / "checkpoint_last.pt"
    import pickle

    from fairseq import checkpoint_utils

    import seed_fairseq  # noqa: F401

    with pytest.raises(pickle.UnpicklingError):
        torch.load(ckpt)
    assert checkpoint_utils.load_checkpoint_to_cpu(str(ckpt))["model"]


def test_dictionary_mismatch_on_resume_is_clear(straight_run, tmp_path):
    out, _ = straight_run
    data = tmp_path / "other"
    data.mkdir()
    with open(data / "dict.txt", "w") as f:
        f.writelines(f"x{i} 1\n" for i in range(50))
    proc = run(
        train_cmd(
            data,
            tmp_path / "ckpt",
            "--restore-file",
            out / "ckpt" / "checkpoint_last.pt",
            "--reset-optimizer",
            "--reset-dataloader",
            max_update=1,
        )
    )
    assert proc.returncode != 0
    assert "dictionary size mismatch" in proc.stderr


# ---------------------------------------------------------------------------
# dropping the decoder
# ---------------------------------------------------------------------------


def test_drop_decoder_rejects_other_checkpoints(straight_run, tmp_path):
    out, _ = straight_run
    check([cli("seed-drop-decoder"), out / "ckpt" / "checkpoint_last.pt", tmp_path / "encoder.pt"])
    # a stock RoBERTa checkpoint has no decoder to drop
    proc = run([cli("seed-drop-decoder"), tmp_path / "encoder.pt", tmp_path / "again.pt"])
    assert proc.returncode == 2
    assert (
        f"{tmp_path}/encoder.pt: expected a checkpoint of one of this plugin's pre-training models, "
        "got model/arch 'roberta'" in proc.stderr
    )
    # not a checkpoint at all
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    proc = run([cli("seed-drop-decoder"), tmp_path / "junk.pt", tmp_path / "again.pt"])
    assert proc.returncode == 2 and "junk.pt: not a readable fairseq checkpoint" in proc.stderr
    assert not (tmp_path / "again.pt").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
