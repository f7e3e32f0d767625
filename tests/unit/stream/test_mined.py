"""The labels output's recorder inside the pipeline: the records of labelled queries, the
chunk ids of labels outside the results, what is forgotten, and that the window views
never keep the records."""

from __future__ import annotations

from collections.abc import Sequence

from service.stream.events import feedback_from, query_from
from service.stream.join_state import JoinConfig
from service.stream.mined import LabelRecorder
from service.stream.pipeline import Pipeline, PipelineConfig
from service.stream.windows import ClosedWindow
from service.times import rfc3339_millis

T0 = 1_796_083_200_000
MIN = 60_000
CONFIG = PipelineConfig(
    join=JoinConfig(attribution_ms=10 * MIN, clock_skew_ms=5_000, window_ms=5 * MIN,
                    max_out_of_orderness_ms=0, idle_timeout_ms=None),
    ks=(1, 3),
)  # fmt: skip


class Keep:
    def __init__(self) -> None:
        self.windows: list[ClosedWindow] = []

    def add(self, windows: Sequence[ClosedWindow]) -> None:
        self.windows.extend(windows)

    def add_early(self, windows: Sequence[ClosedWindow]) -> None:
        pass

    def advance(self, closed_through_ms: int) -> None:
        pass


def query(pipeline: Pipeline, offset: int, query_id: str, ts: int, results: list[str]) -> None:
    body = {"query_id": query_id, "timestamp": rfc3339_millis(ts), "retriever": "r",
            "results": results, "segment": "kb"}  # fmt: skip
    assert pipeline.query(0, offset, query_from(body)) is None


def signal(pipeline: Pipeline, offset: int, query_id: str, ts: int, chunk: str, kind: str,
           grade: int | None = None) -> None:  # fmt: skip
    body = {"query_id": query_id, "timestamp": rfc3339_millis(ts), "chunk_id": chunk,
            "signal": kind, **({"grade": grade} if grade is not None else {})}  # fmt: skip
    assert pipeline.feedback(0, offset, feedback_from(body)) is None


def test_labelled_queries_become_records_and_views_never_keep_them() -> None:
    recorder = LabelRecorder()
    keep = Keep()
    pipeline = Pipeline(CONFIG, lambda: T0 + 86_400_000, sinks=[keep], recorder=recorder)
    pipeline.assign(0)
    query(pipeline, 0, "q1", T0, ["a", "b", "c"])
    signal(pipeline, 0, "q1", T0 + 1000, "b", "click")
    signal(pipeline, 1, "q1", T0 + 2000, "z", "citation")  # relevant, not retrieved
    signal(pipeline, 2, "q2", T0 + 2500, "y", "click")  # arrives before its query
    query(pipeline, 1, "q2", T0 + 3000, ["x"])
    query(pipeline, 2, "q3", T0 + 4000, ["a"])  # no feedback: unlabelled
    signal(pipeline, 3, "q3", T0 + 5000, "a", "judgment", grade=0)  # judged not relevant
    signal(pipeline, 4, "ghost", T0 + 6000, "a", "click")  # its query never comes
    later = T0 + 120 * MIN  # moves the watermark past the window and the ghost's use
    query(pipeline, 3, "q9", later, ["a"])
    signal(pipeline, 5, "q9", later, "a", "click")
    windows = pipeline.advance()
    [window] = windows
    assert (window.queries, window.labelled) == (3, 2)
    assert [r["query_id"] for r in window.labels] == ["q1", "q2"]
    first = window.labels[0]
    assert first == {
        "query_id": "q1",
        "timestamp": rfc3339_millis(T0),
        "retriever": "r",
        "segment": "kb",
        "results": ["a", "b", "c"],
        "labels": {"b": 1, "z": 2},
    }
    assert window.labels[1]["labels"] == {"y": 1}
    pipeline.deliver(windows)
    assert keep.windows == windows  # the same windows (labels take no part in equality)
    assert keep.windows[0].labels == ()  # but the views never hold the records
    assert set(recorder.queries) == {b"q9"}  # still pending
    assert set(recorder.names) == {b"q9"}  # the ghost's chunk names expired with the watermark


def test_without_a_recorder_windows_carry_no_labels() -> None:
    pipeline = Pipeline(CONFIG, lambda: T0 + 86_400_000)
    pipeline.assign(0)
    query(pipeline, 0, "q1", T0, ["a"])
    signal(pipeline, 0, "q1", T0 + 1000, "a", "click")
    [window] = pipeline.finish()
    assert window.labelled == 1
    assert window.labels == ()


def test_query_text_is_kept_only_when_allowed() -> None:
    for allowed in (False, True):
        recorder = LabelRecorder(query_text=allowed)
        recorder.query(b"q", T0, ["a"], "my secret question")
        recorder.query(b"n", T0, ["a"], 42)  # not text: never kept
        records = recorder.finalised([b"q", b"n"], [{hash("a"): 1}, {hash("a"): 1}], ("r", "s", T0))
        assert [r.get("query") for r in records] == (
            ["my secret question", None] if allowed else [None, None]
        )
