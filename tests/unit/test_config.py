"""Settings: contract defaults, env and flags, durations, secrets."""

from __future__ import annotations

import argparse

import pytest

from service.config import (
    SETTINGS,
    Settings,
    add_settings_flags,
    load_settings,
    monitor_config,
    parse_duration_ms,
    settings_from_args,
)
from service.core.monitor import MonitorConfig
from service.errors import ConfigError


def test_defaults_are_the_contract_values_in_milliseconds() -> None:
    s = load_settings()
    assert s.kafka_bootstrap_servers == "127.0.0.1:9092"
    assert (s.queries_topic, s.feedback_topic) == ("retrieval.queries", "retrieval.feedback")
    assert (s.windows_topic, s.deadletter_topic) == ("retrieval.windows", "retrieval.deadletter")
    assert s.group_id == "retrieval-monitor"
    assert (s.http_host, s.http_port) == ("127.0.0.1", 8000)
    assert s.ks == (1, 3, 5, 10, 20)
    assert s.attribution_window_ms == 30 * 60_000
    assert s.clock_skew_ms == 5_000
    assert s.max_out_of_orderness_ms == 60_000
    assert s.idle_timeout_ms == 30_000
    assert s.max_future_skew_ms == 5 * 60_000
    assert s.window_ms == 5 * 60_000
    assert s.rolling_windows_ms == (15 * 60_000, 3_600_000, 86_400_000)
    assert (s.max_pending_queries, s.max_pending_feedback, s.max_label_values) == (
        1_000_000,
        1_000_000,
        50,
    )
    assert s.kafka_security_protocol == "PLAINTEXT"
    assert s.kafka_sasl_password is None


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("90s", 90_000),
        ("5m", 300_000),
        ("1h", 3_600_000),
        ("2d", 172_800_000),
        ("30", 30_000),
        (" 1.5s ", 1_500),
        ("250ms", 250),
        (12, 12_000),
    ],
)
def test_durations(text: str | int, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "5 minutes", "-1s", "1w", True])
def test_bad_durations_are_rejected(text: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration_ms(text)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_settings_flags(parser)
    return parser.parse_args(argv)


def test_env_is_read_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRIEVAL_MONITOR_WINDOW", "1m")
    monkeypatch.setenv("RETRIEVAL_MONITOR_KS", "1,5")
    monkeypatch.setenv("RETRIEVAL_MONITOR_GROUP_ID", "from-env")
    s = settings_from_args(_parse(["--group-id", "from-flag", "--rolling-windows", "10m,2h"]))
    assert s.window_ms == 60_000
    assert s.ks == (1, 5)
    assert s.group_id == "from-flag"
    assert s.rolling_windows_ms == (600_000, 7_200_000)


def test_bad_settings_name_the_flag_and_the_env_var() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"ks": "0,3", "window": "soon"})
    message = str(caught.value)
    assert "--ks (RETRIEVAL_MONITOR_KS)" in message
    assert "--window (RETRIEVAL_MONITOR_WINDOW)" in message


def test_password_is_secret_but_reaches_kafka_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRIEVAL_MONITOR_KAFKA_SASL_PASSWORD", "hunter2-secret")
    s = Settings(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="PLAIN",
        kafka_sasl_username="monitor",
    )
    assert "hunter2-secret" not in repr(s)
    assert "hunter2-secret" not in str(s.model_dump())
    client = s.kafka_client_config()
    assert client["sasl_plain_password"] == "hunter2-secret"
    assert client["sasl_mechanism"] == "PLAIN"
    assert client["security_protocol"] == "SASL_PLAINTEXT"


def test_sasl_needs_its_three_settings_and_tls_files_must_exist() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"kafka_security_protocol": "SASL_SSL", "kafka_sasl_username": "m"})
    message = str(caught.value)
    assert "kafka_sasl_mechanism, kafka_sasl_password" in message
    assert "kafka_sasl_username" not in message.split("needs")[1]
    with pytest.raises(ConfigError, match="not a readable file"):
        load_settings({"kafka_security_protocol": "SSL", "kafka_ssl_cafile": "/nonexistent/ca.pem"})
    # a bad password setting never echoes the password
    with pytest.raises(ConfigError) as caught:
        load_settings(
            {"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_password": "hunter2-x"}
        )
    assert "hunter2-x" not in str(caught.value)


def test_every_client_retries_a_lost_broker_every_second_at_most() -> None:
    """kafka-python's own default backs off to 30 s between reconnects, which would add
    up to 25 s to the resume after a 20 s outage (docs/reliability.md quotes the bound)."""
    assert Settings().kafka_client_config()["reconnect_backoff_max_ms"] == 1_000


def test_durations_are_held_in_ms_attributes_under_the_contracts_names() -> None:
    """``window_ms`` holds milliseconds; its flag and env var stay ``--window`` and
    ``RETRIEVAL_MONITOR_WINDOW`` (no ``_ms`` name is a setting)."""
    for attribute, field in Settings.model_fields.items():
        if attribute.endswith("_ms"):
            assert field.validation_alias == "RETRIEVAL_MONITOR_" + attribute[:-3].upper()
            assert SETTINGS[attribute[:-3]] == attribute
    assert not [name for name in SETTINGS if name.endswith("_ms")]
    flags = {a.option_strings[0] for a in _parser_actions() if a.option_strings}
    assert {"--window", "--attribution-window", "--regression-drift-period"} <= flags
    assert not [flag for flag in flags if flag.endswith("-ms")]


def _parser_actions() -> list[argparse.Action]:
    parser = argparse.ArgumentParser()
    add_settings_flags(parser)
    return parser._actions


def test_an_ms_name_is_not_read_from_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRIEVAL_MONITOR_WINDOW_MS", "1m")
    monkeypatch.setenv("WINDOW", "2m")
    assert load_settings().window_ms == 5 * 60_000


def test_the_default_settings_build_the_cores_default_config() -> None:
    """The core's configs own the defaults: the settings take theirs from them."""
    assert monitor_config(load_settings()) == MonitorConfig()


def test_the_detectors_own_checks_name_the_setting() -> None:
    cases = {
        "regression_alpha": 0.0,
        "regression_tau": 1.0,
        "regression_min_effect": -0.1,
        "regression_min_labelled": 1,
        "regression_baseline_days": 0,
        "regression_drift_budget": 101,
        "regression_drift_period": "2d",
        "regression_candidate": "0s",
    }
    for name, value in cases.items():
        with pytest.raises(ConfigError) as caught:
            load_settings({name: value})
        flag = "--" + name.replace("_", "-")
        assert f"{flag} (RETRIEVAL_MONITOR_{name.upper()})" in str(caught.value)
    assert load_settings({"regression_drift_budget": 100}).regression_drift_budget == 100
