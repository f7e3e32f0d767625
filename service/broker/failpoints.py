"""Failpoints: kill the process at a named point of the commit protocol, for fault tests.

Off unless the environment variable ``RETRIEVAL_MONITOR_FAILPOINT`` is set, as
``<point>:<n>``: the process sends itself SIGKILL the n-th time it reaches ``<point>``
with windows in flight (the same death as ``kill -9`` from outside, at a moment chosen
exactly). Points:

* ``before-commit``: closed windows are in the open transaction (or sent, in
  at-least-once mode), the offsets and markers are not committed yet.
* ``after-commit``: the commit succeeded, this process has not yet counted the
  windows on ``/metrics`` nor moved on.

Like the failpoints of etcd, TiKV or FoundationDB: production code with a switch that
only tests turn on. It is read once, at import.
"""

from __future__ import annotations

import logging
import os
import signal

ENV = "RETRIEVAL_MONITOR_FAILPOINT"
POINTS = ("before-commit", "after-commit")

log = logging.getLogger("retrieval_monitor.faults")


def _parse(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    point, _, n = value.partition(":")
    if point not in POINTS or not n.isascii() or not n.isdigit() or int(n) < 1:
        raise ValueError(
            f"{ENV}={value!r}: expected <point>:<n> with point one of {', '.join(POINTS)} "
            "and n a positive integer, e.g. before-commit:3"
        )
    return point, int(n)


_armed = _parse(os.environ.get(ENV))
_reached: dict[str, int] = {}


def failpoint(point: str, context: str = "") -> None:
    """Kill this process with SIGKILL if ``point`` is armed and reached for the n-th time.

    ``context`` (what is in flight) goes into the last log line, for the test to read.
    """
    if _armed is None or _armed[0] != point:
        return
    _reached[point] = _reached.get(point, 0) + 1
    if _reached[point] == _armed[1]:
        log.warning("failpoint %s reached %d times (%s): SIGKILL", point, _armed[1], context)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)
