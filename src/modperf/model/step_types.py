"""What a step is made of: the parallelism, the prefill chunks and decode part a step carries
(the request), each op's cost and the step's (the answer), and the vocabulary they share
(components, op kinds, the dtype columns a step takes). :mod:`modperf.model.step` prices them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..base import errors as E
from ..base import limits
from ..specs.shard import divisors
from .tables import (
    DTYPE_COLUMNS,
)

if TYPE_CHECKING:
    pass

#: The components every step reports, in this order; they sum to the total.
COMPONENTS = ("attention", "gemm", "moe", "communication", "other")
ROOFLINE, NOT_COVERED = "roofline", "not_covered"
#: What an op's number is: a table's answer (exact, interpolated, extrapolated), the system's
#: bandwidth roofline, or nothing (not covered, with its reason).
OP_KINDS = ("exact", "interpolated", "extrapolated", ROOFLINE, NOT_COVERED)
#: Dtype columns a caller may set besides the attention ones: the routed experts' dtype.
STEP_DTYPE_COLUMNS = (*DTYPE_COLUMNS, "moe_dtype")
#: Where a table measured several routing distributions, the one a step takes (real routers are
#: skewed; docs/estimate.md), else the next.
DISTRIBUTIONS = ("power_law_1.01", "balanced", "power_law_1.2")
#: The dtype of the communication buffers and of the unquantised GEMMs (router, logits).
ACTIVATION_DTYPE = "bfloat16"
ALLTOALL_TABLES = ("moe_a2a", "wideep_deepep_normal", "wideep_deepep_ll")
#: SMs an all-to-all's high-throughput kernels run on where the table sweeps them: DeepEP's
#: default (its low-latency kernels are stored at 0).
DEEPEP_SMS = 20
#: The moe_dtype names of kernels for one mxfp4 checkpoint (weights mxfp4; activations differ).
MXFP4_KERNELS = ("w4a16_mxfp4", "w4a8_mxfp4_mxfp8")
#: The mxfp4 kernel a backend serves an mxfp4 checkpoint's experts with by default, per GPU
#: generation (the major of ``gpu.sm_version``): TRT-LLM's MoE backend is TRTLLM on Blackwell,
#: mxfp8 activations on the mxfp4 weights, and TRITON on Hopper, bfloat16 activations (its
#: gpt-oss deployment guide: "For Blackwell, the default MoE backend is TRTLLM. For Hopper, the
#: default MoE backend is TRITON"). Elsewhere the checkpoint's own kernel is asked first.
MXFP4_DEFAULT_KERNEL: dict[tuple[str, int], str] = {("trtllm", 10): "w4a8_mxfp4_mxfp8",
                                                    ("trtllm", 9): "w4a16_mxfp4"}
#: Backends that cap the tensor parallelism of a MoE model's dense MLPs (its shared experts and
#: dense layers) at ``gcd(inter / quantization block, tp)``, and within one node: TRT-LLM's
#: DeepSeek-V3 family (``_compute_shared_expert_tp_size``, ``_compute_mlp_tp_size``: "the TP
#: size of MLP is capped by intermediate_size // block_size"); the other ranks hold copies.
MLP_TP_CAPPING_BACKENDS = ("trtllm",)
#: Elements per quantization scale block along the intermediate dimension, by GEMM dtype.
QUANT_BLOCK = {"fp8_block": 128, "nvfp4": 16, "mxfp4": 32}
#: Axes along which an op's work is a sum of independent parts (docs/estimate.md).
SPLIT_AXES: dict[str, tuple[str, ...]] = {"gemm": ("m", "n"), "moe": ("num_tokens",)}
#: How a step's notes name an MLA layer composed from its parts although module tables exist.
COMPOSED_FALLBACK = "MLA composed from its parts where the module tables cannot answer"


# --- the request ----------------------------------------------------------------------------


def _check_size(name: str, value: Any, rng: limits.Range, fix: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value not in rng:
        raise E.OptionValueError(f"{name} must be an integer in {rng.describe()}", values={name: value}, fix=fix)
    return value


@dataclass(frozen=True)
class Parallel:
    """One deployment's parallelism. GPUs of one worker = ``tp * attention_dp`` = ``moe_tp *
    moe_ep``; ``moe_tp`` left out takes the value that makes the product hold. Attention runs
    ``heads / tp`` with each attention-DP rank's batch; MoE and FFN see every DP rank's tokens."""

    tp: int = 1
    moe_tp: int | None = None
    moe_ep: int = 1
    attention_dp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "moe_ep", "attention_dp", *(("moe_tp",) if self.moe_tp is not None else ())):
            _check_size(name, getattr(self, name), limits.TP, f"pass --{name.replace('_', '-')} N")
        gpus = self.tp * self.attention_dp
        if self.moe_tp is None:
            if gpus % self.moe_ep:
                raise E.OptionValueError(
                    f"moe_ep={self.moe_ep} does not divide the worker's tp x attention_dp = {gpus} GPUs",
                    values={"tp": self.tp, "attention_dp": self.attention_dp, "moe_ep": self.moe_ep},
                    fix=f"use a moe_ep that divides {gpus}: {', '.join(map(str, divisors(gpus)))}")
            object.__setattr__(self, "moe_tp", gpus // self.moe_ep)
        elif self.moe_tp * self.moe_ep != gpus:
            raise E.OptionValueError(
                f"moe_tp x moe_ep = {self.moe_tp * self.moe_ep} must equal tp x attention_dp = {gpus} (the worker's "
                "GPUs)", values={"tp": self.tp, "attention_dp": self.attention_dp, "moe_tp": self.moe_tp,
                                 "moe_ep": self.moe_ep},
                fix=f"leave moe_tp out (it becomes {gpus // self.moe_ep if gpus % self.moe_ep == 0 else '?'}), or "
                    f"choose moe_tp and moe_ep whose product is {gpus}")

    @property
    def moe_tp_size(self) -> int:
        assert self.moe_tp is not None  # set in __post_init__
        return self.moe_tp

    @property
    def gpus(self) -> int:
        return self.tp * self.attention_dp

    def to_dict(self) -> dict[str, int]:
        return {"tp": self.tp, "moe_tp": self.moe_tp_size, "moe_ep": self.moe_ep, "attention_dp": self.attention_dp}


@dataclass
class SeqChunk:
    """Prefill part of a step: ``batch`` sequences, each ``tokens`` new tokens after ``prefix``
    cached ones (per attention-DP rank)."""

    batch: int
    tokens: int
    prefix: int = 0


@dataclass
class DecodePart:
    """Decode part of a step: ``batch`` sequences each generating one token at kv length ``kv``
    (per attention-DP rank)."""

    batch: int
    kv: int


# --- the answer -----------------------------------------------------------------------------


@dataclass
class OpCost:
    """One op of the step: its latency per occurrence and how many layers run it."""

    name: str
    component: str  # one of COMPONENTS
    table: str | None  # None: roofline
    version: str | None
    kind: str  # exact | interpolated | extrapolated | roofline | not_covered
    ms: float | None  # per occurrence; None when not covered
    count: int
    fields: dict[str, Any] = field(default_factory=dict)  # the shape asked (and the key resolved)
    reason: str | None = None  # why not covered
    backend: str | None = None  # the slot's backend (a collective library for nccl / oneccl)
    #: What graph replay removes per occurrence: the table's per-call floor above the GPU's own
    #: (``graphed`` steps only; docs/serving.md, "What a served step pays").
    isolation_ms: float | None = None
    #: Set where the table answered from another native head count (``allow_substitute``).
    substitution: str | None = None

    @property
    def total_ms(self) -> float | None:
        return None if self.ms is None else self.ms * self.count

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "component": self.component, "table": self.table, "backend": self.backend,
                "version": self.version, "kind": self.kind, "ms": self.ms, "count": self.count,
                "total_ms": self.total_ms, "fields": self.fields, "reason": self.reason,
                "isolation_ms": self.isolation_ms, "substitution": self.substitution}


@dataclass
class StepCost:
    """What one step costs. ``components`` sum the covered ops; ``total_ms`` is their sum when
    every op is covered, else None (``complete`` False, ``not_covered`` says why)."""

    model: str
    system: str
    backend: str
    parallel: Parallel
    prefill: SeqChunk | None
    decode: DecodePart | None
    ops: list[OpCost]
    versions: dict[str, str]
    notes: list[str]
    #: Of ``notes``, those saying that a table was served from the framework folder it was filed
    #: in (a misplaced library table): what every answer priced with it carries (predict).
    served_from: list[str] = field(default_factory=list)
    #: The dtypes the weights are served in beside the checkpoint's (ModelConfig.dtypes_served).
    served: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return all(op.ms is not None for op in self.ops)

    @property
    def components(self) -> dict[str, float]:
        out = dict.fromkeys(COMPONENTS, 0.0)
        for op in self.ops:
            if op.ms is not None:
                out[op.component] += op.ms * op.count
        return out

    @property
    def total_ms(self) -> float | None:
        return sum(self.components.values()) if self.complete else None

    @property
    def not_covered(self) -> list[dict[str, Any]]:
        return [{"name": op.name, "table": op.table, "reason": op.reason} for op in self.ops if op.ms is None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "system": self.system, "backend": self.backend, "parallel": self.parallel.to_dict(),
            "prefill": None if self.prefill is None else vars(self.prefill).copy(),
            "decode": None if self.decode is None else vars(self.decode).copy(),
            "total_ms": self.total_ms, "complete": self.complete, "components": self.components,
            "ops": [op.to_dict() for op in self.ops], "not_covered": self.not_covered,
            "versions": dict(self.versions), "notes": list(self.notes), "served": self.served,
        }


__all__ = ["ACTIVATION_DTYPE", "ALLTOALL_TABLES", "COMPONENTS", "COMPOSED_FALLBACK", "DEEPEP_SMS", "DISTRIBUTIONS",
           "MLP_TP_CAPPING_BACKENDS", "MXFP4_DEFAULT_KERNEL", "MXFP4_KERNELS", "NOT_COVERED", "OP_KINDS",
           "QUANT_BLOCK", "ROOFLINE", "SPLIT_AXES", "STEP_DTYPE_COLUMNS", "DecodePart", "OpCost", "Parallel",
           "SeqChunk", "StepCost"]
