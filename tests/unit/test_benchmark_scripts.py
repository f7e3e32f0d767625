"""The benchmark scripts still run and their variants still agree (tiny sizes, no timing claims)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.figures import figure

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_bench_evaluate_runs_and_all_variants_agree() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_evaluate.py"),
            "--queries",
            "300",
            "--results",
            "30",
            "--repeat",
            "1",
            "--breakdown",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    assert "mean ndcg@10 equal in all variants (1e-9): True" in out
    assert "where our time goes (us per run line, 9000 lines):" in out
    figure(out, "read run")
    assert out.count("ratio pytrec_eval time / our time") == 2
    figure(out, "ratio pytrec_eval time / our time, end to end, files to metrics")
    figure(out, "ratio pytrec_eval time / our time, evaluation of in-memory data")


@pytest.mark.slow
def test_bench_detector_runs_and_detects_the_drops() -> None:
    """One no-change run and one run of two kinds: the table has every rule, and the
    sequential detector finds the 5-point drop and the find-rate-only drop (fixed seeds)."""
    out = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_detector.py"),
            "--runs",
            "1",
            "--null-runs",
            "1",
            "--kinds",
            "drop,find rate only",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    detector = [line for line in rows if "**sequential detector**" in line]
    assert len(detector) == 3, out  # false alarms, then one row per kind
    assert all("100% (1/1)" in line for line in detector[1:]), out
    assert any(line.startswith("| per-look Welch detector") for line in rows), out
    assert "(tuned on the no-change runs)" in out


def _stack(*frames: str) -> str:
    """A py-spy collapsed stack from ``function path:line`` items."""
    return ";".join(f"{f.split()[0]} ({f.split()[1]})" for f in frames)


def test_run_profile_puts_samples_in_the_part_of_their_innermost_deciding_frame() -> None:
    """bench_run_kafka --profile: py-spy's collapsed stacks to parts of the service."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_run_kafka as bench
    finally:
        sys.path.remove(str(BENCHMARKS))
    loop = ("KafkaEdge.run service/broker/consumer.py:206", "cycle service/broker/commits.py:124")
    process = ("work service/broker/consumer.py:202", "_process service/broker/consumer.py:249")
    thread = "Thread.run threading.py:982"
    samples = [
        # the metric core under finalisation is finalisation...
        (
            _stack(
                *loop,
                "Pipeline.advance service/stream/pipeline.py:271",
                "aggregate_groups service/metrics/aggregates.py:133",
            ),
            7,
        ),
        # ... and under the follower's merge, the follower
        (
            _stack(
                thread,
                "WindowFollower._run service/broker/follower.py:160",
                "SliceTotals.add service/stream/windows.py:130",
                "merge_into service/metrics/aggregates.py:160",
            ),
            5,
        ),
        # the join's state under Pipeline.query is the join; the decoder is decoding
        (
            _stack(
                *loop,
                *process,
                "Pipeline.query service/stream/pipeline.py:170",
                "add_query service/stream/join.py:150",
            ),
            3,
        ),
        (_stack(*loop, *process, "decode_query service/stream/events.py:171"), 2),
        # kafka-python under the consumer loop is its poll; its threads are its own
        (
            _stack(
                "KafkaEdge.run service/broker/consumer.py:187",
                "KafkaConsumer.poll kafka/consumer/group.py:827",
            ),
            11,
        ),
        (_stack(thread, "Sender.run kafka/producer/sender.py:113"), 1),
        (_stack(thread, "NetworkSelector.run_forever kafka/net/selector.py:239"), 1),
        (_stack("<module> service/__main__.py:5", "_find_and_load <frozen>:1176"), 4),
    ]
    raw = "\n".join(f"{stack} {count}" for stack, count in samples) + "\ngarbage line\n"
    assert bench.profile_parts(raw) == {
        "finalisation (advance, metric core)": 7,
        "window follower (global view)": 5,
        "join and bookkeeping (and the record loop)": 3,
        "decode and validate (msgspec)": 2,
        "kafka-python poll (fetch, record parsing)": 11,
        "kafka-python producer's sender thread": 1,
        "kafka-python's other threads (network, metadata)": 1,
        "start-up (imports)": 4,
    }


