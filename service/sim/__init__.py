"""Synthetic traffic: retriever versions, a click model, citations, judgments."""
