"""Which queries are in the audit sample: a hash of the query id, so that every replica and
the user's judging pipeline agree on it without coordination.

``audit_hash(query_id)`` is the first 8 bytes of the SHA-256 of the UTF-8 query id, read
as a big-endian unsigned integer, divided by 2**64: uniform in [0, 1) and independent of
anything about the query, so the sample is a simple random sample of the traffic (what
makes the audited estimates unbiased). A query is in the sample at rate ``r`` when its
hash is below ``r``: the sample at a lower rate is a subset of the sample at a higher one.
"""

from __future__ import annotations

import hashlib

from service.errors import ConfigError

_SCALE = 1 << 64


def audit_hash(query_id: str | bytes) -> float:
    """The query id's place in [0, 1): its SHA-256's first 8 bytes, big-endian, / 2**64."""
    raw = query_id.encode() if isinstance(query_id, str) else query_id
    return _word(raw) / _SCALE


def _word(raw: bytes) -> int:
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "big")


def sampled(query_id: bytes, threshold: int) -> bool:
    """Whether the query (id as UTF-8) is in the sample of :func:`sample_threshold`'s
    ``threshold``: ``audit_hash(query_id) < rate`` without a division (the hot path's)."""
    return _word(query_id) < threshold


def sample_threshold(rate: float) -> int:
    """The 64-bit threshold of a rate: a query is sampled when its first 8 hash bytes, as an
    integer, are below it (exactly ``audit_hash < rate`` for every id, without a division)."""
    if not 0.0 <= rate <= 1.0:
        raise ConfigError(f"the audit rate must lie in [0, 1], got {rate!r}; 0 turns auditing off")
    # the smallest integer h with h / 2**64 >= rate (float division of an int below 2**64
    # rounds, so the bound is found on the floats themselves)
    threshold = int(rate * _SCALE)
    while threshold > 0 and (threshold - 1) / _SCALE >= rate:
        threshold -= 1
    while threshold < _SCALE and threshold / _SCALE < rate:
        threshold += 1
    return threshold


def in_audit_sample(query_id: str | bytes, rate: float) -> bool:
    """Whether the query is in the audit sample at ``rate`` (0: nobody, 1: everybody)."""
    if not 0.0 <= rate <= 1.0:
        raise ConfigError(f"the audit rate must lie in [0, 1], got {rate!r}; 0 turns auditing off")
    return audit_hash(query_id) < rate
