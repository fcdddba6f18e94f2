"""seed_fairseq: bottleneck pre-training of dense-retrieval encoders as a fairseq ``--user-dir`` plugin.

The package registers its tasks, criterions and models with fairseq and applies
the fairseq fixes of ``compat`` (``plugin.py``) as soon as fairseq is imported,
and never before: ``fairseq-train --user-dir seed_fairseq`` imports fairseq
first, so the plugin registers at once; a program that imports ``seed_fairseq``
(or any of its modules) first gets the registration when it, or anything it
calls, imports fairseq.  Library code that does not use fairseq (``fileio``,
``vocabulary``, ``retrieval``, ``preprocess``, ``compare``) therefore imports
neither fairseq nor a patch.  :func:`register` registers explicitly.
"""

import importlib.util
import logging
import sys

__version__ = "0.2.0"


def register() -> None:
    """Import fairseq, apply the fixes and register the plugin (idempotent)."""
    from . import plugin  # noqa: F401


class _RegisterAfterFairseq:
    """A meta-path finder that only watches for ``fairseq``: it lets the
    normal finders find the package and runs :func:`register` right after
    fairseq's ``__init__`` has executed.  The standard post-import-hook
    pattern (``wrapt.register_post_import_hook``), written out here because it
    is the only use and a dependency for 25 lines is not worth it."""

    def find_spec(self, name, path=None, target=None):
        if name != "fairseq":
            return None
        sys.meta_path.remove(self)  # one shot, and the normal finders below
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            root = logging.getLogger()
            configured_before, level_before = bool(root.handlers), root.level
            exec_module(module)
            if not configured_before and root.handlers:  # see plugin.py
                for handler in list(root.handlers):
                    root.removeHandler(handler)
                root.setLevel(level_before)
            register()

        spec.loader.exec_module = exec_then_register
        return spec


if "fairseq" in sys.modules:
    register()
elif not any(isinstance(f, _RegisterAfterFairseq) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterFairseq())
