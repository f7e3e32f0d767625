"""The streaming core: events, labels, watermarks, the event-time join, windows, counters.

Pure: plain data and an injected clock in, closed windows out. ``run``, ``demo``,
``replay`` and the tests drive the same :class:`~service.stream.pipeline.Pipeline`.
"""
