"""The root exception class and its kinds.

Every error the product raises on purpose derives from :class:`RetrievalMonitorError`,
so the command line can print its message and exit non-zero instead of a traceback.
"""

from __future__ import annotations

EXIT_OK = 0
"""Exit code of a command that succeeded."""
EXIT_FAILURE = 1
"""Exit code of a failure while running (a broker error the service cannot recover from)."""
EXIT_BAD_INPUT = 2
"""Exit code of bad input or configuration: a RetrievalMonitorError, its message printed."""


class RetrievalMonitorError(Exception):
    """Base class of every error raised on purpose by retrieval-monitor."""


class ConfigError(RetrievalMonitorError):
    """A setting or a command-line parameter is invalid."""


class InputFileError(RetrievalMonitorError):
    """A line of an input file is malformed.

    The message names the file, the 1-based line number and the field, then says
    what was wrong and how to fix it.
    """

    def __init__(self, path: str, line: int, field: str, problem: str) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.problem = problem
        where = f"{path}:{line}" if line > 0 else path
        super().__init__(f"{where}: field {field!r}: {problem}")


class EventError(RetrievalMonitorError):
    """An input event failed validation; ``reason`` is a short, low-cardinality code."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)
