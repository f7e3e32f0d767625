"""Human-readable reports of offline evaluations and comparisons, and the find-vs-rank reading."""

from __future__ import annotations

from dataclasses import dataclass

from service.metrics.ir import AT_K_FAMILIES, SINGLE_METRICS
from service.offline.golden import Evaluation, PairedComparison

FOUND_LOW = 0.5
"""recall at the largest k below this: the answer is often not found at all."""
FOUND_HIGH = 0.7
"""recall at the largest k at or above this: finding works."""
EARLY_SHARE_LOW = 0.6
"""recall at the smallest k below this share of its best possible value: ranking problem."""


@dataclass(frozen=True)
class Reading:
    """Where the run loses relevant chunks: ``finding``, ``ranking``, ``mixed``, ``healthy``."""

    kind: str
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text}


def find_vs_rank(ev: Evaluation) -> Reading:
    """Compare recall at the largest k (is it found?) with recall at the smallest k (is it on top?).

    Recall at a small k is bounded by k/|R| when a query has many relevant chunks, so
    the early recall is read against the best a perfect ranking could reach.
    """
    k_lo, k_hi = ev.ks[0], ev.ks[-1]
    found = ev.mean(f"recall@{k_hi}")
    early = ev.mean(f"recall@{k_lo}")
    possible = ev.best_possible_recall(k_lo)
    if found is None or early is None or not possible:
        return Reading("no_data", "no labelled queries: nothing to read")
    share = early / possible
    numbers = (
        f"recall@{k_hi} = {found:.3f}; recall@{k_lo} = {early:.3f} of a possible {possible:.3f}"
    )
    if found < FOUND_LOW:
        return Reading(
            "finding",
            f"{numbers}. The answer is often not retrieved at all, even in the top {k_hi}: "
            "a reranker cannot fix that. Look at chunking (size, overlap), the embedding "
            "model, hybrid (keyword + vector) search and query rewriting.",
        )
    if found >= FOUND_HIGH and share < EARLY_SHARE_LOW:
        return Reading(
            "ranking",
            f"{numbers}. Relevant chunks are found but ranked too low: a ranking problem. "
            "A reranker (cross-encoder) or better fusion weights should help; passing "
            "more results to the model is the stopgap.",
        )
    if found >= FOUND_HIGH:
        return Reading(
            "healthy", f"{numbers}. Relevant chunks are found and mostly ranked near the top."
        )
    return Reading(
        "mixed",
        f"{numbers}. Recall at the largest k is middling: both finding (chunking, "
        "embeddings, hybrid search) and ranking (reranking) leave room.",
    )


def _cell(ev: Evaluation, key: str) -> str:
    moments = ev.aggregates.get(key)
    estimate = None if moments is None else moments.estimate()
    if estimate is None:
        return "n/a"
    if estimate.ci_low is None or estimate.ci_high is None:
        return f"{estimate.mean:.3f}"
    return f"{estimate.mean:.3f} [{estimate.ci_low:.3f}, {estimate.ci_high:.3f}]"


def render_evaluation(ev: Evaluation, title: str) -> str:
    """Metrics down, k across (the recall@k curve reads along a row), with 95% intervals."""
    lines = [title]
    summary = f"golden queries: {ev.queries} ({ev.labelled} labelled, {ev.negatives} negative cases"
    if ev.negative_decline_rate is not None:
        summary += f"; the run returned nothing for {ev.negative_decline_rate:.0%} of the negatives"
    lines.append(summary + ")")
    notes = []
    if ev.missing_from_run:
        notes.append(f"{ev.missing_from_run} labelled queries missing from the run (scored 0)")
    if ev.unjudged_run_queries:
        notes.append(f"{ev.unjudged_run_queries} run queries not in the golden set (ignored)")
    if ev.duplicate_results:
        notes.append(f"{ev.duplicate_results} repeated chunk ids in result lists (non-relevant)")
    lines.extend(f"note: {n}" for n in notes)
    width = 22
    lines.append("")
    lines.append(f"{'metric':<18}" + "".join(f"{'@' + str(k):<{width}}" for k in ev.ks))
    for family in AT_K_FAMILIES:
        cells = "".join(f"{_cell(ev, f'{family}@{k}'):<{width}}" for k in ev.ks)
        lines.append(f"{family:<18}{cells}")
    lines.append("")
    for key in SINGLE_METRICS:
        moments = ev.aggregates.get(key)
        n = 0 if moments is None else moments.count
        shown = _cell(ev, key)
        if key == "context_precision" and n == 0:
            shown = "n/a (the run gives no context_k)"
        lines.append(f"{key:<18}{shown}  (n={n})")
    lines.append("")
    lines.append("Means over labelled queries, [95% Student-t interval].")
    lines.append(f"Reading: {find_vs_rank(ev).text}")
    return "\n".join(line.rstrip() for line in lines)


def _num(value: float | None, digits: int = 3, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def render_comparison(cmp: PairedComparison, n_resamples: int) -> str:
    """One row per metric: both means, delta with its interval, p-values, verdict."""
    a, b = cmp.baseline_name, cmp.candidate_name
    lines = [
        f"compare: candidate B = {b} against baseline A = {a} on {cmp.queries} labelled queries",
        f"paired sign-flip randomisation test ({n_resamples} resamples), "
        f"Holm-corrected over {len(cmp.metrics)} metrics, alpha {cmp.alpha:g}",
        "",
        f"{'metric':<20}{'A':>8}{'B':>8}{'delta':>9}   {'95% CI of delta':<19}"
        f"{'p':>8}{'p (Holm)':>10}  verdict",
    ]
    for m in cmp.metrics:
        ci = "n/a" if m.ci_low is None else f"[{m.ci_low:+.3f}, {m.ci_high:+.3f}]"
        lines.append(
            f"{m.metric:<20}{_num(m.baseline):>8}{_num(m.candidate):>8}"
            f"{_num(m.delta, signed=True):>9}   {ci:<19}{m.p_value:>8.4f}{m.p_adjusted:>10.4f}"
            f"  {m.verdict}"
        )
    lines.append("")
    lines.append(f"Verdict: {cmp.verdict}")
    return "\n".join(lines)
