"""Settings: one frozen object, from flags (`--name-with-dashes`) and `RETRIEVAL_MONITOR_*` env.

Flags win over the environment, which wins over the defaults. Durations accept ``90s``,
``5m``, ``1h``, ``2d`` or a number of seconds and are held as integer milliseconds
(field names end in ``_ms`` internally only through the properties below; the setting
names stay those of the contract).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.errors import ConfigError
from service.metrics.ir import metric_keys, validate_ks
from service.times import parse_duration_ms

ENV_PREFIX = "RETRIEVAL_MONITOR_"
RECONNECT_BACKOFF_MAX_MS = 1_000
"""The longest pause between reconnect attempts to a broker that went away."""


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
    deadletter_topic: str = "retrieval.deadletter"
    group_id: str = "retrieval-monitor"
    http_host: str = "127.0.0.1"
    http_port: int = Field(8000, ge=0, le=65535)
    ks: Annotated[tuple[int, ...], NoDecode, BeforeValidator(_ks)] = (1, 3, 5, 10, 20)
    attribution_window: Duration = "30m"  # type: ignore[assignment]
    clock_skew: Duration = "5s"  # type: ignore[assignment]
    max_out_of_orderness: Duration = "60s"  # type: ignore[assignment]
    idle_timeout: PositiveDuration = "30s"  # type: ignore[assignment]
    max_future_skew: Duration = "5m"  # type: ignore[assignment]
    window: PositiveDuration = "5m"  # type: ignore[assignment]
    rolling_windows: Annotated[tuple[int, ...], NoDecode, BeforeValidator(_durations)] = (
        "15m,1h,24h"  # type: ignore[assignment]
    )
    max_pending_queries: int = Field(1_000_000, ge=1)
    max_pending_feedback: int = Field(1_000_000, ge=1)
    max_label_values: int = Field(50, ge=1)
    context_size: int = Field(5, ge=1)
    """How many results reach the model; the detector watches recall and hit rate at it."""
    regression_metrics: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_names)] = ()
    """Metric keys the detector watches; empty: recall@C, hit_rate@C, mrr, ndcg@10 (C =
    context_size), keeping those whose cutoff is in ``ks``."""
    regression_candidate: PositiveDuration = "1h"  # type: ignore[assignment]
    regression_baseline: PositiveDuration = "24h"  # type: ignore[assignment]
    regression_deploy_watch: PositiveDuration = "24h"  # type: ignore[assignment]
    regression_no_history_watch: PositiveDuration = "2h"  # type: ignore[assignment]
    regression_min_labelled: int = Field(200, ge=2)
    regression_min_effect: float = Field(0.02, ge=0.0, lt=1.0)
    regression_alpha: float = Field(0.01, gt=0.0, lt=1.0)
    regression_tau: float = Field(0.05, gt=0.0, lt=1.0)
    regression_drift_budget: float = Field(0.5, gt=0.0, le=100.0)
    regression_drift_period: PositiveDuration = "6h"  # type: ignore[assignment]
    regression_close_after: PositiveDuration = "1h"  # type: ignore[assignment]
    shutdown_grace: Duration = "0s"  # type: ignore[assignment]
    """After a clean stop (SIGTERM) has handed the partitions over, keep serving /metrics
    this long (``/readyz`` answers 503 "stopped") so that a last scrape sees the final
    counts; set it to the Prometheus scrape interval when every count matters."""
    session_timeout: PositiveDuration = "45s"  # type: ignore[assignment]
    """A crashed replica's partitions move to the others after this long."""
    exactly_once: bool = True
    """Publish windows and commit offsets in one Kafka transaction (else: at least once)."""
    transactional_id: str | None = None
    """Stable per replica, so a restarted process fences its crashed predecessor at once;
    default ``<group_id>-<hostname>-<http_port>``."""
    commit_interval: PositiveDuration = "5s"  # type: ignore[assignment]
    progress_stall: PositiveDuration = "15m"  # type: ignore[assignment]
    """Global view: an input partition whose committed progress has not moved for this long
    (wall clock) while others moved is left out of the detector's boundary (unowned, stuck)."""
    poll_timeout: PositiveDuration = "200ms"  # type: ignore[assignment]
    max_poll_records: int = Field(2000, ge=1)
    max_topic_lead: Duration = "10m"  # type: ignore[assignment]
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


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--name-with-dashes`` flag per setting; unset flags fall back to env, then defaults."""
    group = parser.add_argument_group(
        "settings", f"each flag is also an env var {ENV_PREFIX}<NAME>; flags win over env"
    )
    for name, field in Settings.model_fields.items():
        default = field.default
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
    try:
        return Settings(**dict(values or {}))
    except ValidationError as error:
        problems = []
        for item in error.errors():
            name = ".".join(str(p) for p in item["loc"])
            flag = "--" + name.replace("_", "-")
            problems.append(f"{flag} ({ENV_PREFIX}{name.upper()}): {item['msg']}")
        raise ConfigError("invalid settings: " + "; ".join(problems)) from None