def test_recovery_bound_runs_and_a_big_drop_closes_as_recovered() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "recovery_bound.py"), "--runs", "1"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    rows = [line.split("|")[1:-1] for line in out.splitlines()[2:]]
    assert len(rows) == 9
    big = next(r for r in rows if r[0].strip() == "0.20" and r[1].strip() == "3000")
    assert big[2].strip() == "1/1"  # it opened
    assert big[6].strip() == "1/1"  # and closed as recovered
    assert 0 < float(big[4]) < 2 * float(big[3])  # near the stated time


def test_bench_audit_cost_runs_and_prints_its_figures() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_audit_cost.py"),
            "--hours",
            "0.5",
            "--repeat",
            "1",
            "--held",
            "500",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| 0")]
    assert [row[0].strip() for row in rows] == ["0", "0.01", "0.05"]
    assert float(rows[0][3]) == 1.0  # (the baseline against itself)
    assert figure(out, "memory per held request:") > 500  # (20 chunk ids alone take more)


def test_bench_audit_estimates_runs_and_prints_every_row() -> None:
    """The smoke size (2 seeds of 3 hours): a row per (metric, audit rate) and the overall
    figures; coverage and error are the full run's to judge, not this one's."""
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_audit_estimates.py"), "--small", "--jobs", "1"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    for metric in ("hit_rate@5", "recall@5", "mrr"):
        for rate in ("0.01", "0.05"):
            assert any(line.startswith(f"| {metric} | {rate} | 8/8 |") for line in rows), out
    assert figure(out, "overall coverage") <= 100
    assert figure(out, "overall MAE / live bias") < 1
    assert figure(out, "overall width / audit-alone width") < 1.2


def test_bench_detector_memory_runs_and_counts_each_partitions_rows() -> None:
    """Tiny sizes: the table prints, and a detector fed the same traffic over three
    times the partitions holds about as much per slice-day (only the last hour's rows are
    kept per partition; before, a row per partition and window made it over 1.5 times),
    as the merged rows it is set against."""
    out = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_detector_memory.py"),
            "--days",
            "1",
            "--slices",
            "2",
            "--partitions",
            "1,3",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    rows = [
        line.split("|")[1:-1]
        for line in out.splitlines()
        if line.startswith("| 1 ") or line.startswith("| 3 ")
    ]
    assert [r[0].strip() for r in rows] == ["1", "3"]
    detector = [float(r[2].split()[0]) for r in rows]
    once = [float(r[3].split()[0]) for r in rows]
    assert detector[1] < 1.3 * detector[0]
    assert once[1] == pytest.approx(once[0], rel=0.05)
    assert all(d > o for d, o in zip(detector, once, strict=True))


def test_bench_cuped_removes_the_texts_share_of_the_variance_without_bias() -> None:
    """bench_cuped.py's comparison on queries whose metric is half their text's (a
    standard normal per text) and half noise: CUPED keeps about half the variance, finds
    a drop of a fifth of a standard deviation with a larger z, and on no change its z
    stays centred (over 40 seeds its mean is within 3 standard errors of 0)."""
    import numpy as np

    from service.times import DAY_MS, HOUR_MS
    from tests.benchmarks.bench_cuped import Queries, compare

    def queries(seed: int, drop: float) -> Queries:
        rng = np.random.default_rng(seed)
        switch = 8 * DAY_MS
        n = 40_000
        ts = rng.integers(0, switch + HOUR_MS, n)
        text = rng.integers(0, 300, n)
        own = rng.normal(0.0, 1.0, 300)
        new = ts >= switch
        y = own[text] + rng.normal(0.0, 1.0, n) - drop * new
        return Queries(switch, ts, new, text, {"mrr": y})

    ratios, plain, cuped = [], [], []
    for seed in range(40):
        z_plain, z_cuped, ratio = compare(queries(seed, 0.0), "mrr", HOUR_MS)
        ratios.append(ratio)
        plain.append(z_plain)
        cuped.append(z_cuped)
    assert 0.4 < float(np.median(ratios)) < 0.6
    assert abs(float(np.mean(cuped))) < 3 / np.sqrt(40)
    z_plain, z_cuped, _ = compare(queries(99, 0.3), "mrr", HOUR_MS)
    assert z_cuped < z_plain < 0
