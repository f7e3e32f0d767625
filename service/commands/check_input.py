"""The ``check-input`` command: read a sample (files or Kafka) and report how it maps."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from service.config import Settings
from service.errors import ConfigError
from service.mapping.check import InputCheck, check_records
from service.mapping.spec import load_mapping
from service.offline.files import jsonl_lines
from service.replay.lines import LineError, split_line
from service.stream.topics import Topic


def file_records(paths: list[str]) -> Iterator[tuple[Topic | None, str, Any]]:
    """The lines of the files: replay-format lines (``{"topic", "event"}``) give their
    topic and event; any other line is a record of unknown topic."""
    for path, number, raw in jsonl_lines(paths):
        try:
            topic, event = split_line(raw)
        except LineError:
            yield None, f"{path}:{number}", raw  # one of the user's records, as it is
        else:
            yield topic, f"{path}:{number}", event


def check_input(settings: Settings, files: list[str], kafka: bool, sample: int) -> InputCheck:
    """Read the sample and map it."""
    mapping = load_mapping(settings.input_mapping)
    if kafka == bool(files):
        raise ConfigError("check-input reads either --kafka or FILE...: give one of them")
    if kafka:
        from service.broker.sample import kafka_records  # noqa: PLC0415 - Kafka

        return check_records(kafka_records(settings, sample), mapping, sample)
    return check_records(file_records(files), mapping, sample)
