"""modperf.model."""
