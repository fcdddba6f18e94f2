"""The fairseq side of the package: patches, then every task, criterion and model.

Importing this module registers the plugin with fairseq (``seed_pretrain`` /
``seed_encoder`` and the other objectives built on the same framework) and
applies the fairseq fixes of ``compat``.  ``seed_fairseq/__init__.py`` imports
it as soon as fairseq is imported (``fairseq-train --user-dir`` has imported
fairseq before it imports the plugin); library code that does not use fairseq
(``fileio``, ``vocabulary``, ``retrieval``, ``preprocess``, ``compare``) never
reaches it.
"""

import logging

_root = logging.getLogger()
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
