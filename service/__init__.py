"""retrieval-monitor: live and offline retrieval-quality monitoring."""

__version__ = "0.1.0"
