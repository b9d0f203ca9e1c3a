"""modperf.data."""
