"""``replay``: the streaming core over JSONL event files, in file order, as partition 0.

A line is ``{"topic": "queries" | "feedback", "event": {...}}``. The line is validated
in one pass (a tagged union keyed by ``topic``); a bad line is reported with its file
and line number, counted, and skipped, and the lines around it are processed. There is
no wall-clock idleness in a replay: the watermark follows event time only, and at the
end of the input everything pending is finalised.

The package, by concern: :mod:`~service.replay.lines` (a line decoded, a file read in
chunks), :mod:`~service.replay.feed` (the chunks and lines fed to the pipeline in
batches, advancing as they fill), :mod:`~service.replay.batch` (a batch's events, their
places in the input and its bad lines reported in order) and
:mod:`~service.replay.reader` (the reader process that reads and decodes the files
while this process joins).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, TextIO

from service.audit.sample import sample_threshold
from service.core.monitor import Monitor, MonitorConfig
from service.replay.batch import Batch, ReplayReport
from service.replay.feed import Feed
from service.replay.lines import FeedbackLine, QueryLine, decode_line, decode_mapped_line
from service.replay.reader import reader_allowed
from service.stream.audit_join import AuditRequest
from service.stream.mined import LabelRecorder
from service.stream.topics import Topic
from service.stream.windows import ClosedWindow
from service.times import wall_ms

if TYPE_CHECKING:  # (the mapping's models are built only when a mapping is used)
    from service.mapping.mapper import Mapper

__all__ = ["ReplayReport", "replay"]


def replay(
    paths: Iterable[str],
    config: MonitorConfig,
    on_windows: Callable[[list[ClosedWindow]], None],
    *,
    now_ms: Callable[[], int] | None = None,
    errors_to: TextIO | None = None,
    max_errors_shown: int = 20,
    mapper: Mapper | None = None,
    labels: LabelRecorder | None = None,
    reader: bool | None = None,
    audit_requests: list[AuditRequest] | None = None,
) -> tuple[Monitor, ReplayReport]:
    """Run the pipeline over the files; ``on_windows`` receives each batch of closed windows.

    Bad lines are reported to ``errors_to`` (default: stderr) with file and line number.
    With ``mapper``, each line's ``event`` is a user's record read through it. With
    ``labels``, each window carries the labels output of its queries. ``reader``: read
    and decode the files in a second process (``replay.reader``); by default when the
    machine lets this process use two cores, and without ``mapper`` and ``labels``
    (which read the whole events). The results are the same either way.
    ``audit_requests``: the audit sample's requests are appended to it as they are made.
    """
    errors_to = errors_to if errors_to is not None else sys.stderr
    clock = now_ms or wall_ms
    core = config.pipeline
    no_idleness = replace(core, join=replace(core.join, idle_timeout_ms=None))
    monitor = Monitor(replace(config, pipeline=no_idleness), clock, keep_opened=None)
    pipeline = monitor.pipeline
    pipeline.recorder = labels
    pipeline.assign(0)
    if audit_requests is not None:
        pipeline.keep_audit_requests(audit_requests)
    report = ReplayReport()

    def emit(windows: list[ClosedWindow]) -> None:
        if windows:
            on_windows(windows)
            report.windows += len(windows)
        pipeline.deliver(windows)  # (and the early windows made with them)

    decode: Callable[[bytes], QueryLine | FeedbackLine | Topic] = decode_line
    if mapper is not None:
        decode = partial(decode_mapped_line, mapper=mapper)
    if reader is None:
        reader = reader_allowed()
    reader = reader and mapper is None and labels is None
    pending = Batch(pipeline, report, errors_to, max_errors_shown)
    audit = pipeline.config.audit
    threshold = sample_threshold(audit.rate) if audit.rate > 0 else 0
    feed = Feed(pending, decode, emit, pipeline.config.labels.grade, threshold)
    paths = list(paths)
    try:
        if reader:
            feed.from_reader(paths)
        else:
            for path in paths:
                feed.read(path, whole_chunks=mapper is None)
    except BaseException:
        pending.abandon()  # the bad lines read before the error that stops the replay
        raise
    pending.flush()
    emit(pipeline.finish())
    if report.invalid > max_errors_shown:
        print(f"... {report.invalid - max_errors_shown} more bad lines skipped", file=errors_to)
    return monitor, report
