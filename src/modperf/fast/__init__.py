"""The fast path: a question answered from disk without numpy or pyarrow.

What the persisted caches are keyed by and where the corpus lies (:mod:`.cache_keys`), the
scalar grid lookup on plain lists (:mod:`.lattice`), the answer and its fast path
(:mod:`.answer`), the persisted query plans (:mod:`.plans`) and the JSON-lines batch loop
(:mod:`.batch`). A process asking one thing that a plan answers imports nothing else.

May import: the standard library; modperf.base.
"""
