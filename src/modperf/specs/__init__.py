"""modperf.specs."""
