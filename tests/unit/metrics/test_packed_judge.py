"""``judge_packed`` (the streaming core's vectorised join) against ``judge_batch`` (the
list-based join that trec_eval checks): the same JudgedBatch, field by field."""

from __future__ import annotations

from array import array
from dataclasses import fields

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.metrics.ir import DEFAULT_KS, JudgedBatch, compute_metrics, judge_batch
from service.metrics.packed import judge_packed

# hashes of chunk ids: a few, so rankings repeat them and labels hit and miss; the
# extremes of int64 included (Python's hash() spans all of it)
CHUNKS = [0, 1, -1, 7, 2**63 - 1, -(2**63), 123456789012345, -98765, 42, 5]

query = st.tuples(
    st.lists(st.sampled_from(CHUNKS), max_size=25),  # results, repeats allowed
    st.one_of(st.none(), st.dictionaries(st.sampled_from(CHUNKS), st.integers(0, 3), max_size=8)),
    st.integers(-1, 30),  # context_k (-1: none logged)
)


def assert_same(got: JudgedBatch, want: JudgedBatch) -> None:
    for f in fields(JudgedBatch):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype, f.name
            np.testing.assert_array_equal(a, b, err_msg=f.name)
        else:
            assert a == b, f.name


@settings(max_examples=400, deadline=None)
@given(st.lists(query, max_size=30), st.sampled_from([1, 2, 3, 20, 1000]))
def test_equals_the_list_join(
    queries: list[tuple[list[int], dict[int, int] | None, int]], depth: int
) -> None:
    packed = [array("q", results).tobytes() for results, _, _ in queries]
    labels = [grades for _, grades, _ in queries]
    ks = [k for _, _, k in queries]
    got = judge_packed(packed, labels, ks, ideal_depth=depth)
    want = judge_batch(
        [results for results, _, _ in queries],
        [grades or {} for grades in labels],
        [None if k < 0 else k for k in ks],
        ideal_depth=depth,
    )
    assert_same(got, want)
    # the same rankings after a 12-byte header of something else (the join's layout)
    headed = [b"\x07" * 12 + ranking for ranking in packed]
    assert_same(judge_packed(headed, labels, ks, ideal_depth=depth, skip=12), want)
    ks_within = [k for k in DEFAULT_KS if k <= depth]
    for key, values in compute_metrics(got, ks_within).items():
        np.testing.assert_array_equal(values, compute_metrics(want, ks_within)[key], key)


def test_a_worked_batch() -> None:
    # query 0: chunk 7 at ranks 1 and 3 (first counts), 5 not retrieved, 1 judged 0
    # query 1: no labels; query 2: labelled, nothing retrieved
    batch = judge_packed(
        [array("q", [7, 1, 7, 9]).tobytes(), array("q", [7]).tobytes(), b""],
        [{7: 2, 5: 3, 1: 0}, None, {4: 1}],
        [-1, 2, 0],
    )
    assert batch.n_relevant.tolist() == [2, 0, 1]
    assert (batch.hit_query.tolist(), batch.hit_rank.tolist()) == ([0], [0])
    assert batch.hit_gain.tolist() == [2.0]
    assert batch.ideal_query.tolist() == [0, 0, 2]
    assert batch.ideal_pos.tolist() == [0, 1, 0]
    assert batch.ideal_gain.tolist() == [3.0, 2.0, 1.0]
    assert batch.context_k.tolist() == [-1, 2, 0]


def test_lengths_must_agree() -> None:
    with pytest.raises(ValueError, match="2 rankings, 1 label sets"):
        judge_packed([b"", b""], [None], [0, 0])
