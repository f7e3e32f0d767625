"""Settings: one frozen object, from flags (`--name-with-dashes`) and `RETRIEVAL_MONITOR_*` env.

Flags win over the environment, which wins over the defaults. Durations accept ``90s``,
``5m``, ``1h``, ``2d`` or a number of seconds and are held as integer milliseconds: their
attributes end in ``_ms`` (``window_ms``), while the setting, its flag and its env var keep
the contract's name (``window``, ``--window``, ``RETRIEVAL_MONITOR_WINDOW``).

Each setting the core uses takes its default from the core's config (``JoinConfig``,
``PipelineConfig``, ``DetectorConfig``, ``MonitorConfig``), and the detector's settings are
checked by :class:`~service.detect.model.DetectorConfig` itself:
:func:`monitor_config` builds the core's config from the settings: when they are loaded
(so that a bad value is reported by its flag), and again by the command that uses it. The
settings of the Kafka and HTTP edges have their defaults and checks here.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.core.monitor import MonitorConfig
from service.detect.model import DetectorConfig
from service.errors import ConfigError
from service.metrics.ir import metric_keys
from service.setting_values import (
    DETECTOR_SETTINGS,
    ENV_PREFIX,
    Cutoffs,
    Duration,
    MetricNames,
    PositiveDuration,
    Spans,
    default_of,
    ms_setting,
    parse_ks,
    whole_windows,
)
from service.stream.audit_join import AuditConfig
from service.stream.join_state import JoinConfig
from service.stream.pipeline import PipelineConfig
from service.times import parse_duration_ms

__all__ = [  # (ENV_PREFIX, parse_ks and parse_duration_ms are read from here too)
    "ENV_PREFIX",
    "SETTINGS",
    "Settings",
    "add_settings_flags",
    "load_settings",
    "monitor_config",
    "parse_duration_ms",
    "parse_ks",
    "setting_name",
    "settings_from_args",
]

RECONNECT_BACKOFF_MAX_MS = 1_000
"""The longest pause between reconnect attempts to a broker that went away."""


class Settings(BaseSettings):
    """Every setting of the service. Durations are in milliseconds once parsed."""

    # Defaults are validated like given values (durations are written as in the docs).
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        frozen=True,
        extra="forbid",
        case_sensitive=False,
        validate_default=True,
    )

    kafka_bootstrap_servers: str = "127.0.0.1:9092"
    queries_topic: str = "retrieval.queries"
    feedback_topic: str = "retrieval.feedback"
    windows_topic: str = "retrieval.windows"
    early_windows_topic: str | None = None  # (unset: <windows_topic>.early)
    regressions_topic: str = "retrieval.regressions"
    deadletter_topic: str = "retrieval.deadletter"
    group_id: str = "retrieval-monitor"
    http_host: str = "127.0.0.1"
    http_port: int = Field(8000, ge=0, le=65535)
    ks: Cutoffs = default_of(PipelineConfig, "ks")
    attribution_window_ms: Duration = ms_setting("attribution_window", JoinConfig, "attribution_ms")
    clock_skew_ms: Duration = ms_setting("clock_skew", JoinConfig, "clock_skew_ms")
    max_out_of_orderness_ms: Duration = ms_setting(
        "max_out_of_orderness", JoinConfig, "max_out_of_orderness_ms"
    )
    idle_timeout_ms: PositiveDuration = ms_setting("idle_timeout", JoinConfig, "idle_timeout_ms")
    max_future_skew_ms: Duration = ms_setting(
        "max_future_skew", PipelineConfig, "max_future_skew_ms"
    )
    window_ms: PositiveDuration = ms_setting("window", JoinConfig, "window_ms")
    rolling_windows_ms: Spans = ms_setting("rolling_windows", PipelineConfig, "rolling_ms")
    max_pending_queries: int = Field(default_of(PipelineConfig, "max_pending_queries"), ge=1)
    max_pending_feedback: int = Field(default_of(PipelineConfig, "max_pending_feedback"), ge=1)
    max_label_values: int = Field(default_of(PipelineConfig, "max_label_values"), ge=1)
    audit_rate: float = Field(default_of(AuditConfig, "rate"), ge=0.0, le=1.0)
    """The audit sample's share of queries (0 turns auditing off)."""
    audit_window_ms: PositiveDuration = ms_setting("audit_window", AuditConfig, "window_ms")
    audit_judge: str | None = None  # (whose audits count; unset: the first judge's)
    audit_topic: str | None = None  # (where the audit requests go; unset: nowhere)
    audit_state_topic: str = "retrieval.audit-state"  # (compacted; made when missing)
    context_size: int = Field(5, ge=1)
    """How many results reach the model; the detector watches recall and hit rate at it."""
    regression_metrics: MetricNames = ()
    """Metric keys the detector watches; empty: recall@C, hit_rate@C, mrr, ndcg@10 (C =
    context_size), keeping those whose cutoff is in ``ks``."""
    # the detector's settings: its config's defaults, checked by it (see monitor_config)
    regression_candidate_ms: Duration = ms_setting(
        "regression_candidate", DetectorConfig, "candidate_ms"
    )
    regression_baseline_ms: Duration = ms_setting(
        "regression_baseline", DetectorConfig, "baseline_ms"
    )
    regression_deploy_watch_ms: Duration = ms_setting(
        "regression_deploy_watch", DetectorConfig, "deploy_watch_ms"
    )
    regression_no_history_watch_ms: Duration = ms_setting(
        "regression_no_history_watch", DetectorConfig, "no_history_watch_ms"
    )
    regression_no_history_span_ms: Duration = ms_setting(
        "regression_no_history_span", DetectorConfig, "no_history_span_ms"
    )
    regression_baseline_days: int = default_of(DetectorConfig, "baseline_days")
    regression_min_labelled: int = default_of(DetectorConfig, "min_labelled")
    regression_min_effect: float = default_of(DetectorConfig, "min_effect")
    regression_alpha: float = default_of(DetectorConfig, "alpha")
    regression_tau: float = default_of(DetectorConfig, "tau")
    regression_drift_budget: float = default_of(DetectorConfig, "drift_budget")
    regression_label_shift_budget: float = default_of(DetectorConfig, "label_shift_budget")
    regression_label_age_ms: Duration = ms_setting("regression_label_age", JoinConfig, "early_ms")
    regression_drift_period_ms: Duration = ms_setting(
        "regression_drift_period", DetectorConfig, "drift_period_ms"
    )
    regression_close_after_ms: Duration = ms_setting(
        "regression_close_after", DetectorConfig, "close_after_ms"
    )
    shutdown_grace_ms: Duration = ms_setting("shutdown_grace", "0s")
    """After a clean stop (SIGTERM) has handed the partitions over, keep serving /metrics
    this long (``/readyz`` answers 503 "stopped") so that a last scrape sees the final
    counts; set it to the Prometheus scrape interval when every count matters."""
    session_timeout_ms: PositiveDuration = ms_setting("session_timeout", "45s")
    """A crashed replica's partitions move to the others after this long."""
    exactly_once: bool = True
    """Publish windows and commit offsets in one Kafka transaction (else: at least once)."""
    transactional_id: str | None = None
    """Stable per replica, so a restarted process fences its crashed predecessor at once;
    default ``<group_id>-<hostname>-<http_port>``."""
    commit_interval_ms: PositiveDuration = ms_setting("commit_interval", "5s")
    progress_stall_ms: PositiveDuration = ms_setting(
        "progress_stall", MonitorConfig, "progress_stall_ms"
    )
    """Global view: an input partition whose committed progress has not moved for this long
    (wall clock) while others moved is left out of the detector's boundary (unowned, stuck)."""
    poll_timeout_ms: PositiveDuration = ms_setting("poll_timeout", "200ms")
    max_poll_records: int = Field(2000, ge=1)
    max_topic_lead_ms: Duration = ms_setting("max_topic_lead", "10m")
    """Backpressure: a topic partition whose event time runs this far ahead of the other
    topic of its partition, while that one still has a backlog, is paused until the other
    catches up to half of it (0 turns pausing off)."""
    labels_topic: str | None = None
    """The labels output (off when unset): one record per finalised labelled query, sent
    with its window, for golden sets mined from production (``golden-set``)."""
    labels_query_text: bool = False
    """Put the query text in the labels output, when the input mapping reads one (query
    text can be personal data: off by default)."""
    input_mapping: str | None = None
    """Where each event field lives in the user's records: a YAML or JSON mapping file, or
    ``ubi`` (OpenSearch User Behavior Insights 1.3); unset: the contract's shapes."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: Path | None = None
    kafka_ssl_certfile: Path | None = None
    kafka_ssl_keyfile: Path | None = None

    @model_validator(mode="after")
    def _check_security(self) -> Settings:
        protocol = self.kafka_security_protocol
        if protocol.startswith("SASL_"):
            missing = [
                f"kafka_sasl_{name}"
                for name in ("mechanism", "username", "password")
                if getattr(self, f"kafka_sasl_{name}") is None
            ]
            if missing:
                raise ValueError(
                    f"kafka_security_protocol={protocol} needs {', '.join(missing)} "
                    "(--kafka-sasl-mechanism, --kafka-sasl-username, --kafka-sasl-password)"
                )
        for name in ("cafile", "certfile", "keyfile"):
            path = getattr(self, f"kafka_ssl_{name}")
            if path is not None and not path.is_file():
                raise ValueError(f"kafka_ssl_{name}={str(path)!r} is not a readable file")
        return self

    @model_validator(mode="after")
    def _check_regression(self) -> Settings:
        known = set(metric_keys(self.ks))
        unknown = [m for m in self.regression_metrics if m not in known]
        if unknown:
            raise ValueError(
                f"regression_metrics {unknown} are not computed; with ks={list(self.ks)} "
                f"choose from {sorted(known)}"
            )
        return self

    @model_validator(mode="after")
    def _check_core(self) -> Settings:
        # the core's configs check their own settings (the detector's): build them once
        try:
            monitor_config(self)
        except ValueError as error:
            message = str(error)
            setting = DETECTOR_SETTINGS.get(message.split(" ", 1)[0])
            if setting is None:
                raise
            raise PydanticCustomError(
                "core_config", "{message}", {"message": message, "setting": setting}
            ) from None
        return self

    @property
    def early_topic(self) -> str:
        """Where the early windows go (``EARLY_WINDOWS_TOPIC``, or the windows topic's)."""
        return self.early_windows_topic or f"{self.windows_topic}.early"

    @property
    def watched_metrics(self) -> tuple[str, ...]:
        """The detector's metric keys (the setting, or the default set)."""
        if self.regression_metrics:
            return self.regression_metrics
        c = self.context_size
        wanted = (f"recall@{c}", f"hit_rate@{c}", "mrr", "ndcg@10")
        known = set(metric_keys(self.ks))
        return tuple(m for m in wanted if m in known)

    def kafka_client_config(self) -> dict[str, Any]:
        """Connection and security settings in kafka-python's names (secrets unwrapped here)."""
        config: dict[str, Any] = {
            "bootstrap_servers": self.kafka_bootstrap_servers.split(","),
            "security_protocol": self.kafka_security_protocol,
            # kafka-python backs off reconnects exponentially up to 30 s: after a 20 s
            # outage its next try could come 25 s after the broker was back. The Java
            # client's default, 1 s, keeps the resume after an outage short.
            "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
        }
        if self.kafka_sasl_mechanism is not None:
            config["sasl_mechanism"] = self.kafka_sasl_mechanism
        if self.kafka_sasl_username is not None:
            config["sasl_plain_username"] = self.kafka_sasl_username
        if self.kafka_sasl_password is not None:
            config["sasl_plain_password"] = self.kafka_sasl_password.get_secret_value()
        for name in ("cafile", "certfile", "keyfile"):
            path = getattr(self, f"kafka_ssl_{name}")
            if path is not None:
                config[f"ssl_{name}"] = str(path)
        return config


def monitor_config(settings: Settings) -> MonitorConfig:
    """The core's parameters from the service settings (the detector's spans in whole
    windows; it checks its own parameters, ValueError naming the field)."""
    window = settings.window_ms
    join = JoinConfig(
        attribution_ms=settings.attribution_window_ms,
        clock_skew_ms=settings.clock_skew_ms,
        window_ms=window,
        max_out_of_orderness_ms=settings.max_out_of_orderness_ms,
        idle_timeout_ms=settings.idle_timeout_ms,
        early_ms=settings.regression_label_age_ms,
    )
    pipeline = PipelineConfig(
        join=join,
        ks=settings.ks,
        max_future_skew_ms=settings.max_future_skew_ms,
        max_pending_queries=settings.max_pending_queries,
        max_pending_feedback=settings.max_pending_feedback,
        max_label_values=settings.max_label_values,
        rolling_ms=settings.rolling_windows_ms,
        audit=AuditConfig(settings.audit_rate, settings.audit_window_ms, settings.audit_judge),
    )
    detector = DetectorConfig(
        metrics=settings.watched_metrics,
        window_ms=window,  # (its spans are checked against it; MonitorConfig fits the rest)
        candidate_ms=whole_windows(settings.regression_candidate_ms, window),
        baseline_ms=whole_windows(settings.regression_baseline_ms, window),
        deploy_watch_ms=whole_windows(settings.regression_deploy_watch_ms, window),
        no_history_watch_ms=whole_windows(settings.regression_no_history_watch_ms, window),
        no_history_span_ms=whole_windows(settings.regression_no_history_span_ms, window),
        baseline_days=settings.regression_baseline_days,
        min_labelled=settings.regression_min_labelled,
        min_effect=settings.regression_min_effect,
        alpha=settings.regression_alpha,
        tau=settings.regression_tau,
        drift_budget=settings.regression_drift_budget,
        label_shift_budget=settings.regression_label_shift_budget,
        drift_period_ms=whole_windows(settings.regression_drift_period_ms, window),
        close_after_ms=whole_windows(settings.regression_close_after_ms, window),
    )
    return MonitorConfig(
        pipeline=pipeline, detector=detector, progress_stall_ms=settings.progress_stall_ms
    )


def setting_name(field: str) -> str:
    """The setting (flag, env var) of a :class:`Settings` attribute: ``window_ms`` -> ``window``."""
    alias = Settings.model_fields[field].validation_alias
    if isinstance(alias, str):
        return alias.removeprefix(ENV_PREFIX).lower()
    return field


SETTINGS = {setting_name(field): field for field in Settings.model_fields}
"""Every setting's name (as in the contract, the flags and the env) -> its attribute."""


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--name-with-dashes`` flag per setting; unset flags fall back to env, then defaults."""
    group = parser.add_argument_group(
        "settings", f"each flag is also an env var {ENV_PREFIX}<NAME>; flags win over env"
    )
    for name, attribute in SETTINGS.items():
        default = Settings.model_fields[attribute].default
        shown = "unset" if default is None else _show_default(name, default)
        group.add_argument(
            "--" + name.replace("_", "-"),
            dest=f"setting_{name}",
            default=None,
            metavar=name.upper(),
            help=f"(default: {shown})",
        )


def _show_default(name: str, default: object) -> str:
    if name in {"ks"} and isinstance(default, tuple):
        return ",".join(str(v) for v in default)
    return str(default)


def settings_from_args(
    args: argparse.Namespace, overrides: Mapping[str, Any] | None = None
) -> Settings:
    """Build the settings from parsed flags (given ones only), the environment and defaults."""
    given = {
        key.removeprefix("setting_"): value
        for key, value in vars(args).items()
        if key.startswith("setting_") and value is not None
    }
    return load_settings({**(overrides or {}), **given})


def load_settings(values: Mapping[str, Any] | None = None) -> Settings:
    """Settings from explicit values over env over defaults; ConfigError names each bad one."""
    given = {_input_key(name): value for name, value in (values or {}).items()}
    try:
        return Settings(**given)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            ctx = item.get("ctx") or {}
            if item["type"] == "core_config":
                name = str(ctx["setting"])
            else:
                name = ".".join(_setting_of_key(str(p)) for p in item["loc"])
            flag = "--" + name.replace("_", "-")
            problems.append(f"{flag} ({ENV_PREFIX}{name.upper()}): {item['msg']}")
        raise ConfigError("invalid settings: " + "; ".join(problems)) from None


def _input_key(name: str) -> str:
    """The key :class:`Settings` takes a setting's value by (a duration's: its alias)."""
    field = SETTINGS.get(name)
    alias = None if field is None else Settings.model_fields[field].validation_alias
    return alias if isinstance(alias, str) else name


def _setting_of_key(key: str) -> str:
    """The setting named by an input key (an alias such as ``RETRIEVAL_MONITOR_WINDOW``)."""
    return key.removeprefix(ENV_PREFIX).lower() if key.startswith(ENV_PREFIX) else key
