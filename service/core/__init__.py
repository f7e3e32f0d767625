"""The core composed: the monitor (pipeline, window view, detector) and the state that
the processing loop and the HTTP side share."""
