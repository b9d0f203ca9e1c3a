"""Roofline time of one table row: the physical yardstick that extrapolation holds against.

Outside the measured grid modperf keeps the *utilisation* of the nearest measured point
(measured latency / roofline time) and scales by the roofline time of the requested point:
``t(x) = t(anchor) * R(x) / R(anchor)``. Only the ratio R(x) / R(anchor) matters, so the work
model below needs the right *shape* along each axis (how flops and bytes grow with batch,
sequence, prefix and local heads), not cycle-accurate constants.

    R(x) = max(flops(x) / peak_flops, bytes(x) / mem_bw)

flops and bytes come from a small work model that each family declares with its tables
(``Family.work``, in ``modperf/families/``): per-token projection GEMMs (module tables),
query-key pairs of the attention core (causal in context: each new token attends to the prefix
and to the new tokens before it; capped by a sliding window or a sparse top-k) and the KV cache
read. This module owns the GPU specs, the :class:`WorkModel` arithmetic and the default. GPU
peaks come from the corpus's ``systems/{system}.yaml`` (the dtype's tensor-core peak and
``mem_bw``; the node section's link bandwidths and hop latency); a system without a spec file
uses DEFAULT_GPU and the answer says so.

Tables without a head axis (GEMMs, MoE, communication, quantization, ...) declare a *row
roofline* instead (``Family.roof``): flops, memory bytes and interconnect bytes of one row as
functions of its columns, each divided by its rate (:class:`Roof`). The same function is the
query grid's yardstick (:class:`AxisWork`) and, evaluated on every stored row, the loader's
ceiling guard: a row faster than its roofline allows was stored in another convention.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Used when the system has no spec file (a user data root): an H100-class balance point.
DEFAULT_GPU = {"bfloat16_tc_flops": 989e12, "fp8_tc_flops": 1979e12, "mem_bw": 3.35e12}
#: The node section's defaults (an 8-GPU NVLink node) where a system file has no node section.
DEFAULT_NODE = {"num_gpus_per_node": 8, "intra_node_bw": 450e9, "inter_node_bw": 50e9, "p2p_latency": 1e-5}


@dataclass(frozen=True)
class GpuSpec:
    """One system's GPU: tensor-core peaks, memory bandwidth and size, and its node's links."""

    name: str
    bf16_flops: float
    fp8_flops: float
    fp4_flops: float
    mem_bw: float
    from_file: bool
    #: int8 tensor-core rate (``int8_tc_flops``; the fp8 rate where the file has none).
    int8_flops: float = 0.0
    #: The node: GPUs per node, per-GPU one-direction bandwidth inside it (NVLink or PCIe) and
    #: to other nodes, and the latency of one peer-to-peer hop (s).
    gpus_per_node: int = int(DEFAULT_NODE["num_gpus_per_node"])
    intra_node_bw: float = DEFAULT_NODE["intra_node_bw"]
    inter_node_bw: float = DEFAULT_NODE["inter_node_bw"]
    p2p_latency: float = DEFAULT_NODE["p2p_latency"]
    #: Element-wise ops (norms, activations, embedding rows) are priced as bytes over
    #: ``mem_bw * mem_bw_scaling`` plus ``mem_latency`` s per kernel: the yaml's
    #: ``mem_bw_empirical_scaling_factor`` and ``mem_empirical_constant_latency`` (docs/estimate.md).
    mem_bw_scaling: float = 1.0
    mem_latency: float = 0.0
    #: The NCCL release the system runs (``misc.nccl_version``): the slot of its collective tables.
    nccl_version: str | None = None
    #: One GPU's memory (``gpu.mem_capacity``) and the reserve the file keeps for activations,
    #: CUDA graphs and NCCL (``misc.other_mem``), in bytes; 0 where the file does not say.
    mem_capacity: float = 0.0
    other_mem: float = 0.0
    #: The GPU's compute capability as the file states it (``gpu.sm_version``: 90 Hopper, 100
    #: and 103 Blackwell); 0 where the file does not say.
    sm_version: int = 0

    def memory_ms(self, nbytes: float) -> float:
        """Element-wise roofline: one kernel moving ``nbytes`` through HBM, in ms."""
        return (nbytes / (self.mem_bw * self.mem_bw_scaling) + self.mem_latency) * 1e3

    def peak(self, dtype: str | None) -> float:
        d = (dtype or "").lower()
        if "fp4" in d:
            return self.fp4_flops
        if "fp8" in d:
            return self.fp8_flops
        if "int8" in d or d == "sq":  # SmoothQuant GEMMs run on the int8 units
            return self.int8_flops or self.fp8_flops
        return self.bf16_flops

    def link_bw(self, group: Any) -> Any:
        """Per-GPU one-direction bandwidth of a collective over ``group`` GPUs: inside a node,
        its NVLink/PCIe rate; across nodes, the slower of the two (floats or arrays)."""
        if isinstance(group, np.ndarray):
            return np.where(group <= self.gpus_per_node, self.intra_node_bw,
                            min(self.intra_node_bw, self.inter_node_bw))
        return self.intra_node_bw if group <= self.gpus_per_node else min(self.intra_node_bw, self.inter_node_bw)


#: System spec documents by their text: parsed once per process, or handed over parsed by an
#: earlier process (modperf.data.scan_cache remembers them, with a digest of their text, beside a
#: data root's scan) so that answering from the cache needs no YAML parser.
_DOCUMENTS: dict[str, Any] = {}


def spec_document(text: str) -> Any:
    """A system spec file's document (``{}`` when empty), or None when the text is not YAML."""
    if text in _DOCUMENTS:
        return _DOCUMENTS[text]
    import yaml  # on use: only a system's spec file needs it

    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except yaml.YAMLError:
        doc = None
    _DOCUMENTS[text] = doc
    return doc


