"""MoE all-to-all: the dispatch of tokens to their experts' ranks and the combine back.

Four tables, one convention: ``num_tokens`` is what one rank dispatches (its own tokens; the
group moves ``num_tokens * ep_size``), ``ep_size`` is the group's size, ``node_num`` how many
nodes it spans. The unified ``moe_a2a`` table stores all three and its latency in
microseconds (``latency == transmit_us + notify_us`` on every row). The legacy DeepEP tables
(``wideep_deepep_normal`` / ``_ll``) hold dispatch and combine side by side in one row, in
microseconds, name tokens ``num_token`` and top-k ``num_topk``, and record no EP size: the
collector ran one full node per node counted, so the loader derives ``ep_size = node_num *
gpus_per_node`` of the file's system (4 on GB200/GB300, 8 elsewhere) -- never a literal 8.
``trtllm_alltoall`` is in milliseconds and calls the group size ``moe_ep_size``.
Evidence: docs/families.md.
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...specs.roofline import GpuSpec, Roof, bytes_of, per_value
from .base import (
    GLOBAL,
    PER_RANK,
    Derived,
    DuplicateSpread,
    Family,
    LatencyFloor,
    Measure,
    NativeSource,
    Quantity,
    RowRule,
    Scaling,
    ShardedKey,
    TableSpec,
    Tier,
    Unpivot,
    register,
)

#: No dispatch or combine completes in under a microsecond (the corpus's fastest is 8 us): a
#: table declared in microseconds that stored milliseconds lands a thousand times below.
FLOOR_MS = 1e-3


def a2a_roof(table: str, cols: Mapping[str, Any], gpu: GpuSpec) -> Roof:
    """Per rank and direction: each token goes once to every distinct rank among its top-k
    experts' (ep * (1 - (1 - 1/ep)^topk) ranks under uniform routing), all but the own rank's
    share over the link, at ``hidden`` elements of the phase's dtype (combine returns bf16)."""
    ep = np.maximum(1.0 * cols["ep_size"], 1.0)
    tokens, topk, hidden = 1.0 * cols["num_tokens"], 1.0 * cols["topk"], 1.0 * cols["hidden_size"]
    ranks = ep * (1.0 - (1.0 - 1.0 / ep) ** topk)
    phase = cols["phase"] if "phase" in cols else cols.get("op_name", "")
    dtype = cols["comm_dtype"] if "comm_dtype" in cols else cols.get("moe_dtype", "fp8")
    dispatched = per_value(lambda d: 1.0 if d in (None, "default") else bytes_of(d), dtype)
    combine = per_value(lambda p: 1.0 if "combine" in str(p) else 0.0, phase)
    element = combine * 2.0 + (1.0 - combine) * dispatched
    moved = tokens * ranks * (ep - 1.0) / ep * hidden * element
    return Roof(link=moved / gpu.link_bw(cols["ep_size"]), fixed=gpu.p2p_latency)


_TOKENS_FIX = ("store the tokens one rank dispatches in num_tokens (the group moves num_tokens * ep_size); a table "
               "of the group's tokens must divide them by the EP size")
_SPREAD_FIX = ("rows at one key must measure one workload: store the column the collector varied (EP size, node "
               "count, kernel variant) as a key")
_UNITS_FIX = "the table declares its latency in microseconds: store microseconds, or declare the unit the file uses"


def _per_rank(tokens: str = "num_tokens") -> tuple[Quantity, ...]:
    return (
        Quantity(tokens, PER_RANK, "tokens one rank dispatches (and receives back in the combine)",
                 beside="the group moves num_tokens * ep_size tokens"),
        Quantity("ep_size", GLOBAL, "ranks in the expert-parallel group",
                 beside="per rank: num_experts / ep_size experts"),
        Quantity("num_experts", GLOBAL, "the model's routed experts (EPLB slots where larger)"),
    )


def _ep_scaling(step: Mapping[str, int]) -> Scaling:
    return Scaling(
        "num_tokens is per rank", step,
        expect="latency flat or rising as the EP group doubles at a fixed per-rank token count (each rank still "
               "sends its tokens, to more peers; corpus medians 1.07 trtllm, 2.0 DeepEP across nodes)",
        other="tokens counted for the whole group would halve each rank's share (trtllm_alltoall rewritten so: "
              "0.67)",
        fix=_TOKENS_FIX, low=0.85, at_least={"num_tokens": 1024})


_DEEPEP_RENAMES = {"num_token": "num_tokens", "num_topk": "topk"}
_EP_FROM_NODES = Derived(
    "ep_size", "node_num * gpus_per_node of the system (the collector ran every GPU of each node)",
    ("node_num",), lambda c, gpu: c["node_num"] * gpu.gpus_per_node, needs_system=True)

