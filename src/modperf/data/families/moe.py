"""MoE expert compute: the routed experts of one MoE layer, as one rank runs them.

The corpus stores the MoE layer by its *global* shape -- the model's per-expert
``inter_size``, its routed ``num_experts``, the tokens that enter the MoE group -- beside the
sharding (``moe_tp_size``, ``moe_ep_size``, both mandatory). One rank runs
``inter_size / moe_tp_size`` of each of its ``num_experts / moe_ep_size`` experts. This is what
the collectors persist and what model builders pass (the config's values and the parallelism),
so the loader keeps it and the guards check it on the data: at a fixed global shape latency
falls as tp (or ep) doubles, where a per-rank slice would keep it flat, and no key group shows
the per-rank fingerprint (``inter_size * moe_tp_size`` constant while tp varies).

``dsv4_megamoe_module`` is the exception the data shows: its ``num_tokens`` is per rank, with
``global_num_tokens = num_tokens * moe_ep_size`` stored beside it; latency is flat in ep at a
fixed per-rank count. Evidence per table: docs/families.md.
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...specs.roofline import GpuSpec, Roof, per_value
from .base import (
    GLOBAL,
    PER_RANK,
    DuplicateSpread,
    Family,
    NativeSource,
    Quantity,
    RowRule,
    Scaling,
    ShardedKey,
    TableSpec,
    Tier,
    register,
)

AXES = ("num_tokens",)
KEYS = ("hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size")
MOE_CATEGORICAL = ("op_name", "kernel_source", "moe_dtype", "distribution")


def weight_bytes(dtype: str | None) -> float:
    """Bytes per expert weight: 4-bit formats (int4 weight-only, w4a*, *fp4) 0.5, 8-bit 1, else 2."""
    d = (dtype or "").lower()
    if "fp4" in d or "int4" in d or d.startswith("w4"):
        return 0.5
    if "fp8" in d or "int8" in d:
        return 1.0
    return 2.0


def moe_roof(table: str, cols: Mapping[str, Any], gpu: GpuSpec) -> Roof:
    """Per rank, balanced routing: the tokens of the group each pick ``topk`` experts, so a rank
    computes ``T * topk / ep`` (token, expert) pairs through gated GEMMs (three: gate, up, down;
    two for the non-gated kernels) of width ``inter_size / tp``, and reads the weights of the
    experts those pairs touch (at most its ``num_experts / ep``)."""
    tokens = 1.0 * cols["num_tokens"]
    ep, tp = 1.0 * cols["moe_ep_size"], 1.0 * cols["moe_tp_size"]
    if table == "dsv4_megamoe_module":  # per-rank tokens: the group's are ep times more
        tokens = tokens * ep
    hidden, inter = 1.0 * cols["hidden_size"], cols["inter_size"] / tp
    pairs = tokens * cols["topk"] / ep
    active = np.minimum(cols["num_experts"] / ep, pairs)
    gemms = per_value(lambda k: 2.0 if "nongated" in str(k) else 3.0, cols.get("kernel_source", ""))
    dtype = cols.get("moe_dtype")
    flops = 2.0 * gemms * pairs * hidden * inter
    weights = active * gemms * hidden * inter * per_value(weight_bytes, dtype)
    moved = weights + pairs * (2.0 * hidden + gemms * inter) * 2.0
    return Roof(compute=flops / per_value(gpu.peak, dtype), memory=moved / gpu.mem_bw)


_INTER_FIX = ("store the model's per-expert inter_size (the config's moe_intermediate_size) on every row with the "
              "moe_tp_size that sliced it; one rank runs inter_size / moe_tp_size")
_EXPERTS_FIX = ("store the model's routed num_experts on every row with the moe_ep_size that spread them; one rank "
                "runs num_experts / moe_ep_size")
_SPREAD_FIX = ("rows at one key must measure one workload: find the key column the collector varied without recording "
               "it (a sharding stored as its global value, a routing seed) and store it")


def _shape(tokens: str) -> tuple[Quantity, ...]:
    return (
        Quantity("inter_size", GLOBAL, "the model's per-expert FFN width (config moe_intermediate_size)",
                 beside="per rank: inter_size / moe_tp_size"),
        Quantity("num_experts", GLOBAL, "the model's routed experts",
                 beside="per rank: num_experts / moe_ep_size"),
        Quantity("hidden_size", GLOBAL, "the expert GEMMs' input width (the model hidden, or its latent MoE width)"),
        Quantity("num_tokens", *((GLOBAL, "tokens entering the MoE group (every attention-DP rank's tokens)",
                                  "per rank: each rank routes all of them and computes the pairs that land "
                                  "on its experts") if tokens == GLOBAL else
                                 (PER_RANK, "tokens one rank dispatches into the MoE",
                                  "global: global_num_tokens = num_tokens * moe_ep_size, stored beside"))),
    )


def _sharding(tp: bool = True) -> tuple[Any, ...]:
    guards: list[Any] = []
    if tp:
        guards += [
            ShardedKey("inter_size", "moe_tp_size", _INTER_FIX),
            Scaling("tensor parallelism shards inter_size", {"moe_tp_size": 2},
                    expect="latency to fall as each rank's slice inter_size / moe_tp_size halves (corpus medians "
                           "0.50-0.66)",
                    other="a per-rank inter_size would keep each row's work, and its latency, flat (ratio ~1)",
                    fix=_INTER_FIX, high=0.9),
        ]
    guards += [
        ShardedKey("num_experts", "moe_ep_size", _EXPERTS_FIX),
        Scaling("expert parallelism shards num_experts", {"moe_ep_size": 2},
                expect="latency to fall as each rank holds half the experts and computes half the pairs (corpus "
                       "medians 0.53-0.84)",
                other="a per-rank num_experts (or per-rank tokens) would keep the work flat (ratio ~1)",
                fix=_EXPERTS_FIX, high=0.9),
    ]
    return tuple(guards)


_TOKENS_DIVIDE = RowRule(
    "num_tokens % moe_ep_size == 0", ("num_tokens", "moe_ep_size"),
    lambda c, _: c["num_tokens"] % c["moe_ep_size"] == 0,
    "num_tokens is the group's tokens, every rank's share equal: per rank num_tokens / moe_ep_size",
    "store the group's tokens (per-rank tokens times moe_ep_size) in num_tokens")

MOE = register(
    Family(
        name="moe",
        title="MoE expert compute",
        tier=Tier.LOCAL,
        native_source=NativeSource.NONE,
        tables=(
            TableSpec("moe", "kernel", MOE_CATEGORICAL, KEYS, AXES, None, head_axis=False,
                      quantities=_shape(GLOBAL), guards=(*_sharding(), DuplicateSpread(_SPREAD_FIX))),
            # wide-EP sglang (DeepEP MoE): moe_tp_size is 1 throughout; num_tokens is the group's
            TableSpec("wideep_context_moe", "context", MOE_CATEGORICAL, KEYS, AXES, None, head_axis=False,
                      quantities=_shape(GLOBAL),
                      guards=(_TOKENS_DIVIDE, *_sharding(tp=False), DuplicateSpread(_SPREAD_FIX))),
            TableSpec("wideep_generation_moe", "generation", MOE_CATEGORICAL, KEYS, AXES, None, head_axis=False,
                      quantities=_shape(GLOBAL),
                      guards=(_TOKENS_DIVIDE, *_sharding(tp=False), DuplicateSpread(_SPREAD_FIX))),
            # wide-EP trtllm with EPLB: experts are placed in num_slots slots (redundant copies)
            TableSpec(
                "wideep_moe", "kernel", (*MOE_CATEGORICAL, "moe_kernel", "simulation_mode"), (*KEYS, "num_slots"),
                AXES, None, head_axis=False,
                carried=("dp_num_tokens", "rank0_num_tokens"),
                quantities=(*_shape(GLOBAL),
                            Quantity("num_slots", GLOBAL, "expert slots across the group (EPLB: experts plus their "
                                     "redundant copies)", beside="per rank: num_slots / moe_ep_size"),
                            Quantity("dp_num_tokens", PER_RANK, "one attention-DP rank's tokens (carried)",
                                     beside="num_tokens // moe_ep_size, or num_tokens below one per rank"),
                            Quantity("rank0_num_tokens", PER_RANK, "tokens the routing sent to rank 0 (a measured "
                                     "by-product of the sampled routing; carried, never keyed)")),
                guards=(
                    RowRule("dp_num_tokens == num_tokens // moe_ep_size (num_tokens below one per rank)",
                            ("dp_num_tokens", "num_tokens", "moe_ep_size"),
                            lambda c, _: c["dp_num_tokens"] == np.where(
                                c["num_tokens"] < c["moe_ep_size"], c["num_tokens"],
                                c["num_tokens"] // c["moe_ep_size"]),
                            "num_tokens is the group's tokens and dp_num_tokens one rank's share",
                            "store the group's tokens in num_tokens and one rank's in dp_num_tokens"),
                    RowRule("num_slots >= num_experts", ("num_slots", "num_experts"),
                            lambda c, _: c["num_slots"] >= c["num_experts"],
                            "every expert has at least one slot", "store the EPLB slot count in num_slots"),
                    ShardedKey("num_slots", "moe_ep_size",
                               "store the group's expert slots in num_slots; one rank holds num_slots / moe_ep_size"),
                    Scaling("expert parallelism shards the slots and the tokens", {"moe_ep_size": 2},
                            expect="latency to fall with ep at a fixed group size (corpus medians 0.59-0.72)",
                            other="per-rank num_tokens would keep each rank's work flat (ratio ~1)",
                            fix="store the group's tokens in num_tokens (one rank's in dp_num_tokens)", high=0.9),
                    DuplicateSpread(_SPREAD_FIX),
                ),
            ),
            TableSpec(
                "dsv4_megamoe_module", "kernel",
                ("op_name", "kernel_source", "phase", "moe_dtype", "kernel_dtype", "distribution", "source_policy",
                 "pre_dispatch", "buffer_policy"),
                (*KEYS, "num_fused_shared_experts"), AXES, None, head_axis=False,
                carried=("global_num_tokens", "num_max_tokens_per_rank", "effective_num_max_tokens_per_rank",
                         "routed_scaling_factor", "includes_routed_scale", "includes_gate_topk",
                         "includes_buffer_init", "used_cuda_graph"),
                quantities=(*_shape(PER_RANK),
                            Quantity("global_num_tokens", GLOBAL, "the group's tokens (carried)",
                                     beside="num_tokens * moe_ep_size"),
                            Quantity("num_max_tokens_per_rank", PER_RANK,
                                     "the dispatch buffer's capacity per rank (configuration, carried)")),
                guards=(
                    RowRule("global_num_tokens == num_tokens * moe_ep_size",
                            ("global_num_tokens", "num_tokens", "moe_ep_size"),
                            lambda c, _: c["global_num_tokens"] == c["num_tokens"] * c["moe_ep_size"],
                            "num_tokens is one rank's tokens and global_num_tokens the group's",
                            "store one rank's tokens in num_tokens and num_tokens * moe_ep_size in global_num_tokens"),
                    RowRule("num_max_tokens_per_rank >= num_tokens", ("num_max_tokens_per_rank", "num_tokens"),
                            lambda c, _: c["num_max_tokens_per_rank"] >= c["num_tokens"],
                            "the dispatch buffer holds the rank's tokens",
                            "re-measure with a buffer at least as large as the tokens"),
                    RowRule("the row times the expert kernel alone: in a CUDA graph, routed scale applied, without "
                            "gate/top-k or buffer initialisation",
                            ("used_cuda_graph", "includes_routed_scale", "includes_gate_topk", "includes_buffer_init"),
                            lambda c, _: c["used_cuda_graph"] & c["includes_routed_scale"] & ~c["includes_gate_topk"]
                            & ~c["includes_buffer_init"],
                            "these flags change what a latency includes; the table keys none of them",
                            "re-measure with the collector's defaults, or declare the flag as a key"),
                    ShardedKey("inter_size", "moe_tp_size", _INTER_FIX),
                    ShardedKey("num_experts", "moe_ep_size", _EXPERTS_FIX),
                    Scaling("num_tokens is per rank", {"moe_ep_size": 2},
                            expect="latency about flat in ep at a fixed per-rank token count (the rank's pairs stay "
                                   "put; corpus medians 0.94-0.98)",
                            other="group tokens in num_tokens would halve each rank's pairs (ratio ~0.65)",
                            fix="store one rank's tokens in num_tokens (the group's in global_num_tokens)",
                            low=0.8, high=1.25),
                    DuplicateSpread(_SPREAD_FIX),
                ),
            ),
        ),
        rationale=("the expert GEMMs' work is the global shape divided by the sharding; the key keeps the global "
                   "shape and the mandatory tp/ep sizes, as collectors persist and model builders pass them"),
        model_head_axis=False,
        roof=moe_roof,
    )
)
