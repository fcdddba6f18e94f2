import os
import signal
import sys
import warnings
from pathlib import Path

import pytest
from helpers import (
    DEMO_CORPUS,
    GENERATOR,
    REPO,
    TINY_MODEL_ARGS,
    build_data_bin,
    check,
    fairseq_train,
    parse_argv,
    tiny_run,
    train_args,
)

os.environ.setdefault("OMP_NUM_THREADS", "1")

# The signals the interrupt tests send; a test worker (pytest-xdist runs several tests one after
# another in one process) must start every test with them as a fresh Python has them.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_FRESH = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL, signal.SIGHUP: signal.SIG_DFL}


@pytest.fixture(autouse=True)
def _stop_signals_as_fresh(request):
    """Each test starts with SIGINT/SIGTERM/SIGHUP as a fresh interpreter has them; a test that
    leaves one changed is named in a warning (a leak to find, not to hide), and the next test
    still starts clean."""
    for signum, handler in _FRESH.items():
        if signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)
    yield
    changed = [signal.Signals(s).name for s in _STOP_SIGNALS if signal.getsignal(s) is not _FRESH[s]]
    if changed:
        warnings.warn(f"{request.node.nodeid} left {', '.join(changed)} changed", stacklevel=1)

# 4 specials + 94 symbols + <mask> = 99 entries: an odd vocabulary size on purpose
N_SYMBOLS = 94


@pytest.fixture(scope="session")
def odd_dict_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("odd_dict")
    with open(d / "dict.txt", "w", encoding="utf-8") as f:
        for i in range(N_SYMBOLS):
            f.write(f"{chr(0x2581) if i % 3 == 0 else ''}w{i} {1000 - i}\n")
    return d


@pytest.fixture(scope="session")
def demo_data_bin(tmp_path_factory):
    """The embedded demo corpus through the project's own preprocessing."""
    return build_data_bin(DEMO_CORPUS, tmp_path_factory.mktemp("demo_bin"), vocab_size=500)


@pytest.fixture(scope="session")
def contract_data(tmp_path_factory):
    """The demo corpus through the project's own preprocessing (odd vocabulary size)."""
    out = tmp_path_factory.mktemp("contract") / "data-bin"
    check(
        [
            sys.executable,
            "-m",
            "preprocess.build",
            "--text",
            REPO / "examples" / "data" / "demo_corpus.txt",
            "--out",
            out,
            "--vocab-size",
            "397",
            "--workers",
            "1",
            "--valid-docs",
            "4",
            "--test-docs",
            "2",
        ],
        cwd=REPO,
    )
    return out


# SimLM's generator for the tests: a masked LM unlike the SimLM encoder (1 layer,
# hidden 16, FFN 23), made the way docs/objectives/simlm.md documents, through the real CLI
SIMLM_GENERATOR_SIZES = [
    "--encoder-layers", "1", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "23",
    "--encoder-attention-heads", "2",
]  # fmt: skip


def train_simlm_generator(data, save_dir, *extra, max_update=3):
    """A tiny generator: the kit's GENERATOR (seed_encoder_mlm_only) on ``data`` for a few updates; its checkpoint."""
    optim = ["--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "fixed"]
    run = tiny_run(max_update, tokens_per_sample=48, batch_size=4, seed=5)
    check(fairseq_train(data, *train_args(GENERATOR, model=SIMLM_GENERATOR_SIZES, own=()), "--sample-break-mode",
                        "none", *optim, *run, *extra, save_dir=save_dir))  # fmt: skip
    return Path(save_dir) / "checkpoint_last.pt"


@pytest.fixture(scope="session")
def simlm_generator(contract_data, tmp_path_factory):
    """SimLM's frozen generator, trained on ``contract_data`` (``Objective.needs`` of ``simlm``)."""
    return train_simlm_generator(contract_data, tmp_path_factory.mktemp("simlm_generator"))


def build_task_model(data_dir, *extra, arch_args=TINY_MODEL_ARGS, tokens_per_sample=32):
    """Task, model and criterion through fairseq's own argument parsing."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        parse_argv(
            data_dir,
            ["--task", "seed_pretrain", "--criterion", "seed_pretrain", *arch_args,
             "--tokens-per-sample", str(tokens_per_sample), "--cpu", *extra],
        ),
    )  # fmt: skip
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return task, model, criterion, cfg
