"""One JSON record as users write it (a record read through an input mapping, or a
replay line), kept apart from the mapping itself so that reading needs no mapping."""

from __future__ import annotations

import json
from typing import Any

import orjson

from service.errors import EventError


def loads(raw: bytes | str) -> Any:
    """A user's JSON record (or a replay line): orjson, and Python's json for what only it
    reads (NaN and Infinity, which Python's json.dumps writes; integers over 64 bits);
    EventError ``invalid_json`` if neither can."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        try:
            return json.loads(raw)
        except ValueError:
            raise EventError("invalid_json", f"not valid JSON: {error}") from None
