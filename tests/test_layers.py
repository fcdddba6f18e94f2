"""The package's import graph points one way (CONTRIBUTING.md, "Layers").

The graph is read with ``ast`` from the source (every ``import`` statement,
function-local ones included: a function-local import of a higher layer is
still an upward dependency).  Modules are grouped into units; each unit has a
rank, and an import may only point to a unit of the same or a lower rank.
Cycles between modules are refused outright, even inside one unit.
"""

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("seed_fairseq", "preprocess")

# Low to high.  A module belongs to the unit of its longest matching prefix.
LAYERS: List[List[str]] = [
    # nothing of the plugin, nothing of fairseq at import time
    [
        "seed_fairseq.base.errors",
        "seed_fairseq.base.fileio",
        "seed_fairseq.base.vocabulary",
        "seed_fairseq.base.retrieval_data",
        "seed_fairseq.base.objectives",
        "seed_fairseq.base.extensions",
        "seed_fairseq.base._registration",
    ],
    ["seed_fairseq.pretrain.checkpoint", "seed_fairseq.pretrain.savedir"],
    # the fairseq side, bottom up
    ["seed_fairseq.pretrain.fairseq_patches", "seed_fairseq.compat"],
    [
        "seed_fairseq.pretrain.data",
        "seed_fairseq.pretrain.modules",
        "seed_fairseq.pretrain.diagnostics",
        "seed_fairseq.pretrain.retrieval_dev",
        "seed_fairseq.pretrain.modules.vocab_pool",
    ],
    ["seed_fairseq.pretrain.generator"],
    ["seed_fairseq.pretrain.models"],
    ["seed_fairseq.pretrain.tasks"],
    ["seed_fairseq.pretrain.criterions"],
    ["seed_fairseq", "seed_fairseq.plugin"],
    ["seed_fairseq.drop_heads", "seed_fairseq.encoders.drop_decoder"],
    # the wings, each on what it needs below
    ["preprocess"],
    ["seed_fairseq.hf"],
    ["seed_fairseq.encoders.retrieval"],
    ["seed_fairseq.dupmae"],
    ["seed_fairseq.compare"],
    ["seed_fairseq.adapt"],  # the whole flow: over compare, retrieval and hf
    ["seed_fairseq.gpucheck"],  # one-command GPU verification: over preprocess, hf, retrieval and compare
]
# Import paths kept for old code: modules that only re-export a moved module.
ALIASES = {
    "seed_fairseq.base.vocabulary.tokenizer",
    "seed_fairseq.base.vocabulary.dictionary",
    "seed_fairseq.compat",
    "seed_fairseq.encoders.dupmae.head",
    "seed_fairseq.encoders.dupmae.export",
    "seed_fairseq.encoders.dupmae.retriever",
    "seed_fairseq.pretrain.modules.vocab_pool",
    "seed_fairseq.base.retrieval_data",
}
# Libraries that must import without fairseq and without any fairseq patch.
FAIRSEQ_FREE = (
    "seed_fairseq.base.fileio",
    "seed_fairseq.base.errors",
    "seed_fairseq.base.vocabulary",
    "seed_fairseq.base.retrieval_data",
    "seed_fairseq.encoders.retrieval",
    "seed_fairseq.base.objectives",
    "seed_fairseq.base.extensions",
    "seed_fairseq.compare",
    "seed_fairseq.adapt",
    "seed_fairseq.dupmae",
    "seed_fairseq.gpucheck",
    "preprocess",
)


def modules() -> Dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, known: Dict[str, Path]) -> Set[str]:
    """The project's modules ``name`` imports (``from X import y`` counts as
    ``X.y`` when that is a module, else ``X``)."""
    out = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module
            targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> Dict[str, Set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items() if name not in ALIASES}


def rank(name: str) -> int:
    best, best_len = None, -1
    for i, units in enumerate(LAYERS):
        for unit in units:
            if (name == unit or name.startswith(unit + ".")) and len(unit) > best_len:
                best, best_len = i, len(unit)
    if best is None:
        raise AssertionError(f"{name} belongs to no layer: add it to LAYERS and to CONTRIBUTING.md")
    return best


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer():
    for name in graph():
        rank(name)


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_no_import_points_upward():
    upward = [
        f"{source} -> {target}"
        for source, targets in graph().items()
        for target in targets
        if target not in ALIASES and rank(target) > rank(source)
    ]
    assert upward == []


def test_the_checks_catch_a_cycle_and_an_upward_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert rank("seed_fairseq.base.fileio") < rank("seed_fairseq.pretrain.models.bottleneck") < rank("seed_fairseq.workflows.compare.cli")


def fresh_python(code: str) -> str:
    """stdout of ``code`` in a fresh interpreter (nothing imported yet); its stderr tail on failure."""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def library_modules() -> List[str]:
    return sorted(
        name
        for name in modules()
        if name not in ALIASES and any(name == lib or name.startswith(lib + ".") for lib in FAIRSEQ_FREE)
    )


@pytest.mark.parametrize("chunk", [0, 1])
def test_libraries_import_without_fairseq(chunk):
    """Code that does not use fairseq does not pay for it: importing any module
    of the libraries imports neither fairseq nor the plugin's patches."""
    names = library_modules()[chunk::2]
    code = (
        "import importlib, sys\n"
        f"names = {names!r}\n"
        "bad = []\n"
        "for n in names:\n"
        "    importlib.import_module(n)\n"
        "    hit = [m for m in ('fairseq', 'seed_fairseq.plugin', 'seed_fairseq.compat') if m in sys.modules]\n"
        "    if hit:\n"
        "        bad.append((n, hit)); break\n"
        "print(bad)\n"
    )
    assert fresh_python(code) == "[]"


def test_fairseq_after_the_package_registers_the_plugin():
    """``import seed_fairseq`` first, fairseq later (a user's script): the plugin
    registers when fairseq is imported; and the root logger stays as it was."""
    code = (
        "import logging, seed_fairseq, sys\n"
        "assert 'fairseq' not in sys.modules\n"
        "from fairseq.tasks import TASK_REGISTRY\n"
        "from fairseq.criterions import CRITERION_REGISTRY\n"
        "from fairseq.models import ARCH_MODEL_REGISTRY\n"
        "assert 'seed_pretrain' in TASK_REGISTRY and 'cpdae_pretrain' in CRITERION_REGISTRY\n"
        "assert 'seed_encoder_base' in ARCH_MODEL_REGISTRY\n"
        "assert not logging.getLogger().handlers\n"
        "print('ok')\n"
    )
    assert fresh_python(code) == "ok"


@pytest.mark.parametrize(
    "first", ["seed_fairseq.pretrain.models.seed_encoder", "seed_fairseq.pretrain.modules.windowed_decoder", "seed_fairseq.compat"]
)
def test_importing_one_plugin_module_first_registers_everything(first):
    """fairseq imported from inside a plugin module's own import: registration
    waits for that import to finish instead of re-entering it half-done."""
    code = (
        f"import {first}\n"
        "from fairseq.tasks import TASK_REGISTRY\n"
        "from fairseq.criterions import CRITERION_REGISTRY\n"
        "assert 'simlm_pretrain' in TASK_REGISTRY and 'seed_pretrain' in CRITERION_REGISTRY\n"
        "print('ok')\n"
    )
    assert fresh_python(code) == "ok"


def test_no_sys_path_edits():
    """The package is installed: no program or test puts the repository on ``sys.path`` itself."""
    hits = []
    for folder in ("seed_fairseq", "preprocess", "examples", "benchmarks", "scripts", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr == "path"
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "sys"
                ):
                    hits.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert hits == []
