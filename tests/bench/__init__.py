"""Benchmarks: run by hand (``python -m tests.bench.<name>``), never collected by pytest."""
