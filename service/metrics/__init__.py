"""Ranking metrics (trec_eval definitions), exact aggregates and statistics: pure numpy."""
