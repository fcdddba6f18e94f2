"""The table of fairseq patches (``seed_fairseq.pretrain.fairseq_patches.PATCHES``) against the installed fairseq.

A fresh interpreter imports the targeted fairseq modules before the plugin, keeps every
attribute of every loaded fairseq module and of the classes defined there, then imports
the plugin (which applies the patches) and compares: each row's target must exist in
fairseq with what its replacement relies on, be the replacement afterwards, and every
attribute that changed must be a row of the table.  A fairseq upgrade that moves a
target, or a patch added without its row, fails here instead of in a training run.
"""

import json
import queue
import subprocess
import sys

import pytest

from seed_fairseq.pretrain.fairseq_patches import PATCHES

PROBE = r"""
import ast, fnmatch, importlib, inspect, json, re, sys, types

import fairseq  # seed_fairseq is not imported yet: nothing is patched

modules = sys.argv[1:]
import_errors = {}
for name in modules:
    try:
        importlib.import_module(name)
    except Exception as e:
        import_errors[name] = repr(e)


def namespaces():
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "fairseq" or name.startswith(("fairseq.", "fairseq_cli"))):
            continue
        if getattr(module, "__name__", name) != name:  # an alias (fairseq.distributed_utils): seen under its name
            continue
        yield name, module
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == name:
                yield f"{name}:{value.__qualname__}", value


def snapshot():
    return {key: dict(vars(obj)) for key, obj in namespaces()}


def changes(old, new):
    found = []
    for key, attributes in new.items():
        if key not in old:  # a module the plugin imported: not there to be patched before
            continue
        module = key.split(":")[0]
        for attr, value in attributes.items():
            if attr in old[key] and old[key][attr] is value:
                continue
            if attr not in old[key] and isinstance(value, types.ModuleType) and value.__name__ == f"{module}.{attr}":
                continue  # a submodule imported since
            found.append(f"{key}.{attr}" if ":" in key else f"{key}:{attr}")
    return sorted(found)


def resolve(snap, module, dotted):
    # dotted name in `module` as the snapshot `snap` saw it (class attributes included)
    first, *rest = dotted.split(".")
    obj = snap[module][first]
    for part in rest:
        key = f"{module}:{obj.__qualname__}" if isinstance(obj, type) else None
        obj = snap[key][part] if key in snap else getattr(obj, part)
    return obj


before = snapshot()
import seed_fairseq  # fairseq is imported: the plugin registers and applies the patches
from seed_fairseq.pretrain import fairseq_patches

fairseq_patches.apply()
after = snapshot()
unlisted = sorted(set(changes(before, after)) - {p.target for p in fairseq_patches.PATCHES})

rows = {}
for patch in fairseq_patches.PATCHES:
    problems = rows.setdefault(patch.target, [])
    if not fnmatch.fnmatch(fairseq.__version__, patch.fairseq):
        problems.append(f"written for fairseq {patch.fairseq}, installed {fairseq.__version__}")
    if patch.module in import_errors:
        problems.append(f"{patch.module} does not import: {import_errors[patch.module]}")
        continue
    try:
        resolve(before, patch.module, patch.attribute)
    except (KeyError, AttributeError):
        problems.append(f"{patch.target} does not exist")
        continue
    for need in patch.relies_on:
        name, _, params = re.fullmatch(r"([\w.]+)(\((.*)\))?", need).groups()[:3]
        try:
            obj = resolve(before, patch.module, name)
        except (KeyError, AttributeError):
            problems.append(f"{patch.module}:{name} does not exist")
            continue
        if params is not None:
            expected = [p.strip() for p in params.split(",") if p.strip()]
            try:
                actual = list(inspect.signature(obj).parameters)[: len(expected)]
            except (TypeError, ValueError):
                actual = None
            if actual != expected:
                problems.append(f"{patch.module}:{name} takes {actual}, the patch relies on {expected}")
    current = resolve(after, patch.module, patch.attribute)
    fix = patch.install.__module__
    if getattr(current, fairseq_patches.MARK, None) != fix:
        problems.append(f"after apply(), {patch.target} is {current!r}, not the replacement of {fix}")
    elif isinstance(current, types.ModuleType):
        # a module stand-in: every call of what it replaces must fit the replacement
        tree = ast.parse(inspect.getsource(sys.modules[patch.module]))
        replaced = set(vars(current)) - {fairseq_patches.MARK, "__name__", "__doc__", "__package__",
                                         "__loader__", "__spec__"}
        for node in ast.walk(tree):
            f = getattr(node, "func", None)
            if (isinstance(f, ast.Attribute) and f.attr in replaced and isinstance(f.value, ast.Name)
                    and f.value.id == patch.attribute):
                try:
                    inspect.signature(getattr(current, f.attr)).bind(
                        *node.args, **{k.arg: k.value for k in node.keywords if k.arg})
                except TypeError as e:
                    problems.append(f"{patch.module} line {node.lineno}: {patch.attribute}.{f.attr}(...): {e}")

fairseq_patches.apply()
second_apply = changes(after, snapshot())
print("PROBE " + json.dumps({"rows": rows, "unlisted": unlisted, "second_apply": second_apply}))
"""


@pytest.fixture(scope="module")
def probe():
    modules = sorted({patch.module for patch in PATCHES})
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")][-1]
    return json.loads(line[len("PROBE ") :])


@pytest.mark.parametrize("patch", PATCHES, ids=lambda patch: patch.target)
def test_each_target_exists_in_the_installed_fairseq_and_is_replaced(probe, patch):
    assert probe["rows"][patch.target] == []


def test_the_table_lists_every_fairseq_attribute_the_plugin_replaces(probe):
    assert probe["unlisted"] == [], "replaced by the plugin but not in fairseq_patches.PATCHES"


def test_apply_is_idempotent(probe):
    assert probe["second_apply"] == []


def test_one_row_per_target_each_with_a_reason():
    assert len({patch.target for patch in PATCHES}) == len(PATCHES)
    assert all(patch.why and patch.fairseq for patch in PATCHES)


def test_the_0_1_module_applies_the_patches():
    import torch
    from fairseq import checkpoint_utils

    from seed_fairseq import compat
    from seed_fairseq.pretrain import fairseq_patches

    assert compat.install is fairseq_patches.apply
    assert checkpoint_utils.torch is not torch  # the first row of PATCHES: fairseq's checkpoint code sees its own


def test_the_stoppable_consumer_passes_every_item_then_the_sentinel():
    """The replacement of ``BackgroundConsumer.run`` reads fairseq's consumer state."""
    import seed_fairseq

    seed_fairseq.register()
    from fairseq.data import iterators

    items = queue.Queue()
    consumer = iterators.BackgroundConsumer(items, iter(range(5)), 3, None)
    consumer.start()
    consumer.join(30)
    assert [items.get_nowait() for _ in range(4)] == [0, 1, 2, iterators._sentinel]
