"""Regression detection on closed windows (deploy comparison and drift): pure."""
