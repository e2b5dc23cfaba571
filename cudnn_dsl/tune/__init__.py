"""Tuning: heuristic candidates and exhaustive search timed on the GPU, and benchmarks against peers."""
