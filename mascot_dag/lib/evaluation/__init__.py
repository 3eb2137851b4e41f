"""Evaluation: the methods, scores and metrics, statistics, the champion gate, the report, human
ratings."""
