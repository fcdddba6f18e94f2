"""The fairseq side of the package: the fixes of ``fairseq_patches``, then every task, criterion, model
and optimizer.

Importing this module applies the fairseq fixes and registers the plugin with
fairseq: it imports every module of ``tasks/``, ``models/``, ``criterions/`` and
``optim/`` (as fairseq's own ``import_models`` does for its folders), so a new
objective's files register themselves; no list names them.  ``seed_fairseq/__init__.py``
imports this module as soon as fairseq is imported (``fairseq-train --user-dir``
has imported fairseq before it imports the plugin; otherwise ``_registration``
waits for fairseq's import); library code that does not use fairseq
(``fileio``, ``vocabulary``, ``retrieval``, ``preprocess``, ``compare``) never
reaches it.
"""

import importlib
import pkgutil

from .pretrain import fairseq_patches

fairseq_patches.apply()

from .pretrain import criterions, models, optim, tasks  # noqa: E402

for _package in (tasks, models, criterions, optim):
    for _module in pkgutil.iter_modules(_package.__path__):
        importlib.import_module(f"{_package.__name__}.{_module.name}")
