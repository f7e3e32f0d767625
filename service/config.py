"""Parsing of settings values shared by the commands (the service settings join later)."""

from __future__ import annotations

from service.errors import ConfigError
from service.ir_metrics import validate_ks


def parse_ks(text: str) -> tuple[int, ...]:
    """Parse a comma-separated list of cutoffs such as ``1,3,5,10,20``."""
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise ConfigError(f"k needs a comma-separated list of positive integers, got {text!r}")
    ks = []
    for part in parts:
        try:
            k = int(part)
        except ValueError:
            raise ConfigError(
                f"k must be a positive integer, got {part!r} in {text!r} (example: 1,3,5,10,20)"
            ) from None
        ks.append(k)
    return validate_ks(ks)
