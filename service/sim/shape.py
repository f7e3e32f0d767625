"""The shape of traffic over time: a daily cycle, canaries, rollbacks and slow drift.

Real traffic is harsher than a flat stream: volume and quality follow the hour of the
day, a new version often serves a share of the traffic beside the old one first (a
canary), a bad deploy is rolled back, and quality can decay slowly with no deploy at
all (an index going stale). The labels themselves can shift while retrieval holds: a
prompt change halves the answer's citations, a page redesign halves the clicks. A
:class:`TrafficShape` describes all of that as functions of event time; the simulator
asks it how many queries arrive, which version serves a query, how much the find rate
moves, and how likely each citation and click is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from service.errors import ConfigError
from service.times import DAY_MS, HOUR_MS


@dataclass(frozen=True, slots=True)
class TrafficShape:
    """Time-varying traffic; every field's default leaves the stream flat."""

    volume_amplitude: float = 0.0
    """Query rate times ``1 + a * cycle(t)``: 0.5 means half the mean at night, 1.5 at peak."""
    quality_amplitude: float = 0.0
    """Added to every version's find rate times ``cycle(t)`` (harder questions at night)."""
    peak_hour: float = 15.0
    """UTC hour of the daily peak of both cycles."""
    canary_share: float = 1.0
    """Share of queries the new version serves from the switch until ``promote_at_ms``."""
    promote_at_ms: int | None = None
    """From here the new version serves all the traffic (None: never, if a canary)."""
    rollback_at_ms: int | None = None
    """From here the old version serves all the traffic again."""
    drift_start_ms: int | None = None
    drift_ms: int = 6 * HOUR_MS
    drift_drop: float = 0.0
    """The find rate of every version falls linearly by this over ``drift_ms`` from
    ``drift_start_ms``, then stays down."""
    citations_scale: float = 1.0
    """From ``citations_scale_at_ms`` on, every citation's probability (of a relevant, a
    non-relevant or an unretrieved chunk) is multiplied by this (0.5 halves the citations),
    for every version: a label shift, retrieval quality unchanged."""
    citations_scale_at_ms: int | None = None
    clicks_scale: float = 1.0
    """From ``clicks_scale_at_ms`` on, every click's probability (``click_by_grade``) is
    multiplied by this, for every version; examination and stopping are unchanged."""
    clicks_scale_at_ms: int | None = None

    def __post_init__(self) -> None:
        for name in ("volume_amplitude", "quality_amplitude", "canary_share", "drift_drop"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name} must lie in [0, 1], got {value!r}")
        if self.volume_amplitude >= 1.0:
            raise ConfigError("volume_amplitude must be below 1 (the rate must stay positive)")
        if self.canary_share <= 0.0:
            raise ConfigError("canary_share must be positive")
        if self.drift_ms <= 0:
            raise ConfigError(f"drift_ms must be positive, got {self.drift_ms!r}")
        for name in ("citations_scale", "clicks_scale"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name} must lie in [0, 1] (0.5 halves), got {value!r}")

    @property
    def shifts_labels(self) -> bool:
        """Whether the shape scales the citations or the clicks from some time on."""
        citations = self.citations_scale_at_ms is not None and self.citations_scale != 1.0
        clicks = self.clicks_scale_at_ms is not None and self.clicks_scale != 1.0
        return citations or clicks

    @property
    def shapes_traffic(self) -> bool:
        """False for a shape that does nothing but shift labels: the simulator then makes
        exactly the draws of an unshaped run, so the shift changes nothing before its time.
        Every other shape, the flat one too, draws a canary's and the volume's share per
        query (as shapes always have: their runs stay reproducible)."""
        without_shifts = replace(
            self,
            citations_scale=1.0,
            citations_scale_at_ms=None,
            clicks_scale=1.0,
            clicks_scale_at_ms=None,
        )
        return not self.shifts_labels or without_shifts != TrafficShape()

    def cycle(self, ts_ms: int) -> float:
        """The daily cycle at ``ts_ms``: 1 at ``peak_hour``, -1 twelve hours later."""
        hours = (ts_ms % DAY_MS) / HOUR_MS
        return math.cos(2.0 * math.pi * (hours - self.peak_hour) / 24.0)

    def volume(self, ts_ms: int) -> float:
        """The query rate's factor at ``ts_ms`` (at most ``1 + volume_amplitude``)."""
        return 1.0 + self.volume_amplitude * self.cycle(ts_ms)

    def find_rate_shift(self, ts_ms: int) -> float:
        """What the daily cycle and the drift add to every version's find rate."""
        shift = self.quality_amplitude * self.cycle(ts_ms)
        if self.drift_start_ms is not None and ts_ms > self.drift_start_ms:
            shift -= self.drift_drop * min(1.0, (ts_ms - self.drift_start_ms) / self.drift_ms)
        return shift

    def new_version_serves(self, ts_ms: int, deploy_ms: int, draw: float) -> bool:
        """Whether the new version serves a query at ``ts_ms`` (``draw`` uniform in [0, 1))."""
        if ts_ms < deploy_ms or (self.rollback_at_ms is not None and ts_ms >= self.rollback_at_ms):
            return False
        if self.promote_at_ms is not None and ts_ms >= self.promote_at_ms:
            return True
        return draw < self.canary_share

    def citations_factor(self, ts_ms: int) -> float:
        """What multiplies each citation's probability for a query at ``ts_ms``."""
        at_ms = self.citations_scale_at_ms
        return self.citations_scale if at_ms is not None and ts_ms >= at_ms else 1.0

    def clicks_factor(self, ts_ms: int) -> float:
        """What multiplies each click's probability for a query at ``ts_ms``."""
        at_ms = self.clicks_scale_at_ms
        return self.clicks_scale if at_ms is not None and ts_ms >= at_ms else 1.0