ALLTOALL = register(
    Family(
        name="alltoall",
        title="MoE all-to-all (dispatch / combine)",
        tier=Tier.LOCAL,
        native_source=NativeSource.NONE,
        tables=(
            TableSpec(
                "moe_a2a", "kernel", ("op_name", "kernel_source", "comm_backend", "phase", "comm_dtype"),
                ("ep_size", "node_num", "hidden_size", "topk", "num_experts"), ("num_tokens", "sms"), None,
                head_axis=False, latency=Measure("latency", "us"), carried=("transmit_us", "notify_us"),
                quantities=_per_rank(),
                guards=(
                    RowRule("latency == transmit_us + notify_us", ("latency", "transmit_us", "notify_us"),
                            lambda c, _: np.isclose(c["latency"] * 1000.0, c["transmit_us"] + c["notify_us"],
                                                    rtol=1e-9, atol=0.0),
                            "the latency column is the sum of its microsecond parts",
                            "store latency in microseconds as transmit_us + notify_us"),
                    RowRule("ep_size == node_num * gpus_per_node", ("ep_size", "node_num"),
                            lambda c, gpu: (c["ep_size"] == c["node_num"] * gpu.gpus_per_node) if gpu is not None
                            else np.ones(c["ep_size"].size, dtype=bool),
                            "the group fills every GPU of each node it spans (checked where the system is known)",
                            "record the EP group size and the node count it spans"),
                    ShardedKey("num_experts", "ep_size", "store the model's routed experts; each rank holds "
                               "num_experts / ep_size"),
                    LatencyFloor(FLOOR_MS, _UNITS_FIX),
                    _ep_scaling({"ep_size": 2, "node_num": 2}),
                    DuplicateSpread(_SPREAD_FIX),
                ),
            ),
            TableSpec(
                "wideep_deepep_normal", "kernel", ("op_name", "kernel_source", "phase"),
                ("ep_size", "node_num", "hidden_size", "topk", "num_experts"), ("num_tokens", "sms"), None,
                head_axis=False, latency=Measure("latency", "us"), renames=_DEEPEP_RENAMES,
                unpivot=Unpivot("phase", {
                    "dispatch": {"latency": ("dispatch_transmit_us", "dispatch_notify_us"), "sms": ("dispatch_sms",)},
                    "combine": {"latency": ("combine_transmit_us", "combine_notify_us"), "sms": ("combine_sms",)},
                }),
                derived=(_EP_FROM_NODES,),
                quantities=_per_rank(),
                guards=(LatencyFloor(FLOOR_MS, _UNITS_FIX), _ep_scaling({"ep_size": 2, "node_num": 2}),
                        DuplicateSpread(_SPREAD_FIX)),
            ),
            TableSpec(
                "wideep_deepep_ll", "kernel", ("op_name", "kernel_source", "phase"),
                ("ep_size", "node_num", "hidden_size", "topk", "num_experts"), ("num_tokens",), None,
                head_axis=False, latency=Measure("latency", "us"), renames=_DEEPEP_RENAMES,
                unpivot=Unpivot("phase", {
                    "dispatch": {"latency": ("dispatch_avg_t_us",), "bandwidth_gbps": ("dispatch_bandwidth_gbps",)},
                    "combine": {"latency": ("combine_avg_t_us",), "bandwidth_gbps": ("combine_bandwidth_gbps",)},
                }),
                derived=(_EP_FROM_NODES,), carried=("bandwidth_gbps",),
                quantities=_per_rank(),
                guards=(LatencyFloor(FLOOR_MS, _UNITS_FIX), _ep_scaling({"ep_size": 2, "node_num": 2}),
                        DuplicateSpread(_SPREAD_FIX)),
            ),
            TableSpec(
                "trtllm_alltoall", "kernel", ("op_name", "kernel_source", "moe_dtype", "distribution"),
                ("ep_size", "hidden_size", "topk", "num_experts"), ("num_tokens",), None,
                head_axis=False, renames={"moe_ep_size": "ep_size"},
                quantities=_per_rank(),
                guards=(ShardedKey("num_experts", "ep_size", "store the model's routed experts; each rank holds "
                                   "num_experts / ep_size"),
                        LatencyFloor(FLOOR_MS, "store milliseconds (the table declares ms)"),
                        _ep_scaling({"ep_size": 2}), DuplicateSpread(_SPREAD_FIX)),
            ),
        ),
        rationale=("the dispatch moves one rank's tokens to their experts' ranks: per-rank tokens, the group size "
                   "and the model's routing shape key it"),
        model_head_axis=False,
        roof=a2a_roof,
    )
)
