"""``simulate``'s audit and label-shift flags: what they build, and bad values exit 2."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from service.commands.cli import main
from service.commands.simulate import parse_judge
from service.sim.audit import JudgeModel

START = ["--start", "2026-12-01T00:00:00Z"]


def run(tmp_path: Path, name: str, *flags: str) -> list[dict[str, object]]:
    path = tmp_path / name
    assert main(["simulate", "--jsonl", str(path), *START, "--hours", "1h", *flags]) == 0
    return [json.loads(line)["event"] for line in path.read_text().splitlines()]


def test_judges_parse_a_trailing_number_as_the_confusion() -> None:
    assert parse_judge("llm:judge:0.15") == JudgeModel("llm:judge", confusion_rate=0.15)
    assert parse_judge("human:careful") == JudgeModel("human:careful")
    assert parse_judge("raters:0") == JudgeModel("raters")
    assert parse_judge("solo") == JudgeModel("solo")


def test_audit_flags_add_audit_events_and_change_nothing_else(tmp_path: Path) -> None:
    plain = (tmp_path / "plain.jsonl", tmp_path / "zero.jsonl")
    assert main(["simulate", "--jsonl", str(plain[0]), *START, "--hours", "1h"]) == 0
    flags = ["--hours", "1h", "--audit-rate", "0"]
    assert main(["simulate", "--jsonl", str(plain[1]), *START, *flags]) == 0
    assert plain[0].read_bytes() == plain[1].read_bytes()
    # the sample rate is the service's AUDIT_RATE; without --judge nothing is audited
    assert (
        main(["simulate", "--jsonl", str(plain[1]), *START, *flags[:2], "--audit-rate", "0.3"]) == 0
    )
    assert plain[0].read_bytes() == plain[1].read_bytes()
    events = run(tmp_path, "a.jsonl", "--audit-rate", "0.05", "--judge", "llm:judge:0.15")
    events += run(tmp_path, "b.jsonl", "--audit-rate", "0.05", "--judge", "human:careful")
    judges = collections.Counter(str(e["judge"]) for e in events if e.get("signal") == "audit")
    assert set(judges) == {"llm:judge", "human:careful"}
    assert judges["llm:judge"] == judges["human:careful"] > 100
    lines = (tmp_path / "b.jsonl").read_text().splitlines()
    kept = [line for line in lines if '"signal":"audit"' not in line]
    assert "\n".join(kept) + "\n" == plain[0].read_text()


def test_halving_flags_change_nothing_before_their_time(tmp_path: Path) -> None:
    plain = run(tmp_path, "plain.jsonl")
    half_hour = "2026-12-01T00:30"
    for flag in ("--halve-citations-at", "--halve-clicks-at"):
        shifted = run(tmp_path, f"{flag}.jsonl", flag, "30m")
        early = {e["query_id"] for e in plain if "results" in e and str(e["timestamp"]) < half_hour}
        assert [e for e in shifted if e["query_id"] in early] == [
            e for e in plain if e["query_id"] in early
        ]
        assert shifted != plain


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--audit-rate", "1.5", "--judge", "a"], "--audit-rate"),
        (["--audit-rate", "0.1", "--judge", "llm:judge:1.5"], "confusion_rate"),
        (["--audit-rate", "0", "--judge", "llm:judge"], "--judge needs --audit-rate"),
        (["--audit-rate", "0.1", "--judge", "a", "--judge", "a"], "distinct names"),
        (["--halve-clicks-at", "2h"], "--halve-clicks-at must lie within --hours"),
        (["--halve-citations-at", "-1h"], "--halve-citations-at"),
    ],
)
def test_bad_values_exit_2_with_a_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    path = tmp_path / "out.jsonl"
    try:
        code = main(["simulate", "--jsonl", str(path), *START, "--hours", "1h", *flags])
    except SystemExit as exit_:  # argparse rejects what does not parse
        code = int(str(exit_.code))
    assert code == 2
    assert message in capsys.readouterr().err
    assert not path.exists()


def test_query_texts_repeat_and_their_companion_flags_need_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--query-texts 50``: every query event names one of 50 texts, the most asked
    (exponent 1.2) far more often than the rest; the text's segment is always the same.
    Without it the events have no text, and its two companions are refused."""
    events = run(tmp_path, "texts.jsonl", "--query-texts", "50", "--zipf-exponent", "1.2")
    queries = [e for e in events if "results" in e]
    texts = collections.Counter(str(e["query"]) for e in queries)
    assert len(texts) <= 50
    [(top, count)] = texts.most_common(1)
    assert count > 5 * len(queries) / 50
    assert len({e["segment"] for e in queries if e["query"] == top}) == 1
    assert not any("query" in e for e in run(tmp_path, "plain.jsonl") if "results" in e)
    flags = ["simulate", "--jsonl", str(tmp_path / "x.jsonl"), *START, "--hours", "1h"]
    assert main([*flags, "--text-persistence", "0.9"]) == 2
    assert "--text-persistence need --query-texts N" in capsys.readouterr().err
    assert main([*flags, "--query-texts", "5", "--text-persistence", "1"]) == 2
    assert "persistence must be in [0, 1)" in capsys.readouterr().err
