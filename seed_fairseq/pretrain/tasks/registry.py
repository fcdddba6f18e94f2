"""Every registered pre-training objective, read off fairseq's task registry.

A task class of the plugin (or of any ``--user-dir`` that builds on it) declares
its objectives with ``objectives = (ObjectiveDescription(...), ...)`` in its own
class body (``seed_fairseq/base/objectives.py``); registering the task with
``@register_task`` is then all it takes for the model card, the comparison and the
contract tests to know it.  A subclass that declares none has none (it does not
inherit its parent's: ``dupmae_pretrain`` declares its own).
"""

import dataclasses
from typing import List, Optional

from ...base.objectives import ObjectiveDescription, variant_for
from .bottleneck_pretrain import BottleneckPretrainTask


def _declared(task_name: str, cls) -> tuple:
    if not (isinstance(cls, type) and issubclass(cls, BottleneckPretrainTask)):
        return ()
    return tuple(dataclasses.replace(d, task=task_name) for d in vars(cls).get("objectives", ()))


def registered_objectives() -> List[ObjectiveDescription]:
    """All objectives of the registered tasks (the ``task`` field filled in), in table order."""
    from fairseq.tasks import TASK_REGISTRY

    found = [d for name, cls in TASK_REGISTRY.items() for d in _declared(name, cls)]
    names = [d.name for d in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"objective names declared twice: {', '.join(duplicates)}")
    return sorted(found, key=lambda d: (d.order, d.name))


def is_plugins_own(d: ObjectiveDescription) -> bool:
    """Is ``d`` declared by a task of the plugin itself (not of a test's, or another ``--user-dir``'s that
    this process imported)?"""
    from fairseq.tasks import TASK_REGISTRY

    return getattr(TASK_REGISTRY.get(d.task), "__module__", "").startswith("seed_fairseq.")


def plugin_objectives() -> List[ObjectiveDescription]:
    """The plugin's own objectives (:func:`is_plugins_own`), in table order: what its tables, docs and
    default sets name."""
    return [d for d in registered_objectives() if is_plugins_own(d)]


def runnable_objectives() -> List[ObjectiveDescription]:
    """The objectives ``fairseq-train`` can load, in table order: those with an architecture that are the
    plugin's own (``--user-dir seed_fairseq``) or name the ``--user-dir`` that registers them
    (``ObjectiveDescription.user_dir``); another ``--user-dir``'s that this process imported without it
    naming itself is left out (fairseq-train would not find it)."""
    return [d for d in registered_objectives() if d.arch and (d.user_dir or is_plugins_own(d))]


def objective_for(task: str, model_cfg: dict) -> Optional[ObjectiveDescription]:
    """The objective a checkpoint was trained with, from its task name and model config
    (``cfg["task"]["_name"]``, ``cfg["model"]``); None for a task that declares none."""
    from fairseq.tasks import TASK_REGISTRY

    return variant_for(_declared(task, TASK_REGISTRY.get(task)), model_cfg or {})
