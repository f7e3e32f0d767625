"""Offline evaluation of golden sets with the streaming metric code: files, evaluate, compare."""

from service.offline.golden import compare, evaluate, evaluate_retriever

__all__ = ["compare", "evaluate", "evaluate_retriever"]
