"""Input mappings: identity by default, three foreign shapes equal to the contract's, and
bad records named by their path."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings

from service.core.monitor import MonitorConfig
from service.errors import ConfigError, EventError
from service.mapping.mapper import Mapper
from service.mapping.spec import InputMapping, load_mapping, parse_mapping
from service.replay import replay
from service.sim.simulator import SimEvent, SimulationConfig, generate, write_jsonl
from service.stream.events import feedback_from, query_from
from service.stream.topics import FEEDBACK
from service.stream.windows import ClosedWindow
from service.times import HOUR_MS
from tests import foreign_shapes as shapes
from tests.unit.stream.test_events_decoder import _outcome, feedbacks, queries

IDENTITY = Mapper(InputMapping())


def _ids_as_text(obj: Any) -> Any:
    """What the mapping does to ids logged as integers (UBI's object_id may be one)."""
    if not isinstance(obj, dict):
        return obj
    out = dict(obj)
    for name in ("query_id", "chunk_id", "retriever", "segment"):
        if type(out.get(name)) is int:
            out[name] = str(out[name])
    if isinstance(out.get("results"), list):
        out["results"] = [str(r) if type(r) is int else r for r in out["results"]]
    return out


@settings(max_examples=1500, deadline=None)
@given(queries())
def test_the_identity_mapping_reads_query_events_as_the_contract(event: Any) -> None:
    assert _outcome(IDENTITY.query, event) == _outcome(query_from, _ids_as_text(event))


@settings(max_examples=1500, deadline=None)
@given(feedbacks())
def test_the_identity_mapping_reads_feedback_events_as_the_contract(event: Any) -> None:
    assert _outcome(IDENTITY.feedback, event) == _outcome(feedback_from, _ids_as_text(event))


# -- three foreign shapes, replayed, equal the contract's events --------------------------


@pytest.fixture(scope="module")
def day() -> list[SimEvent]:
    return list(generate(SimulationConfig(seed=11, duration_ms=3 * HOUR_MS, queries_per_hour=1200)))


def _replay(
    events: list[SimEvent], tmp: Path, mapping: InputMapping | None = None
) -> tuple[dict[str, ClosedWindow], Any, Any]:
    path = tmp / f"{id(events)}.jsonl"
    write_jsonl(events, path)
    out: list[ClosedWindow] = []
    mapper = Mapper(mapping) if mapping is not None else None
    monitor, report = replay(
        [str(path)], MonitorConfig(), out.extend, mapper=mapper, errors_to=io.StringIO()
    )
    return {w.key: w for w in out}, report, monitor.pipeline.counts


SHAPES = {
    "ubi": (shapes.to_ubi, lambda: load_mapping("ubi")),
    "search-log": (
        shapes.to_search_log,
        lambda: parse_mapping(yaml.safe_load(shapes.SEARCH_LOG_MAPPING), "t"),
    ),
    "epoch-ms": (
        shapes.to_epoch_ms,
        lambda: parse_mapping(json.loads(shapes.EPOCH_MS_MAPPING), "t"),
    ),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_foreign_shape_replays_to_the_windows_of_the_same_events(
    shape: str, day: list[SimEvent], tmp_path: Path
) -> None:
    convert, mapping = SHAPES[shape]
    foreign, same = convert(day)
    expected, plain, _ = _replay(same, tmp_path)
    got, report, counts = _replay(foreign, tmp_path, mapping())
    assert plain.invalid == report.invalid == 0
    assert len(expected) > 30
    assert got == expected
    skipped = len(foreign) - len(same)
    assert report.ignored == skipped == counts.ignored[FEEDBACK]
    assert skipped > 0 or shape == "epoch-ms"
    assert sum(counts.events.values()) == len(same)  # skipped records are not events


def test_a_mapping_file_is_read_as_yaml_or_json(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(shapes.SEARCH_LOG_MAPPING)
    (tmp_path / "m.json").write_text(shapes.EPOCH_MS_MAPPING)
    yaml_mapping = load_mapping(str(tmp_path / "m.yaml"))
    json_mapping = load_mapping(str(tmp_path / "m.json"))
    assert yaml_mapping is not None
    assert yaml_mapping.queries.results.path == "response.hits[*].id"
    assert json_mapping is not None
    assert json_mapping.feedback.timestamp.format == "epoch_millis"
    assert load_mapping(None) is None
    assert load_mapping("") is None


@pytest.mark.parametrize(
    ("document", "says"),
    [
        (
            {"queries": {"retriever": {"path": "a", "const": "b"}}},
            "queries.retriever: give exactly one",
        ),
        ({"queries": {"results": "hits[x].id"}}, "queries.results: path 'hits[x].id'"),
        ({"queries": {"query_idd": "id"}}, "queries.query_idd: Extra inputs are not permitted"),
        ({"feedback": {"signal": None}}, "feedback.signal is required"),
        (
            {"feedback": {"timestamp": {"path": "t", "format": "epoch_nanos"}}},
            "feedback.timestamp.format",
        ),
        ({"extends": "ubj"}, "extends 'ubj', but the presets are ubi"),
        (["queries"], "expected an object"),
    ],
)
def test_a_bad_mapping_is_refused_naming_the_field(document: Any, says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_mapping(document, "m.yaml")
    assert "input mapping m.yaml: " in str(raised.value)
    assert says in str(raised.value)


def test_a_missing_or_malformed_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read it .* or a preset: ubi"):
        load_mapping(str(tmp_path / "nope.yaml"))
    (tmp_path / "bad.yaml").write_text("queries: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML or JSON"):
        load_mapping(str(tmp_path / "bad.yaml"))


def test_extends_changes_only_the_fields_named() -> None:
    mapping = parse_mapping(
        {"extends": "ubi", "queries": {"retriever": "query_attributes.experiment"}}, "m"
    )
    mapper = Mapper(mapping)
    record = {
        "query_id": "q1",
        "timestamp": "2026-12-02T08:00:00Z",
        "query_response_hit_ids": ["a", "b"],
        "query_attributes": {"experiment": "ltr-b"},
    }
    event = mapper.query(record)
    assert event is not None
    assert (event.retriever, event.segment, event.chunk_ids()) == ("ltr-b", "default", ["a", "b"])


# -- bad records: counted like any other, the path named ---------------------------------

UBI = Mapper(load_mapping("ubi"))  # type: ignore[arg-type]
UBI_QUERY = {
    "query_id": "00112233-4455-6677-8899-aabbccddeeff",
    "timestamp": "2026-12-02T08:00:00.5+01:00",
    "user_query": "toner",
    "query_response_hit_ids": ["B07XLFYN6S", "B013UFPODY"],
    "query_attributes": {"retriever": "bm25-v2"},
    "application": "primary-search",
}


@pytest.mark.parametrize(
    ("change", "reason", "says"),
    [
        ({"query_attributes": {}}, "missing_retriever", "nothing at 'query_attributes.retriever'"),
        ({"query_attributes": "bm25"}, "invalid_retriever", "'query_attributes' is a string"),
        (
            {"query_response_hit_ids": "B07"},
            "invalid_results",
            "mapped from path 'query_response_hit_ids'",
        ),
        ({"timestamp": "2026-12-02T08:00:61Z"}, "invalid_timestamp", "field 'timestamp'"),
        ({"query_id": None}, "invalid_query_id", "field 'query_id'"),
    ],
)
def test_a_bad_ubi_query_names_the_field_and_path(
    change: dict[str, Any], reason: str, says: str
) -> None:
    with pytest.raises(EventError) as raised:
        UBI.query({**UBI_QUERY, **change})
    assert raised.value.reason == reason
    assert says in str(raised.value)


def test_ubi_records_map_as_the_preset_says() -> None:
    naive = UBI.query({**UBI_QUERY, "timestamp": "2026-12-02T07:00:00.5"})  # read as UTC
    assert naive is not None
    assert naive.timestamp_ms == UBI.query(UBI_QUERY).timestamp_ms  # type: ignore[union-attr]
    event = UBI.query(UBI_QUERY)
    assert event is not None
    assert (event.query_id, event.timestamp_ms % 1000, event.retriever, event.segment) == (
        UBI_QUERY["query_id"],
        500,
        "bm25-v2",
        "primary-search",
    )
    assert (
        UBI.query({k: v for k, v in UBI_QUERY.items() if k != "application"}).segment == "default"
    )  # type: ignore[union-attr]
    click = {
        "action_name": "click",
        "query_id": UBI_QUERY["query_id"],
        "timestamp": "2026-12-02T08:00:03Z",
        "event_attributes": {"object": {"object_id": 1234}, "position": {"ordinal": {"index": 2}}},
    }
    feedback = UBI.feedback(click)
    assert feedback is not None
    assert (feedback.chunk_id, feedback.signal, feedback.grade, feedback.dwell_ms) == (
        "1234",
        "click",
        None,
        None,
    )
    for action in ("impression", "add_to_cart", "view"):
        assert UBI.feedback({**click, "action_name": action}) is None
    with pytest.raises(EventError, match=r"nothing at 'event_attributes\.object'"):
        UBI.feedback({**click, "event_attributes": {"position": {"ordinal": {"index": 2}}}})


def test_epoch_millis_and_naive_utc_times() -> None:
    mapping = parse_mapping(
        {
            "queries": {"timestamp": {"path": "ts", "format": "epoch_millis"}},
            "feedback": {"timestamp": {"path": "ts", "naive": "utc"}},
        },
        "m",
    )
    mapper = Mapper(mapping)
    base = {"query_id": "q", "retriever": "r", "results": []}
    for ts in (1796198400123, "1796198400123", 1796198400123.0):
        event = mapper.query({**base, "ts": ts})
        assert event is not None
        assert event.timestamp_ms == 1796198400123
    with pytest.raises(EventError, match=r"expected epoch milliseconds .* got a string"):
        mapper.query({**base, "ts": "yesterday"})
    click = {"query_id": "q", "chunk_id": "c", "signal": "click"}
    naive = mapper.feedback({**click, "ts": "2026-12-02T08:00:00.250"})
    aware = mapper.feedback({**click, "ts": "2026-12-02T09:00:00.250+01:00"})
    assert naive is not None
    assert aware is not None
    assert naive.timestamp_ms == aware.timestamp_ms


def test_records_that_are_not_json_objects_are_bad_records() -> None:
    with pytest.raises(EventError) as raised:
        UBI.decode_query(b"[1, 2]")
    assert raised.value.reason == "not_an_object"
    with pytest.raises(EventError) as raised:
        UBI.decode_feedback(b"{nope")
    assert raised.value.reason == "invalid_json"


def test_a_naive_time_is_refused_unless_the_mapping_says_utc() -> None:
    mapper = Mapper(parse_mapping({"queries": {"timestamp": "ts"}}, "m"))
    record = {"query_id": "q", "retriever": "r", "results": [], "ts": "2026-12-02T08:00:00"}
    with pytest.raises(EventError) as raised:
        mapper.query(record)
    assert raised.value.reason == "naive_timestamp"
    assert "(mapped from path 'ts')" in str(raised.value)
    assert "naive: utc on the mapping" in str(raised.value)
