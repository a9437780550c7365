"""Benchmarks and cross-checks of the serving engine (scripts, not tests; run with python -m)."""
