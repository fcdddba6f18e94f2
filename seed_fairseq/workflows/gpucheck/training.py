"""What N updates of one objective in one precision measured (``runs.train``): losses, overflows, memory,
and the speed after warm-up.

Words/s (and MFU, from it) is a steady-state figure: the first update counts the FLOPs under
``FlopCounterMode`` (slower) and the next ``warmup`` ones still pay for the device warming up
(allocator growth, kernel selection), so neither is measured; nor is a step fp16's loss scaler
skipped (no optimizer step: quicker than an update). The updates measured are split in two halves;
their speeds must agree within :data:`SPREAD_LIMIT` for the figure to be called stable (two runs of
the 2026-11-27 H200 differed by up to 5 points of MFU, measured on 2 updates each).
"""

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

SPREAD_LIMIT = 0.05  # the halves' speeds may differ by this much of their mean
MIN_MEASURED = 4  # updates: two halves of two at least


@dataclass
class TrainingResult:
    """What N updates of one objective in one precision measured."""

    batch: int
    updates: int  # the updates fairseq applied (an fp16 step that overflowed is not one)
    steps: int = 0  # every step taken, the overflowed ones included
    losses: List[float] = field(default_factory=list)
    gnorms: List[float] = field(default_factory=list)
    loss_scales: List[float] = field(default_factory=list)
    overflows: int = 0
    peak_memory: Optional[int] = None
    # (encoder tokens, seconds) of each applied update after the first (which also counts FLOPs)
    timed: List[Tuple[float, float]] = field(default_factory=list)
    warmup: int = 1  # of the timed updates, the first ones not measured
    flops_per_token: float = 0.0
    tokens_per_update: float = 0.0
    stopped_early: bool = False  # the run's share of the time budget ended before its updates did
    profile: Optional[Dict] = None  # the kernel profile (kernels.py), when one was taken

    @property
    def finite(self) -> bool:
        return bool(self.losses) and all(math.isfinite(x) for x in self.losses)

    @property
    def falling(self) -> bool:
        """The mean of the last third of the losses is below the mean of the first third."""
        third = max(1, len(self.losses) // 3)
        return self.finite and sum(self.losses[-third:]) / third < sum(self.losses[:third]) / third

    def problems(self, planned: int) -> List[str]:
        """Why this run fails the training check (none: it passes).  fp16's loss scaler starts high and
        halves on each overflow until the gradients fit (fairseq's own masked_lm sums its loss over the
        masked tokens: its first steps overflow at the initial 128), so overflows alone are no problem;
        a scale that never settles is: the planned updates are then not applied."""
        out = []
        if not self.finite:
            out.append("non-finite loss" if self.losses else "no loss")
        elif not self.falling:
            out.append("loss not falling")
        if self.updates < planned and not self.stopped_early:  # stopped early: after the minimum ran
            out.append(
                f"only {self.updates} of {planned} updates applied in {self.steps} steps ({self.overflows} overflowed)"
            )
        return out

    @property
    def measured(self) -> List[Tuple[float, float]]:
        """The updates the speed is measured on: the timed ones after ``warmup`` (all the timed ones when
        none would be left: a run the time budget cut to the minimum; ``speed_stable`` then says no)."""
        return self.timed[self.warmup :] or self.timed

    @property
    def tokens(self) -> float:
        return sum(t for t, _ in self.measured)

    @property
    def seconds(self) -> float:
        return sum(s for _, s in self.measured)

    @property
    def words_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def halves(self) -> Optional[Tuple[float, float]]:
        """Words/s of the first and the second half of the measured updates (an odd one in the middle is in
        neither); None with fewer than 2."""
        m = self.measured
        h = len(m) // 2
        if h == 0:
            return None

        def rate(part):
            seconds = sum(s for _, s in part)
            return sum(t for t, _ in part) / seconds if seconds > 0 else 0.0

        return rate(m[:h]), rate(m[len(m) - h :])

    @property
    def speed_spread(self) -> Optional[float]:
        """|first half - second half| / their mean (None: fewer than 2 measured updates)."""
        halves = self.halves()
        if halves is None or sum(halves) <= 0:
            return None
        return abs(halves[0] - halves[1]) / (sum(halves) / 2)

    @property
    def speed_stable(self) -> bool:
        spread = self.speed_spread
        return len(self.timed) - self.warmup >= MIN_MEASURED and spread is not None and spread <= SPREAD_LIMIT

    def speed_note(self) -> str:
        """What the check's line adds to words/s: nothing when it is stable."""
        if len(self.timed) - self.warmup < MIN_MEASURED:
            n = len(self.measured)
            return f" (after warm-up: {n} update{'' if n == 1 else 's'} measured, too few to call it steady)"
        if not self.speed_stable:
            return f" (unstable: its halves differ by {self.speed_spread:.1%})"
        return ""

    @property
    def flops_per_update(self) -> float:
        return self.flops_per_token * self.tokens_per_update

    def mfu(self, peak_tflops: Optional[float]) -> Optional[float]:
        """Counted FLOPs per second / the device's dense peak."""
        if not peak_tflops or self.seconds <= 0:
            return None
        return self.flops_per_token * self.words_per_second / (peak_tflops * 1e12)

    def values(self, planned: int, search: list, optimizer: str, peak_tflops: Optional[float]) -> Dict:
        """The report's values of this run (``planned``: the updates it was to take; ``search``: the batch
        search's probes; ``peak_tflops``: the device's, for MFU)."""
        return {
            "batch": self.batch,
            "updates": self.updates,
            "steps": self.steps,
            "updates_planned": planned,
            "stopped_early": self.stopped_early,
            "search": search,
            "losses": self.losses,
            "gnorms": self.gnorms,
            "loss_scales": self.loss_scales,
            "overflows": self.overflows,
            "loss_scale_changes": sum(1 for a, b in zip(self.loss_scales, self.loss_scales[1:]) if a != b),
            "peak_memory": self.peak_memory,
            "optimizer": optimizer,
            "words_per_second": self.words_per_second,
            "seconds_per_update": self.seconds / max(1, len(self.measured)),
            "measured_updates": len(self.measured),
            "warmup_updates": self.warmup if len(self.timed) > self.warmup else 0,
            "words_per_second_halves": list(self.halves() or []),
            "speed_spread": self.speed_spread,
            "speed_stable": self.speed_stable,
            "flops_per_token": self.flops_per_token,
            "flops_per_update": self.flops_per_update,
            "tokens_per_update": self.tokens_per_update,
            "mfu": self.mfu(peak_tflops),
            "peak_tflops": peak_tflops,
        }
