"""seed_fairseq: SEED-Encoder pre-training as a fairseq ``--user-dir`` plugin.

Importing the package registers the ``seed_pretrain`` task and criterion and
the ``seed_encoder`` model with its architectures, and applies the two fairseq
compatibility fixes in ``compat`` (trusted loading of fairseq's own
checkpoints under torch >= 2.6, torchrun on CPU).
"""

__version__ = "0.1.0"

from . import (  # noqa: F401
    compat,  # noqa: F401
    criterions,
    models,
    tasks,
)
