"""The ``check-input`` command: read a sample (files or Kafka) and report how it maps."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from service.config import Settings
from service.errors import ConfigError, InputFileError
from service.mapping.check import InputCheck, check_records
from service.mapping.spec import load_mapping
from service.offline.files import jsonl_lines
from service.replay import LineError, split_line
from service.stream.topics import FEEDBACK, QUERIES, Topic


def file_records(paths: list[str], sample: int) -> Iterator[tuple[Topic, str, Any]]:
    """Replay-format lines (``{"topic", "event"}``): at most ``sample`` per topic."""
    taken = {QUERIES: 0, FEEDBACK: 0}
    for path, number, raw in jsonl_lines(paths):
        try:
            topic, event = split_line(raw)
        except LineError as error:
            raise InputFileError(
                path, number, "topic", f"{error} (the replay format; --kafka reads the topics)"
            ) from None
        if taken[topic] < sample:
            taken[topic] += 1
            yield topic, f"{path}:{number}", event
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
