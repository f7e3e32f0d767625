"""Paths into users' records: dotted paths with list steps, and JSON pointers."""

from __future__ import annotations

import pytest

from service.mapping.paths import AbsentError, Path, PathError, WrongTypeError

RECORD = {
    "search": {"request_id": "r1", "tags": ["a", "b"]},
    "response": {"hits": [{"id": "d1", "score": 0.9}, {"id": "d2"}, {"id": 7}]},
    "labels": {"team.name": "kb", "a/b": 1, "m~n": 2, "0": "zero"},
}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("search.request_id", "r1"),
        ("search.tags[1]", "b"),
        ("response.hits[*].id", ["d1", "d2", 7]),
        ("response.hits[0].score", 0.9),
        ("/labels/team.name", "kb"),
        ("/labels/a~1b", 1),
        ("/labels/m~0n", 2),
        ("/labels/0", "zero"),
        ("/response/hits/1/id", "d2"),
        ("search", {"request_id": "r1", "tags": ["a", "b"]}),
    ],
)
def test_a_path_reads_its_value(path: str, value: object) -> None:
    assert Path(path).read(RECORD) == value


@pytest.mark.parametrize(
    ("path", "at"),
    [
        ("search.text", "search.text"),
        ("search.tags[5]", "search.tags[5]"),
        ("response.hits[*].score", "response.hits[1].score"),
        ("/labels/nope", "labels.nope"),
    ],
)
def test_an_absent_value_names_the_first_step_not_found(path: str, at: str) -> None:
    with pytest.raises(AbsentError) as raised:
        Path(path).read(RECORD)
    assert raised.value.at == at


@pytest.mark.parametrize(
    ("path", "at", "got"),
    [
        ("search.request_id.x", "search.request_id", "a string"),
        ("search.tags[*].x", "search.tags[0]", "a string"),
        ("search[0]", "search", "an object"),
        ("response.hits.id", "response.hits", "an array"),
    ],
)
def test_a_step_into_a_scalar_says_what_it_met(path: str, at: str, got: str) -> None:
    with pytest.raises(WrongTypeError) as raised:
        Path(path).read(RECORD)
    assert (raised.value.at, raised.value.got) == (at, got)


@pytest.mark.parametrize("path", ["", "a..b", "hits[x].id", "hits[*", "a.b]", "[0]"])
def test_a_malformed_path_is_refused_with_the_way_out(path: str) -> None:
    with pytest.raises(PathError) as raised:
        Path(path)
    assert path == "" or "JSON pointer" in str(raised.value)
