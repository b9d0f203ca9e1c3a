"""The whole model's step: every op of a model's layers priced from its table.

:mod:`.estimate` (per phase and tp, attention or the whole model) and :mod:`.step` (one engine
step at a deployment: a prefill chunk, a decode batch or both).

May import: numpy; modperf.base, modperf.fast, modperf.specs, modperf.data, modperf.query.
"""
