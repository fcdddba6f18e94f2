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
it is restarted with the same fingerprint, and starts from an empty folder
otherwise. Stages must be deterministic (same fingerprint, same files), which
is what makes reusing a downstream stage after its upstream was redone with
the same fingerprint correct.
"""

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

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
    folder made by the old code is reused. ``folder`` (under the work dir) is
    emptied when the stage runs with a new fingerprint. ``marker=False``:
    completion is recorded by the stage itself (the final record).
    """

    name: str
    run: Callable[[Dict[str, Any]], Any]
    options: Mapping[str, Any] = field(default_factory=dict)
    reads: Sequence[str] = ()
    folder: Optional[str] = None
    marker: bool = True
    version: int = 1


def _read_json(path: Path) -> Optional[Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


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
        fingerprint (it may hold finished parts), emptied otherwise."""
        from seed_fairseq.fileio import write_json_atomic  # lazily: see preprocess.build._fileio

        fp = self.fingerprints[stage.name]
        # The old marker goes first: whatever happens next, no marker may
        # vouch for a folder that is being changed.
        self.marker(stage.name).unlink(missing_ok=True)
        if stage.folder is None:
            return
        folder = self.work / stage.folder
        started = _read_json(self._started(stage.name))
        if isinstance(started, dict) and started.get("fingerprint") == fp and folder.is_dir():
            # Temporaries of an interrupted write (fileio names them ".NAME.tmp-*").
            for debris in folder.glob(".*.tmp-*"):
                if debris.is_file():
                    debris.unlink()
            return
        self._started(stage.name).unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self._started(stage.name), {"fingerprint": fp})

    def run(self, stop_after: Optional[str] = None) -> Dict[str, Any]:
        from seed_fairseq.fileio import write_json_atomic

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
