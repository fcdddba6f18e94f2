"""A resumable pipeline of stages, each redone only when what it reads changed.

Every stage has a *fingerprint*: the sha256 of the options it reads and of the
fingerprints of the stages (or inputs) whose outputs it reads. A finished
stage leaves ``WORK/<stage>.done`` = ``{"fingerprint": ..., "result": ...}``;
a rerun reuses a stage exactly when that fingerprint is still the one the
current inputs and options give, and redoes it otherwise. Because a stage's
fingerprint contains those of the stages it reads, redoing a stage changes the
fingerprints downstream of it, and only those: changing ``--max-line-pieces``
redoes encode and what follows, never the extraction.

Files of an unfinished stage stay in its own folder ``WORK/<folder>``, whose
owner is written in ``WORK/<stage>.started``: a stage interrupted half-way
resumes with the files it already finished (e.g. encode, split by split) when
it is restarted with the same fingerprint, and starts afresh otherwise. A
stage folder inside the tool's own work folder (preprocess's ``.work``) is then
emptied; one the user can see (the comparison's ``OUT/pretrain/O/sS``) loses
exactly the files the stage declares it writes (``Stage.writes``), never a
user's notes or subfolder, and never anything through a symbolic link.
Stages must be deterministic (same fingerprint, same files), which is what
makes reusing a downstream stage after its upstream was redone with the same
fingerprint correct.

A finished stage is reused only while its products are there: a stage folder
the user can see records in its marker the files the stage left there (those
``Stage.writes`` matches; every file for ``writes=()``), and ``Stage.products``
names files it writes elsewhere.  One of them gone (``rm -rf OUT/model``), the
stage is redone with the same fingerprint, so what reads it is not.

The tools that list their stages from a *plan* (the comparison, adapt, the
adaptation study) build them with :class:`PlanReads`: a stage declares the plan
fields its body reads, those fields are its options (its fingerprint), and while
the body runs it sees the plan through a :class:`PlanView` that raises
:class:`UndeclaredInput` on any other field.  A field that changes a product
cannot be left out of the fingerprint of a stage that reads it: the first run
that reads it fails.
"""

import contextlib
import dataclasses
import fnmatch
import hashlib
import inspect
import json
import logging
import shutil
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from seed_fairseq.base.fileio import OutputError, delete_listed, write_json_atomic

logger = logging.getLogger("preprocess")


def fingerprint(obj: Any) -> str:
    """sha256 of the canonical JSON of ``obj`` (sorted keys, no spaces)."""
    data = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Stage:
    """One step of the pipeline.

    ``run(results)`` gets the results of the stages before it (by name) and
    returns its own, a JSON value kept in its marker. ``options`` are the
    options it reads, ``reads`` the stages (or external names such as
    ``"inputs"``) whose outputs it reads; both make its fingerprint. Bump
    ``version`` when the stage's code starts writing something else, so no
    folder made by the old code is reused. ``marker=False``: completion is
    recorded by the stage itself (the final record).

    ``folder`` (under the work dir) is where the stage writes. When the stage
    runs with a new fingerprint, ``writes=None`` empties it: the folder is the
    stage's alone, inside the tool's own work folder. Otherwise ``writes`` are
    the glob patterns (relative to the folder, ``*`` within one name) of the
    files the stage and the tools it runs write there, and exactly the matching
    files are deleted; everything else (a user's notes, a save-dir) stays. A
    tool that keeps its own record in the folder (an export) replaces its own
    files: its stage declares ``writes=()``.

    ``products``: files (relative to the work dir) the stage writes outside its
    folder (a report); the stage is redone when one is missing.
    """

    name: str
    run: Callable[[Dict[str, Any]], Any]
    options: Mapping[str, Any] = field(default_factory=dict)
    reads: Sequence[str] = ()
    folder: Optional[str] = None
    marker: bool = True
    version: int = 1
    writes: Optional[Sequence[str]] = None
    products: Sequence[str] = ()


