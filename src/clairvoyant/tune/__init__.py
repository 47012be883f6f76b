"""Metrics, verdict and (later) the autotuner."""
