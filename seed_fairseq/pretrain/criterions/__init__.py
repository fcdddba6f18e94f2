# The names of 0.2; registration does not depend on this list (plugin.py imports every module here).
from .cpdae_pretrain import CpdaePretrainCriterion  # noqa: F401
from .retromae_pretrain import DupMAECriterion, RetroMAECriterion  # noqa: F401
from .seed_pretrain import SeedPretrainCriterion  # noqa: F401
from .simlm_pretrain import SimLMPretrainCriterion  # noqa: F401
