"""Reproducing and narrowing down: dumps of a run, and each op run alone."""
