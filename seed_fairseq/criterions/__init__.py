# fairseq does not auto-import criterions from a --user-dir: import explicitly.
from .. import plugin  # noqa: F401  (registration first: see seed_fairseq/__init__.py)

# isort: split
from .cpdae_pretrain import CpdaePretrainCriterion  # noqa: F401
from .retromae_pretrain import DupMAECriterion, RetroMAECriterion  # noqa: F401
from .seed_pretrain import SeedPretrainCriterion  # noqa: F401
from .simlm_pretrain import SimLMPretrainCriterion  # noqa: F401