def known_document(text: str, doc: Any) -> None:
    """Take ``doc`` as the document of ``text`` (parsed from exactly this text by an earlier process)."""
    _DOCUMENTS.setdefault(text, doc)


def spec_file(system: str | None, systems_dir: str | None = None) -> Path | None:
    """The file :func:`gpu_spec` reads for ``system`` (it may not exist), or None where it
    reads none (no system, no embedded corpus)."""
    if not system:
        return None
    if systems_dir is None:
        from ..fast.cache_keys import embedded_systems_dir

        try:
            folder = embedded_systems_dir()
        except Exception:  # no embedded corpus: the default GPU
            return None
    else:
        folder = Path(systems_dir)
    return folder / f"{system}.yaml"


@functools.lru_cache(maxsize=64)
def gpu_spec(system: str | None, systems_dir: str | None = None) -> GpuSpec:
    """The GPU of ``system`` from ``{systems_dir}/{system}.yaml`` (default: the embedded corpus)."""
    data: dict[str, Any] = {}
    node: dict[str, Any] = {}
    misc: dict[str, Any] = {}
    if system:
        path = spec_file(system, systems_dir)
        if path is not None and path.is_file():
            doc = spec_document(path.read_text())
            if doc is not None:
                data = doc.get("gpu") or {}
                node = doc.get("node") or {}
                misc = doc.get("misc") or {}
    from_file = bool(data.get("bfloat16_tc_flops") and data.get("mem_bw"))
    if not from_file:
        data, node, misc = DEFAULT_GPU, {}, {}
    bf16 = float(data["bfloat16_tc_flops"])
    fp8 = float(data.get("fp8_tc_flops") or bf16)  # A100 has no fp8 units: fp8 runs at bf16 rate
    fp4 = float(data.get("fp4_tc_flops") or fp8)
    int8 = float(data.get("int8_tc_flops") or fp8)
    nd = {**DEFAULT_NODE, **{k: v for k, v in node.items() if k in DEFAULT_NODE and v}}
    return GpuSpec(system or "default", bf16, fp8, fp4, float(data["mem_bw"]), from_file, int8,
                   int(nd["num_gpus_per_node"]), float(nd["intra_node_bw"]), float(nd["inter_node_bw"]),
                   float(nd["p2p_latency"]), _positive(data.get("mem_bw_empirical_scaling_factor"), 1.0),
                   _positive(data.get("mem_empirical_constant_latency"), 0.0),
                   str(misc["nccl_version"]) if misc.get("nccl_version") is not None else None,
                   _positive(data.get("mem_capacity"), 0.0), _positive(misc.get("other_mem"), 0.0),
                   int(_positive(data.get("sm_version"), 0.0)))


