"""Paths into a user's JSON record: dotted paths with list steps, or JSON pointers.

A dotted path names object keys separated by dots, each optionally followed by list
steps: ``request.id``, ``hits[0].id``, ``hits[*].id`` (``[*]``: every item of the list,
the rest of the path read from each). A path that starts with ``/`` is a JSON pointer
(RFC 6901: ``/event_attributes/object/object_id``, ``~1`` for ``/`` and ``~0`` for ``~``
in a key), for keys that contain dots or brackets.
"""

from __future__ import annotations

import re
from typing import Any

ALL = object()
"""The ``[*]`` step."""

_SEGMENT = re.compile(r"^(?P<key>[^.\[\]]+)(?P<steps>(?:\[(?:\d+|\*)\])*)$")
_STEP = re.compile(r"\[(\d+|\*)\]")


class PathError(ValueError):
    """A path that cannot be parsed (a mapping file error)."""


class AbsentError(LookupError):
    """The record has nothing at the path (``at``: the first step not found)."""

    def __init__(self, at: str) -> None:
        super().__init__(at)
        self.at = at


class WrongTypeError(TypeError):
    """A step met a value it cannot go into (``at``: the path up to that value)."""

    def __init__(self, at: str, got: str) -> None:
        super().__init__(at)
        self.at = at
        self.got = got


Step = str | int | object


class Path:
    """A compiled path; :meth:`read` gives the value at it in one record."""

    __slots__ = ("steps", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.steps: tuple[Step, ...] = _pointer(text) if text.startswith("/") else _dotted(text)

    def __repr__(self) -> str:
        return f"Path({self.text!r})"

    @property
    def has_all(self) -> bool:
        return any(step is ALL for step in self.steps)

    def read(self, record: Any) -> Any:
        """The value at the path (a list for a path with ``[*]``); AbsentError or WrongTypeError."""
        return _read(record, self.steps, 0, ())


def _read(value: Any, steps: tuple[Step, ...], start: int, done: tuple[Step, ...]) -> Any:
    """Follow ``steps[start:]`` from ``value``; ``done``: the concrete steps before (for
    messages, built only when one is needed)."""
    for i in range(start, len(steps)):
        step = steps[i]
        kind = type(value)
        if step is ALL:
            if kind is not list:
                raise WrongTypeError(_at(done, steps[start:i]), kind_of(value))
            where = (*done, *steps[start:i])
            return [_read(item, steps, i + 1, (*where, n)) for n, item in enumerate(value)]
        if kind is dict and type(step) is str:
            try:
                value = value[step]
            except KeyError:
                raise AbsentError(_at(done, steps[start : i + 1])) from None
            continue
        if kind is list and (type(step) is int or (type(step) is str and step.isdigit())):
            index = int(step)
            if index >= len(value):
                raise AbsentError(_at(done, (*steps[start:i], index)))
            value = value[index]
            continue
        raise WrongTypeError(_at(done, steps[start:i]), kind_of(value))
    return value


def _at(done: tuple[Step, ...], more: tuple[Step, ...]) -> str:
    """A path as the messages show it: ``a.b[2].c``."""
    text = ""
    for step in (*done, *more):
        text += f"[{step}]" if type(step) is int else f".{step}" if text else str(step)
    return text or "(record)"


def _dotted(text: str) -> tuple[Step, ...]:
    if not text:
        raise PathError("an empty path")
    steps: list[Step] = []
    for segment in text.split("."):
        match = _SEGMENT.match(segment)
        if match is None:
            raise PathError(
                f"path {text!r}: {segment!r} is not a key followed by [n] or [*] steps "
                "(for keys with dots or brackets, write a JSON pointer such as /a.b/c)"
            )
        steps.append(match["key"])
        for index in _STEP.findall(match["steps"]):
            steps.append(ALL if index == "*" else int(index))
    return tuple(steps)


def _pointer(text: str) -> tuple[Step, ...]:
    steps: list[Step] = []
    for token in text[1:].split("/"):
        steps.append(token.replace("~1", "/").replace("~0", "~"))
    return tuple(steps)


def kind_of(value: Any) -> str:
    """The JSON kind of a decoded value, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
