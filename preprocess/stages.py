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
"""

import fnmatch
import hashlib
import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from seed_fairseq.fileio import OutputError, delete_listed, write_json_atomic

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
    """

    name: str
    run: Callable[[Dict[str, Any]], Any]
    options: Mapping[str, Any] = field(default_factory=dict)
    reads: Sequence[str] = ()
    folder: Optional[str] = None
    marker: bool = True
    version: int = 1
    writes: Optional[Sequence[str]] = None


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
        """The marker of ``stage`` if it was finished with today's fingerprint, else None."""
        done = _read_json(self.marker(stage.name))
        if isinstance(done, dict) and done.get("fingerprint") == self.fingerprints[stage.name]:
            return done
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
                if stage.marker and self.marker(stage.name).exists():
                    logger.info("stage %s: running (what it reads changed since it was run)", stage.name)
                else:
                    logger.info("stage %s: running", stage.name)
                self._begin(stage)
                results[stage.name] = stage.run(results)
                if stage.marker:
                    write_json_atomic(
                        self.marker(stage.name),
                        {"fingerprint": self.fingerprints[stage.name], "result": results[stage.name]},
                    )
                logger.info("stage %s: done", stage.name)
            if stop_after == stage.name:
                logger.info("stopping after stage %s (--stop-after)", stage.name)
                break
        return results
