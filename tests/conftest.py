import os

import pytest
from helpers import DEMO_CORPUS, TINY_MODEL_ARGS, USER_DIR, build_data_bin

os.environ.setdefault("OMP_NUM_THREADS", "1")

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


def build_task_model(data_dir, *extra, arch_args=TINY_MODEL_ARGS, tokens_per_sample=32):
    """Task, model and criterion through fairseq's own argument parsing."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            str(data_dir),
            "--user-dir",
            USER_DIR,
            "--task",
            "seed_pretrain",
            "--criterion",
            "seed_pretrain",
            *arch_args,
            "--tokens-per-sample",
            str(tokens_per_sample),
            "--cpu",
            *extra,
        ],
    )
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return task, model, criterion, cfg
