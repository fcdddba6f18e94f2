"""The folders are the layers (CONTRIBUTING.md, "The house").

A module's path names its floor; no table lists modules.  From the bottom:

    0  seed_fairseq/base/                       no fairseq, nothing else of the project
    1  seed_fairseq/pretrain/   preprocess/     side by side
    2  seed_fairseq/*.py                        the face: registration, the 0.1 module compat
    3  seed_fairseq/encoders/
    4  seed_fairseq/workflows/kit/   .../measure/        side by side: what the workflows share
    5  every other folder of seed_fairseq/workflows/     side by side: compare, adapt, gpucheck, ...

An import may point into its own room, or into a room of a lower floor: never up, and never
into another room of its own floor (so no workflow imports another).  A room is a folder of a
floor (``pretrain``, ``workflows/compare``), or the face.  The graph is read with ``ast``
from the source (every ``import``, function-local ones included); cycles between modules are
refused outright, even inside one room.
"""

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("seed_fairseq", "preprocess")
FACE = "seed_fairseq"
# the folders of seed_fairseq/, low to high; the face (the package's own files) stands between
# pretrain and encoders; in workflows/, SHARED rooms are a floor below the workflows themselves
FLOORS = ("base", "pretrain", FACE, "encoders", "workflows")
SHARED = ("kit", "measure")
# 0.1's documented module paths that run code living higher up today (module -> what it may import)
COMPAT_0_1 = {"seed_fairseq.drop_decoder": "seed_fairseq.encoders.drop_heads"}
# Libraries that must import without fairseq and without any fairseq patch.
FAIRSEQ_FREE = (
    "seed_fairseq.base",
    "seed_fairseq.encoders.retrieval",
    "seed_fairseq.encoders.dupmae",
    "seed_fairseq.workflows",
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
    return {name: imports(name, path, known) for name, path in known.items()}


def room(name: str) -> Tuple[int, str]:
    """(floor, room) of a module, from its path alone."""
    parts = name.split(".")
    if parts[0] == "preprocess":
        return FLOORS.index("pretrain"), "preprocess"
    is_folder = len(parts) > 2 or (ROOT / Path(*parts)).is_dir()
    if parts[0] != FACE or len(parts) == 1 or not is_folder:
        return FLOORS.index(FACE), FACE
    top = parts[1]
    if top not in FLOORS:
        raise AssertionError(f"{name}: seed_fairseq/{top}/ is no floor of the house ({', '.join(FLOORS)})")
    if top != "workflows":
        return FLOORS.index(top), top
    sub = parts[2] if len(parts) > 2 and (ROOT / FACE / top / parts[2]).is_dir() else ""
    floor = FLOORS.index(top) + (0 if sub in SHARED or not sub else 1)
    return floor, f"{top}.{sub}" if sub else top


def violations(edges: Dict[str, Set[str]]) -> List[str]:
    """The arrows that point up a floor, or across to another room of the same floor."""
    bad = []
    for source, targets in sorted(edges.items()):
        (floor, here) = room(source)
        for target in sorted(targets):
            if COMPAT_0_1.get(source) == target:
                continue
            (to_floor, there) = room(target)
            if to_floor > floor:
                bad.append(f"{source} -> {target} (up: {here} -> {there})")
            elif to_floor == floor and there != here:
                bad.append(f"{source} -> {target} (across: {here} -> {there})")
    return bad


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


def test_every_folder_is_a_floor():
    folders = {p.name for p in (ROOT / FACE).iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(FLOORS) - {FACE}
    for name in graph():
        room(name)


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_imports_point_down_or_within_their_room():
    assert violations(graph()) == []


def test_the_checks_catch_a_cycle_an_upward_and_a_sideways_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    edges = {
        "seed_fairseq.base.fileio.atomic": {"seed_fairseq.pretrain.checkpoint"},  # up
        "preprocess.build": {"seed_fairseq.pretrain.tasks.registry", "seed_fairseq.base.errors"},  # across, down
        "seed_fairseq.plugin": {"seed_fairseq.pretrain.tasks"},  # down
        "seed_fairseq.pretrain.models.retromae": {"seed_fairseq.encoders.dupmae.head"},  # up
        "seed_fairseq.workflows.adapt.cli": {"seed_fairseq.workflows.compare.cli", "seed_fairseq.workflows.kit.corpus"},
        "seed_fairseq.workflows.kit.tools": {"seed_fairseq.workflows.measure.flops"},  # across
        "seed_fairseq.encoders.hf.export": {"seed_fairseq", "seed_fairseq.encoders.retrieval.search"},  # down, within
    }
    assert [v.split(" (")[1] for v in violations(edges)] == [
        "across: preprocess -> pretrain)",
        "up: base -> pretrain)",
        "up: pretrain -> encoders)",
        "across: workflows.adapt -> workflows.compare)",
        "across: workflows.kit -> workflows.measure)",
    ]
    assert room("seed_fairseq") == room("seed_fairseq.compat") == (2, FACE)
    assert room("seed_fairseq.workflows.gpucheck.cli") == (5, "workflows.gpucheck")
    with pytest.raises(AssertionError, match="no floor"):
        room("seed_fairseq.attic.old")


def fresh_python(code: str) -> str:
    """stdout of ``code`` in a fresh interpreter (nothing imported yet); its stderr tail on failure."""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def library_modules() -> List[str]:
    return sorted(name for name in modules() if any(name == lib or name.startswith(lib + ".") for lib in FAIRSEQ_FREE))


@pytest.mark.parametrize("chunk", [0, 1])
def test_libraries_import_without_fairseq(chunk):
    """Code that does not use fairseq does not pay for it: importing any module
    of the libraries imports neither fairseq nor the plugin's patches."""
    assert {"seed_fairseq.base", "seed_fairseq.encoders.retrieval", "preprocess"} <= set(library_modules())
    names = library_modules()[chunk::2]
    code = (
        "import importlib, sys\n"
        f"names = {names!r}\n"
        "bad = []\n"
        "for n in names:\n"
        "    importlib.import_module(n)\n"
        "    hit = [m for m in ('fairseq', 'seed_fairseq.plugin', 'seed_fairseq.pretrain.fairseq_patches') "
        "if m in sys.modules]\n"
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
    "first",
    [
        "seed_fairseq.pretrain.models.seed_encoder",
        "seed_fairseq.pretrain.modules.windowed_decoder",
        "seed_fairseq.compat",
    ],
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


MAX_LINES = 450  # issue 34 item 6: a file that grows past this is split by job (pure moves, same folder)


def test_no_library_file_exceeds_the_line_limit():
    """A library module holds one job: none of ``seed_fairseq/`` or ``preprocess/`` is over 450 lines."""
    long = {
        str(path.relative_to(ROOT)): n
        for path in modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