def _positive(value: Any, default: float) -> float:
    """A yaml number that must be positive (an absent or malformed one takes the default)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else default


def bytes_of(dtype: str | None) -> float:
    d = (dtype or "").lower()
    if "fp4" in d or "int4" in d:
        return 0.5
    if "fp8" in d or "int8" in d:
        return 1.0
    return 2.0


@dataclass(frozen=True)
class WorkModel:
    """Per-family work of one row, as functions of (batch, new tokens, prefix, local heads).

    ``proj_*``: projection weights touched per token, ``a + b * heads`` elements.
    ``pair_flops_per_head`` / ``pair_flops_shared``: flops per (query, key) pair.
    ``kv_bytes_per_token``: bytes of cache read per attended key (``+ per_head * heads``).
    ``cap``: attended keys per query are capped here (window, top-k), 0 = no cap.
    ``compress``: keys are compressed by this ratio before attention (DeepSeek-V4).
    """

    phase: str
    proj_shared: float = 0.0
    proj_per_head: float = 0.0
    pair_flops_per_head: float = 0.0
    pair_flops_shared: float = 0.0
    kv_bytes_per_token: float = 0.0
    kv_bytes_per_token_per_head: float = 0.0
    act_bytes_per_token_per_head: float = 0.0
    cap: float = 0.0
    compress: float = 1.0
    proj_peak: float = 1.0
    attn_peak: float = 1.0
    weight_bytes: float = 2.0
    mem_bw: float = 1.0
    #: mla_bmm: a token-only kernel (num_tokens axis), flops per token per head.
    token_flops_per_head: float = 0.0
    #: Context attention over the new tokens is causal (decoder) unless this is False (an
    #: encoder: every token attends to every token).
    causal: bool = True

    def seconds(self, batch: np.ndarray | float, isl: np.ndarray | float, step: np.ndarray | float,
                heads: np.ndarray | float) -> np.ndarray | float:
        b, s, p, h = batch, isl, step, heads
        tokens = b * s
        if self.phase == "context":
            # each new token attends to the prefix and (causally) to the new tokens up to itself
            keys = p + (s + 1) * 0.5 if self.causal else p + s
            kv_len = p + s
        else:
            # generation tables: ``step`` is the cached length, ``isl`` the tokens per sequence
            keys = p + s
            kv_len = p + s
        # plain floats on the scalar query path (numpy calls cost ~1 us each there)
        vector = isinstance(b, np.ndarray) or isinstance(s, np.ndarray) or isinstance(p, np.ndarray) \
            or isinstance(h, np.ndarray)
        lower, upper = (np.minimum, np.maximum) if vector else (min, max)
        keys = keys / self.compress
        kv_len = kv_len / self.compress
        if self.cap > 0:
            keys = lower(keys, self.cap)
            kv_read = lower(kv_len, self.cap * upper(s, 1))
        else:
            kv_read = kv_len
        pairs = tokens * keys
        proj = tokens * (self.proj_shared + self.proj_per_head * h)
        flops_proj = 2.0 * proj + tokens * self.token_flops_per_head * h
        flops_attn = pairs * (self.pair_flops_per_head * h + self.pair_flops_shared)
        weights = (self.proj_shared + self.proj_per_head * h) * self.weight_bytes
        bytes_ = (weights + b * kv_read * (self.kv_bytes_per_token + self.kv_bytes_per_token_per_head * h)
                  + tokens * self.act_bytes_per_token_per_head * h)
        compute = flops_proj / self.proj_peak + flops_attn / self.attn_peak
        return upper(compute, bytes_ / self.mem_bw)


def geo(geometry: Mapping[str, Any], name: str, default: float) -> float:
    """A numeric config field of a module's geometry (booleans count as 0/1), or ``default``."""
    value = geometry.get(name)
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return default


