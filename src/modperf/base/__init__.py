"""modperf.base."""
