from .seed_pretrain import SeedPretrainTask  # noqa: F401