def common_terms(phase: str, key: Mapping[str, Any], gpu: GpuSpec) -> dict[str, Any]:
    """The WorkModel fields every attention-shaped family shares: peaks of the projection and
    attention dtypes, the weights' bytes per element, the memory bandwidth."""
    attn_dtype = key.get("attn_dtype") or key.get("mla_dtype") or key.get("bmm_dtype")
    gemm_dtype = key.get("gemm_type") or attn_dtype
    return dict(phase=phase, mem_bw=gpu.mem_bw, proj_peak=gpu.peak(gemm_dtype), attn_peak=gpu.peak(attn_dtype),
                weight_bytes=bytes_of(gemm_dtype))


#: A family's work model: (table, phase, group key, module geometry, GPU) -> WorkModel. Each
#: family declares its own (``Family.work``); :func:`default_work` is the fallback.
WorkFn = Callable[[str, str, Mapping[str, Any], Mapping[str, Any], GpuSpec], WorkModel]


def default_work(table: str, phase: str, key: Mapping[str, Any], geometry: Mapping[str, Any],
                 gpu: GpuSpec) -> WorkModel:
    """Attention-shaped default for a family that declares no work model."""
    return WorkModel(pair_flops_per_head=512.0, kv_bytes_per_token=256.0 * bytes_of(key.get("kv_cache_dtype")),
                     **common_terms(phase, key, gpu))


# --- tables without a head axis: the roofline of a row from its columns ---------------------


@dataclass(frozen=True)
class Roof:
    """The time a row's work takes at each of the machine's rates (s; floats or arrays). The
    roofline is the slowest of them plus ``fixed``, a cost every call pays whatever its size
    (a peer-to-peer hop for communication)."""

    compute: Any = 0.0  # flops / the dtype's tensor-core peak
    memory: Any = 0.0  # HBM bytes / mem_bw
    link: Any = 0.0  # interconnect bytes / the link's one-direction bandwidth
    fixed: float = 0.0

    def bound(self) -> Any:
        """The slowest rate's time, without the fixed cost (what a ceiling guard compares)."""
        parts = (self.compute, self.memory, self.link)
        if any(isinstance(p, np.ndarray) for p in parts):
            return np.maximum(np.maximum(self.compute, self.memory), self.link)
        return max(parts)

    def seconds(self) -> Any:
        return self.bound() + self.fixed


#: A family's per-row roofline: (table, columns by name, gpu) -> Roof. Columns are numpy
#: arrays (every row of a table: the loader's ceiling guards) or scalars and arrays (one group's
#: key and a query's axis values); string columns are a str, or codes with their values.
RowRoof = Callable[[str, Mapping[str, Any], GpuSpec], Roof]


def per_value(fn: Callable[[Any], float], column: Any) -> Any:
    """``fn`` of a string column: a plain value, or (for a whole table) an object with
    ``codes`` and ``values`` (the loader's categorical columns), mapped per distinct value."""
    if hasattr(column, "codes") and hasattr(column, "values"):
        return np.array([fn(v) for v in column.values], dtype=np.float64)[column.codes]
    return fn(column)


@dataclass(frozen=True)
class AxisWork:
    """The work model of one bucket group of a table without a head axis: the family's row
    roofline with the group's key fixed and the grid axes free."""

    roof: RowRoof
    table: str
    key: Mapping[str, Any]
    gpu: GpuSpec
    axes: tuple[str, ...]

    def shape_seconds(self, values: Any) -> Any:
        """Roofline seconds at grid axis values (in ``axes`` order; floats or arrays)."""
        return self.roof(self.table, {**self.key, **dict(zip(self.axes, values))}, self.gpu).seconds()

