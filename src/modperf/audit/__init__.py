"""The audits and the tools that change data: check, coverage, dedupe, migrate, the writer.

May import: numpy, pyarrow, yaml, matplotlib; modperf.base, modperf.fast, modperf.specs, modperf.data,
modperf.query.
"""
