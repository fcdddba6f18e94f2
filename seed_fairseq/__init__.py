"""seed_fairseq: bottleneck pre-training of dense-retrieval encoders as a fairseq ``--user-dir`` plugin.

Importing the package registers the plugin's tasks, criterions and models
(SEED-Encoder's ``seed_pretrain`` / ``seed_encoder`` and the other objectives
built on the same framework) and applies the fairseq compatibility fixes in
``compat`` (trusted loading of fairseq's own checkpoints under torch >= 2.6,
torchrun on CPU, atomic checkpoints and safe restarts, a clean exit).
Library code without fairseq registration needs: ``fileio``, ``retrieval``.
"""

import logging as _logging

__version__ = "0.2.0"

_root = _logging.getLogger()
_configured_before = bool(_root.handlers)
_level_before = _root.level

from . import (  # noqa: E402, F401
    compat,
    criterions,
    models,
    tasks,
)

if not _configured_before and _root.handlers:
    # Importing fairseq configures the root logger as a side effect
    # (models/wav2vec/wav2vec2_classification.py: basicConfig(level=DEBUG)):
    # every library's debug output would then reach stderr of any program that
    # imports the plugin.  Undo it; fairseq-train configures logging before it
    # imports the plugin, and tools of this project configure their own.
    for _handler in list(_root.handlers):
        _root.removeHandler(_handler)
    _root.setLevel(_level_before)
