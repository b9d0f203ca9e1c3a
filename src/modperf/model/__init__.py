"""The whole model's step: every op of a model's layers priced from its table.

:mod:`.estimate` (per phase and tp, attention or the whole model) and :mod:`.step` (one engine
step at a deployment: a prefill chunk, a decode batch or both), built from :mod:`.step_types`
(what a step is made of: the request and the answer), :mod:`.step_plan` (what pricing a model on
a deployment settles once: layer kinds, versions, dtypes), :mod:`.pricer` (one method per op
kind) and :mod:`.tables` (which tables a model's attention reads, at which version).

May import: numpy; modperf.base, modperf.fast, modperf.specs, modperf.data, modperf.query.
"""
