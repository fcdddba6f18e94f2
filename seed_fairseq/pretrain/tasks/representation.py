"""The model's vector across a continued run: a checkpoint is continued with the vector it records.

``--bottleneck-pooling``, ``--retrieval-similarity``, ``--retrieval-max-length`` and
``--retrieval-raw-vectors`` are the model's vector (what every bottleneck reads, what the validation
scores, what the export writes), and
``--bottleneck-unnormalized`` says what the bottleneck reads of it.  A run that continues a
checkpoint -- a resume from ``checkpoint_last.pt``, ``--restore-file``, ``--finetune-from-model``:
everything fairseq's ``Trainer.load_checkpoint`` loads (``fairseq_patches/restarts.py`` calls
:meth:`RepresentationRecord.check_continuation`) -- with other values would silently switch the
objective, and the checkpoints it writes would record only the new ones.  Such a run is refused
before training (one ``error: CHECKPOINT: ...`` line naming both settings) unless
``--allow-representation-change``; with it, the switch is recorded in the task state of every
checkpoint the run writes (``representation_changes``: oldest first, carried on by every later
continuation).

What a checkpoint records: ``checkpoint_records.representation_options`` (its task config, or an
encoder-only checkpoint's extra state); a checkpoint written before the options existed (0.1's)
records none and is taken as the papers' default, [CLS], dot product, the model's positions.  The
text lengths are compared as the export writes them (0 and a length at or beyond the model's
positions are the same cut), and ``--bottleneck-unnormalized`` only for a checkpoint that trained
(an import, 0 updates, has no decoder that read its vector).
"""

import logging
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from ...base.errors import ConfigurationError
from ...base.representation import PAPERS, Representation, of_options
from ..checkpoint import CheckpointError, num_updates
from ..checkpoint_records import REPRESENTATION_CHANGES, representation_changes, representation_options
from .identity import POSITIONS_KEY

logger = logging.getLogger(__name__)

ALLOW_OPTION = "--allow-representation-change"
UNNORMALIZED = "bottleneck_unnormalized"  # what the bottleneck reads of the representation (models/bottleneck.py)


def check_max_length(max_length: int, positions: Optional[int]) -> None:
    """``--retrieval-max-length`` beyond the model's positions: no text of that length fits the model."""
    if positions is not None and max_length > positions:
        raise ConfigurationError(
            f"--retrieval-max-length {max_length} is beyond the model's {positions} positions (--max-positions): "
            f"use {positions} or less, or 0 (the model's positions)"
        )


@dataclass(frozen=True)
class Vector:
    """One setting of the representation options: the model's representation (``base/representation.py``)
    and whether the bottleneck reads it unnormalised (defaults: the papers')."""

    representation: Representation = PAPERS
    unnormalized: bool = False

    @classmethod
    def of(cls, options: Any) -> "Vector":
        """From a task config (the run's) or the mapping ``representation_options`` gives (a checkpoint's);
        ValueError for a value no representation has."""
        unnormalized = (
            options.get(UNNORMALIZED) if isinstance(options, Mapping) else getattr(options, UNNORMALIZED, None)
        )
        return cls(of_options(options), bool(unnormalized))

    def cut(self, positions: Optional[int]) -> Optional[int]:
        """The text length the export writes (``Representation.seq_length``)."""
        return self.representation.max_length if positions is None else self.representation.seq_length(positions)

    def reads_normalized(self) -> bool:
        return self.representation.similarity == "cosine" and not self.unnormalized

    def differs(self, other: "Vector", positions: Optional[int], trained: bool) -> bool:
        a, b = self.representation, other.representation
        return (a.pooling, a.similarity, self.cut(positions), a.raw_vectors) != (
            b.pooling,
            b.similarity,
            other.cut(positions),
            b.raw_vectors,
        ) or (trained and self.reads_normalized() != other.reads_normalized())

    def options(self) -> str:
        """The fairseq-train options of this vector."""
        r = self.representation
        return (
            f"--bottleneck-pooling {r.pooling} --retrieval-similarity {r.similarity} "
            f"--retrieval-max-length {r.max_length}"
            + (" --bottleneck-unnormalized" if self.unnormalized else "")
            + (" --retrieval-raw-vectors" if r.raw_vectors else "")
        )

    def record(self) -> Dict[str, Any]:
        return {**self.representation.options(), UNNORMALIZED: self.unnormalized}


def _positions(state: dict, pad: int) -> Optional[int]:
    table = (state.get("model") or {}).get(POSITIONS_KEY)
    return None if table is None else int(table.shape[0]) - pad - 1  # fairseq's learned positions


class RepresentationRecord:
    """Mixed into the task: the check of a continued checkpoint, and the record of its switches."""

    def state_dict(self) -> Dict[str, Any]:
        state = super().state_dict()
        changes = getattr(self, "_representation_changes", None)
        if changes:
            state[REPRESENTATION_CHANGES] = [dict(c) for c in changes]
        return state

    def check_continuation(self, state: dict, filename) -> None:
        """Refuse to continue ``state`` (a checkpoint this run loads to train on) with another vector
        than it records, unless ``--allow-representation-change``; keep its record of switches, and
        add this one."""
        changes = representation_changes(state, filename)
        recorded = representation_options(state)
        try:
            before, now = Vector.of(recorded), Vector.of(self.cfg)
        except ValueError as e:
            raise CheckpointError(filename, f"records {e}") from None
        updates = num_updates(state)
        if before.differs(now, _positions(state, self.source_dictionary.pad()), trained=updates > 0):
            was = before.options() + ("" if recorded else " (it records none: the papers' default)")
            problem = f"trained with {was}, but this run asks for {now.options()}"
            if not self.cfg.allow_representation_change:
                raise CheckpointError(
                    filename,
                    f"{problem}: continuing it so would switch the objective and what the export writes; pass the "
                    f"checkpoint's options, or {ALLOW_OPTION} to switch (recorded in the checkpoints)",
                )
            logger.warning(f"{filename}: {problem}; switching because of {ALLOW_OPTION} (recorded in the checkpoints)")
            changes.append(
                {"update": updates, "checkpoint": str(filename), "from": before.record(), "to": now.record()}
            )
        self._representation_changes = changes
