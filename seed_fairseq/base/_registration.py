"""When the plugin registers with fairseq: right after fairseq is imported, and
never in the middle of importing one of the plugin's own modules.

``seed_fairseq/__init__.py`` installs :class:`RegisterAfterFairseq` when fairseq
is not imported yet.  It wraps the loaders of ``fairseq`` and of every
``seed_fairseq.*`` module: when the import of fairseq finishes, the plugin
registers (``seed_fairseq.plugin``) unless a plugin module is still being
imported (its ``import fairseq...`` line is what imported fairseq: registering
then would import that half-executed module's own dependants); in that case it
registers as soon as the outermost plugin module has finished.  The standard
post-import-hook pattern (``wrapt.register_post_import_hook``), extended by the
"not inside our own import" rule, which wrapt does not have; written out here
because it is the only use.
"""

import importlib.abc
import logging
import sys
import threading
from typing import Callable

_state = threading.local()


def _depth() -> int:
    return getattr(_state, "depth", 0)


class RegisterAfterFairseq(importlib.abc.MetaPathFinder):
    def __init__(self, register: Callable[[], None]):
        self._register = register
        self._pending = False

    def _real_spec(self, name, path, target):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                return spec
        return None

    def find_spec(self, name, path=None, target=None):
        ours = name.startswith("seed_fairseq.")
        if name != "fairseq" and not ours:
            return None
        spec = self._real_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        if ours:

            def exec_ours(module):
                _state.depth = _depth() + 1
                try:
                    exec_module(module)
                finally:
                    _state.depth = _depth() - 1
                self._maybe_register()

            spec.loader.exec_module = exec_ours
        else:

            def exec_fairseq(module):
                root = logging.getLogger()
                configured_before, level_before = bool(root.handlers), root.level
                exec_module(module)
                if not configured_before and root.handlers:
                    # Importing fairseq configures the root logger as a side effect
                    # (models/wav2vec/wav2vec2_classification.py: basicConfig(level=DEBUG)):
                    # every library's debug output would then reach stderr of any
                    # program that imports the plugin.  Undo it; fairseq-train
                    # configures logging itself.
                    for handler in list(root.handlers):
                        root.removeHandler(handler)
                    root.setLevel(level_before)
                self._pending = True
                self._maybe_register()

            spec.loader.exec_module = exec_fairseq
        return spec

    def _maybe_register(self) -> None:
        if self._pending and _depth() == 0 and "fairseq" in sys.modules:
            self._pending = False
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
            self._register()


def install(register: Callable[[], None]) -> None:
    if not any(isinstance(f, RegisterAfterFairseq) for f in sys.meta_path):
        sys.meta_path.insert(0, RegisterAfterFairseq(register))
