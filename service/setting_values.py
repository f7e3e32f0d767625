"""How setting values are written and parsed (cutoffs, durations, metric keys), and where
a setting of the core takes its default: from the core's own config."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic_settings import NoDecode

from service.errors import ConfigError
from service.metrics.ir import validate_ks
from service.times import WRITTEN, parse_duration_ms

ENV_PREFIX = "RETRIEVAL_MONITOR_"


def parse_ks(text: str) -> tuple[int, ...]:
    """Parse a comma-separated list of cutoffs such as ``1,3,5,10,20``."""
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise ConfigError(f"k needs a comma-separated list of positive integers, got {text!r}")
    ks = []
    for part in parts:
        try:
            k = int(part)
        except ValueError:
            raise ConfigError(
                f"k must be a positive integer, got {part!r} in {text!r} (example: 1,3,5,10,20)"
            ) from None
        ks.append(k)
    return validate_ks(ks)


def _ks(value: object) -> tuple[int, ...]:
    if isinstance(value, str):
        try:
            return parse_ks(value)
        except ConfigError as error:
            raise ValueError(str(error)) from None
    if isinstance(value, list | tuple):
        return validate_ks(list(value))
    raise ValueError(f"expected cutoffs such as 1,3,5,10,20, got {value!r}")


def _durations(value: object) -> tuple[int, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ValueError(f"expected durations such as 15m,1h,24h, got {value!r}")
    spans = tuple(parse_duration_ms(item) for item in items)
    if any(span <= 0 for span in spans):
        raise ValueError(f"rolling windows must be positive, got {value!r}")
    return spans


def _names(value: object) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        raise ValueError(f"expected metric keys such as recall@5,mrr, got {value!r}")
    return tuple(str(item).strip() for item in items if str(item).strip())


Duration = Annotated[int, BeforeValidator(parse_duration_ms), Field(ge=0)]
PositiveDuration = Annotated[int, BeforeValidator(parse_duration_ms), Field(gt=0)]
Cutoffs = Annotated[tuple[int, ...], NoDecode, BeforeValidator(_ks)]
Spans = Annotated[tuple[int, ...], NoDecode, BeforeValidator(_durations)]
MetricNames = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_names)]


def default_of(config: type[Any], name: str) -> Any:
    """The default of field ``name`` of a core config, as a setting takes it: a duration
    as it is written there (``30m``; validated like a given value), anything else as is."""
    for item in dataclasses.fields(config):
        if item.name == name:
            if WRITTEN in item.metadata:
                return item.metadata[WRITTEN]
            if item.default_factory is not dataclasses.MISSING:
                return item.default_factory()
            return item.default
    raise AttributeError(f"{config.__name__} has no field {name!r}")


def ms_setting(setting: str, default: type[Any] | str, name: str = "") -> Any:
    """A duration setting held in milliseconds, in an attribute named ``<setting>_ms``:
    its flag and env var stay those of ``setting``. Its default is a core config's field
    (``default, name``) or, for a setting only the edges use, the duration written here."""
    written = default if isinstance(default, str) else default_of(default, name)
    return Field(written, validation_alias=ENV_PREFIX + setting.upper())


def whole_windows(span_ms: int, window_ms: int) -> int:
    """A span rounded up to whole windows (the detector compares whole windows)."""
    return -(-span_ms // window_ms) * window_ms


DETECTOR_SETTINGS = {
    "metrics": "regression_metrics",
    "candidate_ms": "regression_candidate",
    "baseline_ms": "regression_baseline",
    "deploy_watch_ms": "regression_deploy_watch",
    "no_history_watch_ms": "regression_no_history_watch",
    "no_history_span_ms": "regression_no_history_span",
    "baseline_days": "regression_baseline_days",
    "min_labelled": "regression_min_labelled",
    "min_effect": "regression_min_effect",
    "alpha": "regression_alpha",
    "tau": "regression_tau",
    "drift_budget": "regression_drift_budget",
    "label_shift_budget": "regression_label_shift_budget",
    "drift_period_ms": "regression_drift_period",
    "close_after_ms": "regression_close_after",
}
"""A DetectorConfig field (its check's message starts with it) -> the setting it comes from."""
