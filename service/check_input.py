"""The ``check-input`` command: read a sample (files or Kafka) and report how it maps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from service.config import Settings
from service.errors import ConfigError, InputFileError
from service.mapping.check import InputCheck, check_records
from service.mapping.spec import load_mapping
from service.stream.topics import FEEDBACK, QUERIES, Topic


def file_records(paths: list[str], sample: int) -> Iterator[tuple[Topic, str, Any]]:
    """Replay-format lines (``{"topic", "event"}``): at most ``sample`` per topic."""
    taken = {QUERIES: 0, FEEDBACK: 0}
    for path in paths:
        try:
            handle = Path(path).open("rb")  # noqa: SIM115 - closed by the with below
        except OSError as error:
            raise InputFileError(path, 0, "(file)", f"cannot open: {error.strerror}") from None
        with handle:
            for number, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    line = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    line = None
                name = line.get("topic") if isinstance(line, dict) else None
                if name not in ("queries", "feedback") or "event" not in line:
                    raise InputFileError(
                        path,
                        number,
                        "topic",
                        'a line needs "topic": "queries" or "feedback" and an "event" object '
                        "(the replay format; --kafka reads the topics instead)",
                    )
                topic = QUERIES if name == "queries" else FEEDBACK
                if taken[topic] < sample:
                    taken[topic] += 1
                    yield topic, where, line["event"]
                if min(taken.values()) >= sample:
                    return


def check_input(settings: Settings, files: list[str], kafka: bool, sample: int) -> InputCheck:
    """Read the sample and map it."""
    mapping = load_mapping(settings.input_mapping)
    if kafka == bool(files):
        raise ConfigError("check-input reads either --kafka or FILE...: give one of them")
    if kafka:
        from service.broker.sample import kafka_records  # noqa: PLC0415 - Kafka

        return check_records(kafka_records(settings, sample), mapping)
    records = file_records(files, sample)
    return check_records(records, mapping)
