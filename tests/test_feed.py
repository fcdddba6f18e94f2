"""Does one data-loader worker keep up with a GPU (seed_fairseq/workflows/measure/feed.py,
benchmarks/data_pipeline.py)."""

import json
import subprocess
import sys

import pytest
from helpers import REPO
from objectives import BY_NAME, TINY_ENCODER

from seed_fairseq.workflows.measure import feed

TOKENS = 61  # odd block length


def tiny_args(name):
    o = BY_NAME[name]
    return [
        "--cpu",
        "--task",
        o.task,
        "--criterion",
        o.criterion,
        "--arch",
        o.arch,
        *TINY_ENCODER,
        *o.model_args,
        "--tokens-per-sample",
        str(TOKENS),
        "--sample-break-mode",
        "none",
    ]


class Ordered:
    def __len__(self):
        return 5

    def ordered_indices(self):
        return [4, 2, 0, 1, 3]


def test_batches_of_full_batches_in_order_over_epochs():
    assert feed.batches_of(Ordered(), 2, 2) == [(1, [4, 2]), (1, [0, 1]), (2, [4, 2]), (2, [0, 1])]


def test_consumer_rate():
    assert feed.consumer_rate(2e12, peak_flops=1e15, mfu=0.4) == pytest.approx(200.0)
    assert feed.consumer_rate(989.4e9) == pytest.approx(400.0)  # H100 SXM dense BF16 at 40%


def test_producer_rate_counts_the_batches_it_timed(demo_data_bin):
    task, _ = feed.setup_task(demo_data_bin, tiny_args("retromae"))
    blocks = len(task.dataset("train"))
    batches = blocks // 7 + 2  # more than one epoch: new masks
    r = feed.producer_rate(task, batch_size=7, batches=batches)
    assert r["batches"] == batches and r["blocks"] == 7 * batches
    assert TOKENS - 1 < r["tokens_per_block"] <= TOKENS  # full blocks, but the split's last one
    assert r["blocks_per_cpu_s"] == pytest.approx(r["blocks"] / r["cpu_s"])
    with pytest.raises(ValueError, match="fewer than a batch"):
        feed.producer_rate(task, batch_size=blocks + 1)


def test_flops_per_block_counts_full_blocks(demo_data_bin):
    mlm = feed.flops_per_block(demo_data_bin, tiny_args("mlm_only"))
    cpdae = feed.flops_per_block(demo_data_bin, tiny_args("cpdae"))
    assert mlm["tokens_per_block"] == cpdae["tokens_per_block"] == TOKENS
    # CPDAE: two masked views of each text through the encoder, plus its bag-of-words head
    assert 2.0 < cpdae["per_block"] / mlm["per_block"] < 3.0


@pytest.mark.slow
def test_benchmark_runs(tmp_path):
    out = tmp_path / "feed.json"
    cmd = [sys.executable, "benchmarks/data_pipeline.py", "--no-flops", "--batches", "2", "--batch-size", "3"]
    cmd += ["--tokens-per-sample", "64", "--objectives", "masked_lm,retromae", "--json", str(out)]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=300)
    rows = json.loads(out.read_text())["rows"]
    assert [r["objective"] for r in rows] == ["masked_lm", "retromae"]
    assert all(r["blocks"] == 6 and r["tokens_per_block"] <= 64 for r in rows)
