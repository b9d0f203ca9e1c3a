"""Framework all-reduce kernels (custom / one-shot / two-shot / MNNVL): one tensor reduced across
the ranks of a tensor-parallel group.

``message_size`` counts the *elements* of the tensor every rank holds and all-reduces (the
same count on every rank: per rank and whole coincide for an all-reduce), in
``allreduce_dtype`` (bfloat16 throughout the corpus); ``num_gpus`` is the group size. Versioned
by the framework backend and its version, like the kernels it measures. The ceiling guard
catches a message size stored in bytes (or any other undercount): the implied bus bandwidth
would exceed the system's link. Evidence: docs/families.md.
"""

from collections.abc import Mapping
from typing import Any

from ...specs.roofline import GpuSpec, Roof, bytes_of, per_value
from .base import GLOBAL, PER_RANK, Ceiling, DuplicateSpread, Family, NativeSource, Quantity, TableSpec, Tier, register

#: Bus bandwidth may exceed the system file's per-direction link rate by this much before a row
#: is rejected: in-switch reduction (NVLS) lets the corpus reach 1.05x on H100/H200 at 8 GPUs.
LINK_CEILING = 1.25


def bus_factor(op: Any, n: Any) -> Any:
    """Bytes each rank moves per byte of the message, as nccl-tests' bus bandwidth counts them:
    2(n-1)/n for an all-reduce (reduce-scatter then all-gather), (n-1)/n otherwise."""
    ring = (n - 1.0) / n
    return ring * per_value(lambda o: 2.0 if o == "all_reduce" else 1.0, op)


def allreduce_roof(table: str, cols: Mapping[str, Any], gpu: GpuSpec) -> Roof:
    """2(n-1)/n of the message's bytes over the link (nvlink or pcie inside a node, the slower
    of it and the network beyond), plus one peer-to-peer hop."""
    n = 1.0 * cols["num_gpus"]
    dtype = cols["allreduce_dtype"] if "allreduce_dtype" in cols else cols.get("nccl_dtype")
    moved = bus_factor(cols.get("op_name", "all_reduce"), n) * cols["message_size"] * per_value(bytes_of, dtype)
    return Roof(link=moved / gpu.link_bw(cols["num_gpus"]), fixed=gpu.p2p_latency)


CUSTOM_ALLREDUCE = register(
    Family(
        name="custom_allreduce",
        title="framework all-reduce",
        tier=Tier.LOCAL,
        native_source=NativeSource.NONE,
        tables=(
            TableSpec(
                "custom_allreduce", "kernel", ("op_name", "kernel_source", "allreduce_dtype"), ("num_gpus",),
                ("message_size",), None, head_axis=False, carried=("backend", "implementation"),
                quantities=(
                    Quantity("message_size", PER_RANK, "elements of the tensor every rank holds and all-reduces",
                             beside="bytes = message_size * bytes of allreduce_dtype; the group holds num_gpus copies"),
                    Quantity("num_gpus", GLOBAL, "ranks in the all-reduce group (the tensor-parallel size)"),
                ),
                guards=(
                    Ceiling(LINK_CEILING, "link", "the system's link: bus bytes 2(n-1)/n * message bytes / latency",
                            "store message_size as the number of elements (not bytes) each rank all-reduces"),
                    DuplicateSpread("rows at one key must measure one kernel: store the variant the collector "
                                    "varied (eager or graph, one-shot or two-shot) in kernel_source"),
                ),
            ),
        ),
        rationale="the kernel, the dtype, the group size and the message's elements are the whole key",
        model_head_axis=False,
        roof=allreduce_roof,
    )
)