def _read_json(path: Path) -> Optional[Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _remove_debris(stage: Stage, folder: Path) -> None:
    """Delete the temporaries interrupted atomic writes of ``stage`` left in ``folder``
    (fileio names them ``.NAME.tmp-*``): only those of a NAME the stage writes."""
    for debris in folder.glob(".*.tmp-*"):
        name = debris.name[1 : debris.name.index(".tmp-")]
        ours = stage.writes is None or any(fnmatch.fnmatchcase(name, pattern) for pattern in stage.writes)
        if ours and debris.is_file() and not debris.is_symlink():
            debris.unlink()


class Runner:
    """Runs ``stages`` in order in ``work``, reusing the ones whose fingerprint is unchanged.

    ``external`` maps the names of things that are not stages (``"inputs"``)
    to their fingerprints.  ``state_dir`` is where the ``.done``/``.started``
    records go (default: ``work`` itself).
    """

    def __init__(
        self, work: Path, stages: Sequence[Stage], external: Mapping[str, str], state_dir: Optional[Path] = None
    ):
        self.work = Path(work)
        self.state_dir = Path(state_dir) if state_dir is not None else self.work
        self.stages = list(stages)
        fps = dict(external)
        for stage in self.stages:
            missing = [r for r in stage.reads if r not in fps]
            if missing:
                raise ValueError(f"stage {stage.name} reads {missing}, which come later or do not exist")
            fps[stage.name] = fingerprint(
                {
                    "stage": stage.name,
                    "version": stage.version,
                    "options": dict(stage.options),
                    "reads": {r: fps[r] for r in stage.reads},
                }
            )
        self.fingerprints: Dict[str, str] = fps

    def marker(self, name: str) -> Path:
        return self.state_dir / f"{name}.done"

    def started_marker(self, name: str) -> Path:
        """The record naming the fingerprint a stage's folder was started with."""
        return self.state_dir / f"{name}.started"

    _started = started_marker

    def finished_result(self, stage: Stage) -> Optional[Dict[str, Any]]:
        """The marker of ``stage`` if it was finished with today's fingerprint and its
        products are all still there (:meth:`missing_product`), else None."""
        done = _read_json(self.marker(stage.name))
        if isinstance(done, dict) and done.get("fingerprint") == self.fingerprints[stage.name]:
            if self.missing_product(stage, done) is None:
                return done
        return None

    def _folder_products(self, stage: Stage) -> List[str]:
        """The files ``stage`` left in its folder (relative to the work dir): those its
        ``writes`` match (every file for ``writes=()``), not inside another stage's folder,
        no temporary (``.NAME.tmp-*``) and no lock.  Only for a folder the user can see
        (``writes`` given): a work folder's files may move on (preprocess's finalize)."""
        if stage.folder is None or stage.writes is None:
            return []
        folder = self.work / stage.folder
        if not folder.is_dir() or folder.is_symlink():
            return []
        others = [self.work / s.folder for s in self.stages if s.folder is not None and s is not stage]
        nested = [o for o in others if folder in o.parents]
        found = []
        for path in sorted(folder.rglob("*")):
            if not path.is_file() or path.is_symlink() or any(o == path or o in path.parents for o in nested):
                continue
            rel = path.relative_to(folder).as_posix()
            if path.name.startswith(".") and (".tmp-" in path.name or path.name == ".lock"):
                continue
            if stage.writes and not any(fnmatch.fnmatchcase(rel, pattern) for pattern in stage.writes):
                continue
            found.append(path.relative_to(self.work).as_posix())
        return found

    def missing_product(self, stage: Stage, done: Mapping[str, Any]) -> Optional[str]:
        """A product of the finished ``stage`` that is gone (relative to the work dir), else None:
        its folder, a file its marker recorded there, or one of ``Stage.products``."""
        if stage.folder is not None and stage.writes is not None and not (self.work / stage.folder).is_dir():
            return stage.folder
        recorded = done.get("products")
        for rel in [*(recorded if isinstance(recorded, list) else []), *stage.products]:
            if isinstance(rel, str) and not (self.work / rel).is_file():
                return rel
        return None

    def _begin(self, stage: Stage) -> None:
        """Make ``stage``'s folder ready: kept for a restart with the same
        fingerprint (it may hold finished parts), else cleared of what the stage
        wrote (:meth:`_discard`)."""
        fp = self.fingerprints[stage.name]
        # The old marker goes first: whatever happens next, no marker may
        # vouch for a folder that is being changed.
        self.marker(stage.name).unlink(missing_ok=True)
        if stage.folder is None:
            return
        folder = self.work / stage.folder
        started = _read_json(self._started(stage.name))
        resumed = isinstance(started, dict) and started.get("fingerprint") == fp and folder.is_dir()
        if not resumed:
            # The .started record of the old fingerprint stays until this is done:
            # a kill half-way leaves a folder still known as the stage's.
            self._discard(stage, folder)
            folder.mkdir(parents=True, exist_ok=True)
        _remove_debris(stage, folder)
        if not resumed:
            write_json_atomic(self._started(stage.name), {"fingerprint": fp})

    def _discard(self, stage: Stage, folder: Path) -> None:
        """Delete what ``stage`` wrote in ``folder`` before it starts afresh."""
        if stage.writes is None:  # the stage's alone (see Stage)
            shutil.rmtree(folder, ignore_errors=True)
            return
        matches = sorted({p for pattern in stage.writes for p in folder.glob(pattern)})
        for path in matches:
            if path.is_dir() and not path.is_symlink():
                raise OutputError(path, f"is a folder where stage {stage.name} writes a file; move it away")
        # relative to the work dir: a stage folder that is a link is refused, never followed
        delete_listed(self.work, [p.relative_to(self.work).as_posix() for p in matches])

    def run(self, stop_after: Optional[str] = None) -> Dict[str, Any]:
        results: Dict[str, Any] = {}
        for stage in self.stages:
            done = self.finished_result(stage) if stage.marker else None
            if done is not None:
                logger.info("stage %s: already done, skipping", stage.name)
                results[stage.name] = done["result"]
            else:
                earlier = _read_json(self.marker(stage.name)) if stage.marker else None
                if isinstance(earlier, dict) and earlier.get("fingerprint") == self.fingerprints[stage.name]:
                    gone = self.missing_product(stage, earlier)
                    logger.info("stage %s: running (%s, which it made, is gone)", stage.name, gone)
                elif earlier is not None:
                    logger.info("stage %s: running (what it reads changed since it was run)", stage.name)
                else:
                    logger.info("stage %s: running", stage.name)
                self._begin(stage)
                results[stage.name] = stage.run(results)
                if stage.marker:
                    write_json_atomic(
                        self.marker(stage.name),
                        {
                            "fingerprint": self.fingerprints[stage.name],
                            "result": results[stage.name],
                            "products": self._folder_products(stage),
                        },
                    )
                logger.info("stage %s: done", stage.name)
            if stop_after == stage.name:
                logger.info("stopping after stage %s (--stop-after)", stage.name)
                break
        return results


# ---------------------------------------------------------------------------
# stages listed from a plan: what a stage body reads is what its fingerprint holds
# ---------------------------------------------------------------------------

WHOLE_PLAN = "*"  # a stage that reads (states) the whole plan: a report


class UndeclaredInput(RuntimeError):
    """A stage body read a plan field its stage does not declare.  A bug of the tool, never
    the user's: the field is not in the stage's fingerprint, so a rerun with it changed
    would reuse what was made without it (a wrong result printed as a result)."""


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON (dataclasses as dicts, paths as strings, a value that says what
    identifies it -- ``fingerprint_identity()``, an objective's name -- as that) for a fingerprint;
    TypeError for anything else (it could not be compared between runs)."""
    if hasattr(value, "fingerprint_identity") and not isinstance(value, type):
        return jsonable(value.fingerprint_identity())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"a {type(value).__name__} cannot be part of a stage's fingerprint")


def field_value(plan: Any, name: str) -> Any:
    """The value of ``name`` (``a`` or ``a.b``) in ``plan``; AttributeError when there is no such field."""
    value = plan
    for part in name.split("."):
        if not (dataclasses.is_dataclass(value) and part in {f.name for f in dataclasses.fields(value)}):
            raise AttributeError(f"{type(value).__name__} has no field {part!r} (declared as {name!r})")
        value = getattr(value, part)
    return value


def _tree(names: Sequence[str]) -> Dict[str, Optional[Tuple[str, ...]]]:
    """``("a", "b.c", "b.d")`` -> ``{"a": None, "b": ("c", "d")}`` (None: the whole field)."""
    tree: Dict[str, Optional[List[str]]] = {}
    for name in names:
        head, _, rest = name.partition(".")
        if not rest:
            tree[head] = None
        elif tree.get(head, []) is not None:
            tree.setdefault(head, []).append(rest)
    return {k: None if v is None else tuple(v) for k, v in tree.items()}


def normalise_fields(names: Sequence[str]) -> Tuple[str, ...]:
    """Sorted, without a part of a field that is declared whole (``pretrain.gpu`` with ``pretrain``)."""
    names = set(names)
    return tuple(sorted(n for n in names if not any(n.startswith(o + ".") for o in names)))


class PlanView:
    """The plan as a stage body sees it: its declared fields (``a``, or ``a.b`` for part of one),
    the ``free`` ones (fields that never change a product), and the plan's properties and
    methods, computed on this view (so that what they read is checked too).  Anything else
    raises :class:`UndeclaredInput`; nothing can be set."""

    def __init__(self, plan: Any, fields: Sequence[str], free: Mapping[str, str], stage: str, where: str = "plan"):
        object.__setattr__(self, "_plan", plan)
        object.__setattr__(self, "_fields", _tree(fields))
        object.__setattr__(self, "_free", free)
        object.__setattr__(self, "_stage", stage)
        object.__setattr__(self, "_where", where)

    def __getattr__(self, name: str) -> Any:
        plan, fields = self._plan, self._fields
        if name in fields:
            value = getattr(plan, name)
            sub = fields[name]
            return value if sub is None else PlanView(value, sub, {}, self._stage, f"{self._where}.{name}")
        if name in self._free:
            return getattr(plan, name)
        attr = inspect.getattr_static(type(plan), name, None)
        if isinstance(attr, property):
            return attr.fget(self)
        if inspect.isfunction(attr):
            return types.MethodType(attr, self)
        raise UndeclaredInput(
            f"stage {self._stage} read {self._where}.{name}, which it does not declare: the field would be "
            "missing from its fingerprint (declare it where the stage is listed)"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise UndeclaredInput(f"stage {self._stage} set {self._where}.{name}: a stage never changes the plan")


@contextlib.contextmanager
def plan_seen_as(owner: Any, view: Any, attr: str = "plan") -> Iterator[None]:
    """``owner.<attr>`` is ``view`` inside the block (the body of one stage), the plan again after."""
    real = getattr(owner, attr)
    setattr(owner, attr, view)
    try:
        yield
    finally:
        setattr(owner, attr, real)


@dataclass(frozen=True)
class PlanReads:
    """How a tool's stages read its plan (``owner.plan``, a dataclass).

    ``free``: the fields any stage may read because they never change a product, each
    with its reason (the CPU threads, ...).  ``inputs``: the fields that are the paths of
    the tool's external inputs, with the name of each in the Runner's ``external``: a
    stage that declares one reads that input's content too.
    """

    free: Mapping[str, str] = field(default_factory=dict)
    inputs: Mapping[str, str] = field(default_factory=dict)

    def stage(
        self,
        owner: Any,
        name: str,
        body: Callable[..., Any],
        fields: Sequence[str] = (),
        params: Optional[Mapping[str, Any]] = None,
        reads: Sequence[str] = (),
        **kwargs: Any,
    ) -> Stage:
        """A :class:`Stage` whose options are the declared plan ``fields`` (``WHOLE_PLAN``:
        all of it) and the ``params`` its body gets as keyword arguments (``body(results,
        **params)``), both made before anything runs; the body sees ``owner.plan`` as a
        :class:`PlanView` of those fields.  ``kwargs``: the other :class:`Stage` fields."""
        plan = owner.plan
        params = dict(params or {})
        if WHOLE_PLAN in fields:
            options: Dict[str, Any] = {WHOLE_PLAN: jsonable(plan)}
            declared: Tuple[str, ...] = tuple(f.name for f in dataclasses.fields(plan))
            view: Any = plan
        else:
            declared = normalise_fields(fields)
            free = [f for f in declared if f.split(".")[0] in self.free]
            if free:
                raise ValueError(f"stage {name} declares {free}, which never change a product (PlanReads.free)")
            options = {f: jsonable(field_value(plan, f)) for f in declared}
            view = PlanView(plan, declared, self.free, name)
        options.update({f"param:{k}": jsonable(v) for k, v in params.items()})
        externals = [self.inputs[f] for f in declared if f in self.inputs and getattr(plan, f) is not None]

        def run(results: Dict[str, Any]) -> Any:
            with plan_seen_as(owner, view):
                return body(results, **params)

        return Stage(name, run, options, reads=tuple(dict.fromkeys([*reads, *externals])), **kwargs)
