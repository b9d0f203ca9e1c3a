"""modperf.query."""
