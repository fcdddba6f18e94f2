"""seed_fairseq: bottleneck pre-training of dense-retrieval encoders as a fairseq ``--user-dir`` plugin.

The package registers its tasks, criterions and models with fairseq and applies
the fairseq fixes of ``fairseq_patches`` (``plugin.py``) as soon as fairseq is imported,
and never before: ``fairseq-train --user-dir seed_fairseq`` imports fairseq
first, so the plugin registers at once; a program that imports ``seed_fairseq``
(or any of its modules) first gets the registration when it, or anything it
calls, imports fairseq.  Library code that does not use fairseq (``fileio``,
``vocabulary``, ``retrieval``, ``preprocess``, ``compare``) therefore imports
neither fairseq nor a patch.  :func:`register` registers explicitly.
"""

import sys

__version__ = "0.2.0"


def register() -> None:
    """Import fairseq, apply the fixes and register the plugin (idempotent)."""
    from . import plugin  # noqa: F401


if "fairseq" in sys.modules:
    register()
else:
    from .base._registration import install

    install(register)
