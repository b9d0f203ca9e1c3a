"""modperf.fast."""
