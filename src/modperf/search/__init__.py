"""Which deployment to run: ``modperf search`` (docs/search.md).

For N GPUs of one system, a model and a workload (isl, osl), :func:`search` enumerates the
aggregated and disaggregated deployments each backend's launch flags can express
(:mod:`.space`), prices every one as ``modperf predict`` does, leaves out (and counts, with
why) those whose weights and running requests do not fit under the backend's memory rule,
whose steps the tables cannot price, or whose figures break the limits, and returns the
Pareto fronts of tokens/s/GPU against tokens/s/user, the best deployment per mode and backend,
and the top K; :mod:`.launch` spells the command that starts each on its backend, and
:mod:`.files` writes the fronts and the top K as CSV and JSON.

May import: numpy; modperf.base, modperf.fast, modperf.specs, modperf.data, modperf.query, modperf.model,
modperf.serving.
"""

from __future__ import annotations

from .engine import REASONS, Counts, Limits, Point, SearchResult, front, search

__all__ = ["REASONS", "Counts", "Limits", "Point", "SearchResult", "front", "search"]
