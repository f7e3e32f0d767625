"""The composition root of the pure core: the pipeline with the detector on its windows.

The stream core (:mod:`service.stream`) turns records into closed windows and never
imports the detector; detection (:mod:`service.detect`) consumes closed windows. A
:class:`Monitor` wires the two: every window the pipeline confirms (durably published)
or restores (read back from the windows topic) reaches the detector, and so does every
boundary up to which all windows have closed. ``run``, ``demo``, ``replay`` and the
tests build the same Monitor, so they reach the same verdicts on the same events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from service.config import Settings
from service.detect.detector import Detector
from service.detect.model import DetectorConfig
from service.stream.counters import Counts
from service.stream.join import JoinConfig
from service.stream.pipeline import Pipeline, PipelineConfig
from service.times import HOUR_MS


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    """The core's parameters: the pipeline's and the detector's (milliseconds)."""

    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    detector: DetectorConfig = field(default_factory=DetectorConfig)

    @classmethod
    def from_settings(cls, settings: Settings) -> MonitorConfig:
        """The core's parameters from the service settings."""
        window = settings.window
        pipeline = PipelineConfig(
            join=JoinConfig(
                attribution_ms=settings.attribution_window,
                clock_skew_ms=settings.clock_skew,
                window_ms=window,
                max_out_of_orderness_ms=settings.max_out_of_orderness,
                idle_timeout_ms=settings.idle_timeout,
            ),
            ks=settings.ks,
            max_future_skew_ms=settings.max_future_skew,
            max_pending_queries=settings.max_pending_queries,
            max_pending_feedback=settings.max_pending_feedback,
            max_label_values=settings.max_label_values,
            rolling_ms=settings.rolling_windows,
        )
        detector = DetectorConfig(
            metrics=settings.watched_metrics,
            window_ms=window,
            attribution_ms=settings.attribution_window,
            candidate_ms=whole_windows(settings.regression_candidate, window),
            baseline_ms=whole_windows(settings.regression_baseline, window),
            deploy_watch_ms=whole_windows(settings.regression_deploy_watch, window),
            min_labelled=settings.regression_min_labelled,
            min_effect=settings.regression_min_effect,
            alpha=settings.regression_alpha,
            drift_alpha=settings.regression_drift_alpha,
            close_after_ms=whole_windows(settings.regression_close_after, window),
        )
        return cls(pipeline=pipeline, detector=detector)


def whole_windows(span_ms: int, window_ms: int) -> int:
    """A span rounded up to whole windows (the detector compares whole windows)."""
    return -(-span_ms // window_ms) * window_ms


class Monitor:
    """The pipeline of one process and the regression detector fed by its windows."""

    def __init__(
        self,
        config: MonitorConfig,
        now_ms: Callable[[], int],
        counts: Counts | None = None,
        keep_opened: int | None = 10_000,
    ) -> None:
        self.config = config
        self.pipeline = Pipeline(config.pipeline, now_ms, counts)
        join = config.pipeline.join
        keys = self.pipeline.metric_keys
        watched = tuple(m for m in config.detector.metrics if m in keys) or ("mrr",)
        fitted = replace(
            config.detector,
            window_ms=join.window_ms,
            attribution_ms=join.attribution_ms,
            metrics=watched,
        )
        self.detector = Detector(fitted, keep_opened=keep_opened)
        self.pipeline.sinks.append(self.detector)

    @property
    def history_ms(self) -> int:
        """How much published history the rolling views and the detector use (plus slack)."""
        d = self.detector.config
        reach = max(d.candidate_ms + d.baseline_ms, d.deploy_watch_ms) + d.window_ms
        return max(reach, *self.config.pipeline.rolling_ms) + 2 * d.attribution_ms + HOUR_MS
