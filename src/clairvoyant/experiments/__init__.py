"""Reproducible experiments shared by the CLI demo and benchmarks/."""
