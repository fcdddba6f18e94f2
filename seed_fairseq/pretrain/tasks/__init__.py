from .cpdae_pretrain import CpdaePretrainTask  # noqa: F401
from .retromae_pretrain import DupMAEPretrainTask, RetroMAEPretrainTask  # noqa: F401
from .seed_pretrain import SeedPretrainTask  # noqa: F401
from .simlm_pretrain import SimLMPretrainTask  # noqa: F401
