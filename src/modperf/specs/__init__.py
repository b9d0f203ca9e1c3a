"""What the model and the hardware are: read from their files, with no perf table involved.

HF configs (:mod:`.models`: native heads, the checkpoint's dtypes, the model registry), the
shard rules (:mod:`.shard`: local heads, kv-head sharding, head_dim, tp sizes), layer schedules
(:mod:`.layers`) and GPU specs with the roofline work models (:mod:`.roofline`).

May import: numpy, yaml; modperf.base, modperf.fast.
"""
