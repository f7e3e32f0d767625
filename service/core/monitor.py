"""The composition root of the pure core: the pipeline, and the view of its windows.

The stream core (:mod:`service.stream`) turns records into closed windows and never
imports the detector; detection (:mod:`service.detect`) consumes closed windows. A
:class:`Monitor` wires the two through a :class:`WindowView`, which keeps the rolling
views and the listing (merged over partitions, each window once) and runs the detector
at every boundary up to which all windows have closed: fed by the pipeline's confirmed
windows in one process (``demo``, ``replay``), by the windows topic and the group's
progress in ``run`` (every replica: the global view). The HTTP API and the rolling and
regression series read the view. ``run``, ``demo``,
``replay`` and the tests build the same Monitor, so they reach the same verdicts on the
same events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from service.core.view import ViewMode, WindowView
from service.detect.detector import Detector
from service.detect.ledger import Recorder
from service.detect.model import DetectorConfig
from service.metrics.ir import metric_keys
from service.stream.counters import Counts
from service.stream.pipeline import Pipeline, PipelineConfig
from service.times import HOUR_MS, duration_field


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    """The core's parameters: the pipeline's and the detector's (milliseconds).

    The detector is given the pipeline's window, attribution window and metric keys here,
    once (whether built from the settings, :func:`service.config.monitor_config`, or by
    hand)."""

    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    progress_stall_ms: int = duration_field("15m")
    """A partition whose progress has not moved for this long (wall clock) while others
    moved is left out of the global boundary (``--progress-stall``)."""

    def __post_init__(self) -> None:
        # the detector reads the pipeline's windows: their width, attribution and metrics
        join = self.pipeline.join
        keys = metric_keys(self.pipeline.ks)
        watched = tuple(m for m in self.detector.metrics if m in keys) or ("mrr",)
        # (with early windows, the labels it compares are complete at their label age)
        age = join.early_age_ms
        fitted = replace(
            self.detector,
            window_ms=join.window_ms,
            attribution_ms=join.attribution_ms if age is None else age,
            metrics=watched,
        )
        object.__setattr__(self, "detector", fitted)


class Monitor:
    """The pipeline of one process and the view of its windows."""

    def __init__(
        self,
        config: MonitorConfig,
        now_ms: Callable[[], int],
        counts: Counts | None = None,
        keep_opened: int | None = 10_000,
        *,
        global_view: bool = False,
        record_decisions: bool = False,
    ) -> None:
        """``record_decisions`` (``run``): the detector writes its decisions to an outbox
        for the regressions topic, and can take them back after a restart
        (:mod:`service.detect.ledger`); ``replay`` and ``demo`` keep no outbox."""
        self.config = config
        self.pipeline = Pipeline(config.pipeline, now_ms, counts)
        join = config.pipeline.join
        recorder = Recorder() if record_decisions else None
        self.detector = Detector(config.detector, keep_opened=keep_opened, recorder=recorder)
        self.view = WindowView(
            join.window_ms,
            config.pipeline.rolling_ms,
            self.detector,
            ViewMode.GLOBAL if global_view else ViewMode.LOCAL,
            watermark_ms=None if global_view else lambda: self.pipeline.watermark_ms,
            attribution_ms=join.attribution_ms,
            stall_ms=config.progress_stall_ms,
            metric_keys=self.pipeline.metric_keys,
            early=join.early_age_ms is not None,
        )
        if not global_view:  # in run, the follower feeds the view from the topics
            self.pipeline.sinks.append(self.view)

    @property
    def history_ms(self) -> int:
        """How much published history the rolling views and the detector use (plus slack)."""
        d = self.detector.config
        reach = d.reach_ms + d.window_ms
        attribution = self.config.pipeline.join.attribution_ms
        return max(reach, *self.config.pipeline.rolling_ms) + 2 * attribution + HOUR_MS
