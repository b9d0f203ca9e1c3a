"""modperf.audit."""
