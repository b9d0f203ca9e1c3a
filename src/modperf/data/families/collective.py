"""Collective-library tables (NCCL, oneCCL): all_reduce, all_gather, reduce_scatter and
alltoall measured with the library's benchmark, versioned by the library's release.

A table lives in ``{system}/comm/{library}/{release}/`` (``nccl`` or ``oneccl``), the slot a
system's ``misc.nccl_version`` / ``oneccl_version`` selects, whatever framework image ran the
benchmark; the ``version`` column records what the process linked and is provenance. A library
table in a framework folder is misplaced.

``message_size`` counts elements of the whole buffer as nccl-tests sizes it: the all_reduce
buffer, the all_gather *output*, the reduce_scatter *input*. oneCCL's benchmark sizes an
all_gather by the per-rank send buffer instead: the oneccl table declares that, and the loader
keys the whole buffer (``message_size * num_gpus``) so both libraries answer the same question.
Guards on the data: lat(half, m) = lat(int8, 2m) (elements, not bytes), lat(all_gather, m) =
lat(reduce_scatter, m) (whole buffers), and the link ceiling. Evidence: docs/families.md.
"""

import numpy as np

from .base import (
    GLOBAL,
    Ceiling,
    Derived,
    DuplicateSpread,
    Family,
    NativeSource,
    Quantity,
    Scaling,
    TableSpec,
    Tier,
    register,
)
from .custom_allreduce import LINK_CEILING, allreduce_roof

CATEGORICAL = ("op_name", "kernel_source", "nccl_dtype")
_ELEMENTS_FIX = "store message_size as elements of the buffer (nccl-tests' size divided by the dtype's bytes)"
_WHOLE_FIX = ("store message_size as the whole buffer: the all_gather output (num_gpus times each rank's send), the "
              "reduce_scatter input")
_SEND_COUNT_FIX = ("oneCCL tables store each rank's all_gather send count (the loader multiplies it by num_gpus) and "
                   "the whole buffer of the other operations, in elements: store those")


def _guards(library: str) -> tuple:
    return (
        Scaling("message_size counts elements", {"nccl_dtype": ("half", "int8"), "message_size": 2},
                expect="lat(half, m) = lat(int8, 2m): the same bytes (corpus medians 0.98-1.00)",
                other="a size in bytes would compare m half bytes with 2m int8 bytes: twice the bytes (ratio ~2)",
                fix=_ELEMENTS_FIX, low=0.8, high=1.25, at_least={"message_size": 1 << 21}),
        Scaling("all_gather sizes the whole buffer", {"op_name": ("reduce_scatter", "all_gather")},
                expect="lat(all_gather, m) = lat(reduce_scatter, m): the same bytes cross the links (corpus medians "
                       "0.97-1.06)",
                other=("a per-rank all_gather size gives about num_gpus times the reduce_scatter's latency"
                       if library == "nccl" else
                       "an all_gather stored as the whole buffer, multiplied again by the loader, gives about "
                       "1 / num_gpus"),
                fix=_WHOLE_FIX if library == "nccl" else _SEND_COUNT_FIX,
                low=0.6, high=1.6, at_least={"message_size": 1 << 22}),
        Ceiling(LINK_CEILING, "link", "the system's link: bus bytes ((n-1)/n of the buffer, twice for all_reduce) "
                "/ latency", _ELEMENTS_FIX if library == "nccl" else _SEND_COUNT_FIX),
        DuplicateSpread("rows at one key must measure one configuration: store what the collector varied as a key"),
    )


def _spec(library: str, **extra) -> TableSpec:
    return TableSpec(
        library, "kernel", CATEGORICAL, ("num_gpus",), ("message_size",), None, head_axis=False, library=library,
        quantities=(Quantity("message_size", GLOBAL, "elements of the whole buffer (all_reduce buffer, all_gather "
                             "output, reduce_scatter input, alltoall buffer)",
                             beside="per rank: message_size / num_gpus is each rank's shard of it"),
                    Quantity("num_gpus", GLOBAL, "ranks in the communicator")),
        guards=_guards(library), **extra)


COLLECTIVE = register(
    Family(
        name="collective",
        title="collective library (NCCL, oneCCL)",
        tier=Tier.LOCAL,
        native_source=NativeSource.NONE,
        tables=(
            _spec("nccl"),
            _spec("oneccl", derived=(Derived(
                "message_size", "message_size * num_gpus on all_gather rows (oneCCL's benchmark sizes the per-rank "
                "send buffer; the key is the whole gathered buffer)", ("message_size", "num_gpus", "op_name"),
                lambda c, _: np.where(c["op_name"] == "all_gather", c["message_size"] * c["num_gpus"],
                                      c["message_size"])),)),
        ),
        rationale="the operation, dtype, communicator size and buffer elements key a collective; the library "
                  "release versions it",
        model_head_axis=False,
        roof=allreduce_roof,
    )
)
