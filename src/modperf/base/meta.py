"""modperf's own version (stamped into what the writer writes, and into cache keys)."""

__version__ = "0.1.0"
