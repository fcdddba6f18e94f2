from .retromae_pretrain import DupMAEPretrainTask, RetroMAEPretrainTask  # noqa: F401
from .seed_pretrain import SeedPretrainTask  # noqa: F401
