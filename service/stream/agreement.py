"""Judge agreement: how often two judges (or a judge and the live labels) call the same
chunks relevant, on the chunks both graded, as exact counts that merge like the others.

Per pair of judges of a query the agreement counted is that of their *last* audits. An
audit changes its judge's last grades only, so what it adds to a pair is the table of its
grades against the other judge's last ones, less the table of its judge's previous
grades against them: a function of the query's audits up to its offset, the same when it
is applied again after a restart. The live labels grade every result of the query (0
without a signal) and every chunk a live signal named.
"""

from __future__ import annotations

from collections.abc import Mapping

LIVE = "live"
"""The name of the live labels in a pair (``"<judge>|live"``)."""

Table = tuple[int, int, int, int]
"""On the chunks both graded: (both relevant, only the first, only the second, neither)."""


def pair(first: str, second: str) -> tuple[str, bool]:
    """The pair's name (``"a|b"``, names in order, the live labels last) and whether
    ``first`` is its first name."""
    if second == LIVE or (first != LIVE and first < second):
        return f"{first}|{second}", True
    return f"{second}|{first}", False


def table(first: Mapping[str, int], second: Mapping[str, int]) -> Table:
    """The 2x2 table of relevant (grade >= 1) or not on the chunks both graded."""
    both = only_first = only_second = neither = 0
    for chunk, grade in first.items():
        other = second.get(chunk)
        if other is None:
            continue
        a, b = grade >= 1, other >= 1
        both += a and b
        only_first += a and not b
        only_second += b and not a
        neither += not a and not b
    return both, only_first, only_second, neither


def delta(
    judge: str,
    new: Mapping[str, int],
    old: Mapping[str, int] | None,
    other: str,
    grades: Mapping[str, int],
) -> tuple[str, list[int]]:
    """What ``judge``'s audit ``new`` (replacing ``old``) adds to its pair with ``other``,
    whose last grades are ``grades``."""
    name, in_order = pair(judge, other)
    added = table(new, grades)
    taken = table(old, grades) if old is not None else (0, 0, 0, 0)
    change = [a - t for a, t in zip(added, taken, strict=True)]
    if not in_order:  # (the table is oriented as the pair's name)
        change = [change[0], change[2], change[1], change[3]]
    return name, change


def kappa(counts: Table) -> tuple[int, float | None, float | None]:
    """Count, agreement and Cohen's kappa of a table (None without data; kappa None when
    both always say the same one thing, where chance agreement is 1)."""
    both, only_first, only_second, neither = counts
    n = both + only_first + only_second + neither
    if n <= 0:
        return 0, None, None
    observed = (both + neither) / n
    first, second = (both + only_first) / n, (both + only_second) / n
    chance = first * second + (1 - first) * (1 - second)
    if chance >= 1.0:
        return n, observed, None
    return n, observed, (observed - chance) / (1 - chance)
