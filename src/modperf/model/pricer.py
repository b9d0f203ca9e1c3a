"""Pricing a step's ops from its plan (:class:`StepPricer`, one method per op kind), and what
isolation adds to a GEMM table (its per-call floor, which a CUDA graph replay removes).
"""

from __future__ import annotations

import bisect
import math
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..base import errors as E
from ..data.families import registry as family_registry
from ..data.families.custom_allreduce import bus_factor
from ..specs.layers import AttentionLayer, FfnLayer
from ..specs.roofline import bytes_of
from ..specs.shard import local_kv_heads
from .step_plan import PLAN_LOCK, StepPlan, int_field, is_gdn
from .step_types import (
    ACTIVATION_DTYPE,
    ALLTOALL_TABLES,
    DEEPEP_SMS,
    DISTRIBUTIONS,
    MLP_TP_CAPPING_BACKENDS,
    MXFP4_DEFAULT_KERNEL,
    MXFP4_KERNELS,
    NOT_COVERED,
    QUANT_BLOCK,
    ROOFLINE,
    SPLIT_AXES,
    DecodePart,
    OpCost,
    SeqChunk,
)
from .tables import (
    GEMM_TABLE,
)

if TYPE_CHECKING:
    from ..query.db import Database
    from ..query.engine import Answer

# --- what isolation adds -------------------------------------------------------------------

_MISS = (E.NotCoveredError, E.OutOfCoverageError, E.QueryFieldError, E.UnknownTableError)
_AXES = frozenset({"m", "n", "k", "num_tokens", "batch_size", "isl", "step", "seq_len", "message_size"})
_SLOT_FIELDS = ("table", "system", "backend", "version", "model", "native_heads")

#: A GEMM whose weight has at most this many elements has stopped getting faster with shape: at
#: a given m, such points measure the table's per-call floor (docs/serving.md).
FLOOR_ELEMENTS = 1 << 22
#: Points below the floor size a bucket needs at one m for its floor to be read there.
FLOOR_POINTS = 3


@dataclass(frozen=True)
class GemmFloors:
    """Per-call floors of one GEMM table: per bucket (its key tuple), the median latency (ms) of
    its floor-sized points at each measured m; and per m, the GPU's own floor: the lowest bucket
    floor of the table (one plain kernel, replayed in a graph)."""

    key_names: tuple[str, ...]
    buckets: dict[tuple[Any, ...], tuple[tuple[int, ...], tuple[float, ...]]]
    gpu: tuple[tuple[int, ...], tuple[float, ...]]

    @staticmethod
    def at(series: tuple[tuple[int, ...], tuple[float, ...]], m: int) -> float | None:
        """The floor at the largest measured m not above ``m`` (the smallest measured m below it)."""
        ms, floors = series
        if not ms:
            return None
        i = bisect.bisect_right(ms, m) - 1
        return floors[max(i, 0)]


_FLOORS: weakref.WeakKeyDictionary[Database, dict[tuple[str, str, str], GemmFloors]] = weakref.WeakKeyDictionary()


def gemm_floors(db: Database, system: str, backend: str, version: str) -> GemmFloors:
    """The per-call floors of a GEMM table (cached per database)."""
    key = (system, backend, version)
    with PLAN_LOCK:
        cached = _FLOORS.setdefault(db, {}).get(key)
    if cached is not None:
        return cached
    import numpy as np

    keyed = db.table(system, backend, version, GEMM_TABLE)
    m_all, n_all, k_all = (keyed.axes[a] for a in ("m", "n", "k"))
    buckets: dict[tuple[Any, ...], tuple[tuple[int, ...], tuple[float, ...]]] = {}
    lowest: dict[int, float] = {}
    for b, bucket in enumerate(keyed.bucket_keys):
        lo, hi = int(keyed.offsets[b]), int(keyed.offsets[b + 1])
        m, lat = m_all[lo:hi].astype(np.int64), keyed.latency[lo:hi]
        small = (n_all[lo:hi].astype(np.int64) * k_all[lo:hi].astype(np.int64)) <= FLOOR_ELEMENTS
        ms, floors = [], []
        for value in np.unique(m[small]):
            pick = small & (m == value)
            if int(pick.sum()) >= FLOOR_POINTS:
                ms.append(int(value))
                floors.append(float(np.median(lat[pick])))
                lowest[int(value)] = min(lowest.get(int(value), floors[-1]), floors[-1])
        buckets[tuple(bucket)] = (tuple(ms), tuple(floors))
    gpu_m = tuple(sorted(lowest))
    out = GemmFloors(tuple(keyed.key_names), buckets, (gpu_m, tuple(lowest[m] for m in gpu_m)))
    with PLAN_LOCK:
        _FLOORS[db][key] = out
    return out


# --- pricing --------------------------------------------------------------------------------


def _reason(exc: E.ModperfError) -> str:
    return exc.detail + (f" (fix: {exc.fix})" if exc.fix else "")


def _pick(name: str, values: list[Any], prefer: Mapping[str, Callable[[Any], bool]]) -> Any:
    if name in prefer:
        hits = [v for v in values if prefer[name](v)]
        if hits:
            return hits[0]
    if name == "distribution":
        for d in DISTRIBUTIONS:
            if d in values:
                return d
    for default in (ACTIVATION_DTYPE, "half", "default"):
        if default in values:
            return default
    return None


class StepPricer:
    """Prices the ops of one step of a :class:`StepPlan` (one method per op kind)."""

    def __init__(self, plan: StepPlan, graphed: bool = False, allow_substitute: bool = False) -> None:
        self.plan = plan
        self.db = plan.db
        self.ops: list[OpCost] = []
        self.notes: list[str] = []
        self.served_from: list[str] = []
        self.graphed = graphed
        self.allow_substitute = allow_substitute

    # -- queries ---------------------------------------------------------------------------

    def _resolve(self, base: dict[str, Any], prefer: Mapping[str, Callable[[Any], bool]]
                 ) -> tuple[dict[str, Any], list[str] | None]:
        """Key columns the caller left open: a kernel list (each is tried per shape), a routing
        distribution or dtype by the documented preference; anything else stays an error."""
        fixed: dict[str, Any] = {}
        kernels: list[str] | None = None
        for _ in range(12):
            probe = {**base, **fixed, **({"kernel_source": kernels[0]} if kernels else {})}
            try:
                self.db.answer(probe, quality=False)
                break
            except E.QueryFieldError as exc:
                name, values = exc.values.get("field"), exc.values.get("values")
                if not name or not values or name in probe:
                    raise
                if name == "kernel_source":
                    kernels = [str(v) for v in values]
                    continue
                choice = _pick(name, list(values), prefer)
                if choice is None:
                    raise
                fixed[name] = choice
            except (E.NotCoveredError, E.OutOfCoverageError):
                break  # the key is resolved; this point (or this kernel) is what misses
        return fixed, kernels

    def ask(self, table: str, fields: Mapping[str, Any], **kw: Any) -> Answer:
        """One op's answer (:meth:`_ask`); where it comes from a library table served from the
        framework folder it was filed in, the step's notes say so (once)."""
        answer = self._ask(table, fields, **kw)
        if answer.notes:  # (the served file's note is among them: only then is the slot looked up)
            misplaced = self.db.ref(answer.system, answer.backend, answer.version, answer.table).misplaced
            if misplaced is not None and misplaced.note not in self.served_from:
                self.notes.append(misplaced.note)
                self.served_from.append(misplaced.note)
        return answer

    def _ask(self, table: str, fields: Mapping[str, Any], *, backend: str | None = None, version: str | None = None,
             kernels: Callable[[str], bool] | None = None, kernel_class: str = "",
             prefer: Mapping[str, Callable[[Any], bool]] | None = None) -> Answer:
        plan = self.plan
        backend = backend or plan.backend
        if version is None:
            if table in plan.missing:
                raise E.NotCoveredError(plan.missing[table], values={"table": table},
                                        fix=f"see `modperf ls --system {plan.system} --backend {backend}`")
            version = plan.versions[table]
        base = {"table": table, "system": plan.system, "backend": backend, "version": version, **fields}
        dtypes = plan.dtypes
        if dtypes:
            keyed = self.db.table(plan.system, backend, version, table)
            base.update({k: v for k, v in dtypes.items() if k in keyed.key_names and k not in fields})
        key = (backend, version, table, kernel_class,
               tuple(sorted((k, v) for k, v in base.items() if k not in _AXES)))
        resolved = plan.resolved.get(key)
        if resolved is None:
            resolved = self._resolve(base, prefer or {})
            plan.resolved[key] = resolved
        fixed, kernel_list = resolved
        if kernel_list is None:
            return self.db.answer({**base, **fixed}, quality=False)
        candidates = [k for k in kernel_list if kernels is None or kernels(k)]
        if not candidates:
            raise E.NotCoveredError(f"{table} holds no {kernel_class or 'matching'} kernel for these keys",
                                    values={"kernels": kernel_list}, fix="collect the missing kernel")
        answers: list[Answer] = []
        errors: list[tuple[str, E.ModperfError]] = []
        for ks in candidates:
            try:
                answers.append(self.db.answer({**base, **fixed, "kernel_source": ks}, quality=False, diagnose=False))
            except (E.NotCoveredError, E.OutOfCoverageError, E.QueryFieldError) as exc:
                errors.append((ks, exc))
        if not answers:  # the most specific reason, diagnosed: a point outside the grid, then a missing key
            order = (E.OutOfCoverageError, E.NotCoveredError, E.QueryFieldError)
            ks, _ = min(errors, key=lambda e: next(i for i, cls in enumerate(order) if isinstance(e[1], cls)))
            self.db.answer({**base, **fixed, "kernel_source": ks}, quality=False)
            raise AssertionError("a refused kernel answered when asked again")  # pragma: no cover
        return min(answers, key=lambda a: (a.kind == "extrapolated", a.latency_ms))

    def op(self, name: str, component: str, count: int, table: str, fields: Mapping[str, Any], **kw: Any) -> None:
        """One table op (not covered, with the reason, when its query misses). A point past the
        largest measured value of an additive axis (GEMM m or n, MoE tokens) is priced as equal
        parts that are inside the grid, summed: the work splits exactly along those axes, and
        at those sizes the kernels run at their saturated rate."""
        if count <= 0:
            return
        backend = kw.get("backend") or self.plan.backend
        try:
            a = self.ask(table, fields, **kw)
        except _MISS as exc:
            split = self._split(table, fields, exc, kw) if isinstance(exc, E.OutOfCoverageError) else None
            if split is not None:
                latency, kind, parts, axis, got = split
                shape = {**dict(fields), "split": f"{parts} x {axis}"}
                self.ops.append(OpCost(name, component, table, got, kind, latency, count, shape, None, backend))
                return
            version = kw.get("version") or self.plan.versions.get(table)
            self.ops.append(OpCost(name, component, table, version, NOT_COVERED, None, count, dict(fields),
                                   _reason(exc), backend))
            return
        shape = {k: v for k, v in a.fields.items() if k not in _SLOT_FIELDS}
        self.ops.append(OpCost(name, component, table, a.version, a.kind, a.latency_ms, count, shape, None, backend,
                               substitution=a.substitution))

    def _split(self, table: str, fields: Mapping[str, Any], exc: E.OutOfCoverageError, kw: Mapping[str, Any]
               ) -> tuple[float, str, int, str, str] | None:
        outside = exc.values.get("outside_axes") or exc.values.get("axes") or []
        axes = [a for a in SPLIT_AXES.get(table, ()) if a in fields and (not outside or a in outside)]
        if not axes:
            return None
        axis = max(axes, key=lambda a: int(fields[a]))
        for parts in (2, 4, 8, 16):
            value = int(fields[axis])
            if value < parts:
                return None
            piece = -(-value // parts)
            try:
                a = self.ask(table, {**fields, axis: piece}, **kw)
            except E.OutOfCoverageError:
                continue
            except _MISS:
                return None
            return a.latency_ms * parts, a.kind, parts, axis, str(a.version)
        return None

    def roofline(self, name: str, count: int, nbytes: float, what: str) -> None:
        if count <= 0:
            return
        self.ops.append(OpCost(name, "other", None, None, ROOFLINE, self.plan.gpu.memory_ms(nbytes), count,
                               {"bytes": nbytes, "work": what}))

    def not_covered(self, name: str, component: str, count: int, reason: str, table: str | None = None) -> None:
        self.ops.append(OpCost(name, component, table, None, NOT_COVERED, None, count, {}, reason))

    def gemm(self, name: str, count: int, m: int, n: int, k: int, *, unquantized: bool = False) -> None:
        """A GEMM of one rank's shard. Quantised projections take the checkpoint's dtype (by
        model); the router and the logits run in bfloat16."""
        if m <= 0:
            return
        fields: dict[str, Any] = {"m": m, "n": n, "k": k}
        if unquantized:
            fields["gemm_dtype"] = ACTIVATION_DTYPE
        else:
            fields["model"] = self.plan.model
        self.op(name, "gemm", count, GEMM_TABLE, fields)
        if self.graphed:
            self._replayed(self.ops[-1], m, n, k)

    def _replayed(self, op: OpCost, m: int, n: int, k: int) -> None:
        """A GEMM as a CUDA graph replays it: the table's per-call floor above the GPU's own is
        what an isolated call adds (host-side work, dynamic activation scaling); it is removed,
        never below the GPU's floor plus the weight read at the system's bandwidth, never above
        the table's answer."""
        if op.ms is None or op.version is None or "split" in op.fields:
            return
        floors = gemm_floors(self.db, self.plan.system, op.backend or self.plan.backend, op.version)
        try:
            bucket = tuple(op.fields[name] for name in floors.key_names)
        except KeyError:
            return
        series = floors.buckets.get(bucket)
        floor = GemmFloors.at(series, m) if series else None
        gpu = GemmFloors.at(floors.gpu, m)
        if floor is None or gpu is None or floor <= gpu:
            return
        dtype = str(op.fields.get("gemm_dtype") or ACTIVATION_DTYPE)
        read = gpu + self.plan.gpu.memory_ms(n * k * bytes_of(dtype)) - self.plan.gpu.mem_latency * 1e3
        replayed = min(op.ms, max(op.ms - (floor - gpu), read))
        op.isolation_ms = op.ms - replayed
        op.ms = replayed

    # -- the step --------------------------------------------------------------------------

    def step(self, prefill: SeqChunk | None, decode: DecodePart | None) -> None:
        plan, par = self.plan, self.plan.parallel
        tokens = (prefill.batch * prefill.tokens if prefill else 0) + (decode.batch if decode else 0)
        seqs = (prefill.batch if prefill else 0) + (decode.batch if decode else 0)
        hidden = plan.hidden
        for layer, count, label in plan.attention:
            self.attention(layer, count, label, prefill, decode, tokens)
        allreduce = plan.layers if par.tp > 1 else 0  # after every attention block
        for block, count, label in plan.ffn:
            if block.kind == "dense":
                self.dense(f"{label} mlp", count, block.inter, tokens)
                allreduce += count if par.tp > 1 else 0
            else:
                self.moe(block, count, label, tokens, prefill is not None)
                if par.moe_ep == 1 and par.attention_dp > 1:
                    self.collective(f"{label} moe all_gather", count, "all_gather", tokens * par.attention_dp * hidden,
                                    par.gpus)
                    self.collective(f"{label} moe reduce_scatter", count, "reduce_scatter",
                                    tokens * par.attention_dp * hidden, par.gpus)
                elif par.moe_ep == 1 and par.tp > 1:
                    allreduce += count
        if par.tp > 1:
            allreduce += 1  # the vocab-parallel embedding
        self.allreduce("tp allreduce", allreduce, tokens * hidden)
        self.roofline("embedding", 1, 4.0 * tokens * hidden, "gather T x hidden rows (bf16), write them")
        self.roofline("norms (2 per layer)", 2 * plan.layers, 8.0 * tokens * hidden,
                      "fused residual add + RMSNorm: read x and residual, write both (bf16)")
        self.roofline("final norm", 1, 4.0 * tokens * hidden, "RMSNorm: read x, write it (bf16)")
        # the vocabulary is column-parallel (padded to a multiple of tp), logits for the last token only
        self.gemm("logits", 1, seqs, -(-plan.vocab // par.tp), hidden, unquantized=True)
        if par.tp > 1:
            self.collective("logits all_gather", 1, "all_gather", seqs * plan.vocab, par.tp)

    def attention(self, layer: AttentionLayer, count: int, label: str, prefill: SeqChunk | None,
                  decode: DecodePart | None, tokens: int) -> None:
        plan = self.plan
        tp = plan.parallel.tp
        cfg = plan.config
        name = f"{label} {'gdn' if is_gdn(layer, cfg) else layer.kind}"
        if not layer.covered:
            if is_gdn(layer, cfg):
                self.gdn(name, count, prefill, decode, tokens)
            else:
                self.not_covered(f"{name} attention", "attention", count,
                                 f"{layer.label}: {layer.note or 'no table measures this layer kind'}")
            return
        if layer in plan.composed:
            self.composed_mla(name, layer, count, prefill, decode, tokens)
            return
        family = family_registry()[layer.family or ""]
        common = {"model": plan.model, "tp_size": tp}
        for phase, part in (("context", prefill), ("generation", decode)):
            if part is None:
                continue
            table = layer.table(phase)
            assert table is not None
            fields = dict(common)
            if plan.several_kinds(table, phase):
                fields["layer"] = layer.name
            if isinstance(part, SeqChunk):
                fields.update(batch_size=part.batch, isl=part.tokens, step=part.prefix)
            else:
                fields.update(batch_size=part.batch, step=part.kv)
            if table not in plan.missing and "beam_width" in self.db.table(
                    plan.system, plan.backend, plan.versions[table], table).key_names:
                fields["beam_width"] = 1
            if self.allow_substitute:
                fields["allow_substitute"] = True
            self.op(f"{name} attention ({'prefill' if phase == 'context' else 'decode'})", "attention", count,
                    table, fields)
        if not family.projections_in_rows:  # GQA: the kernel tables hold no projections
            local = layer.native_heads // tp
            fixed = dict(layer.fields)
            hd = int(fixed.get("head_dim") or plan.hidden // layer.native_heads)
            kv = int(fixed.get("num_key_value_heads") or cfg.kv_heads or layer.native_heads)
            try:
                local_kv = local_kv_heads(kv, tp)
            except E.ShardError as exc:
                self.not_covered(f"{name} qkv_proj", "gemm", count, _reason(exc), GEMM_TABLE)
                return
            gate = 2 if cfg.get("attn_output_gate", False) is True else 1  # Qwen3.5: a gate beside each query
            self.gemm(f"{name} qkv_proj", count, tokens, (gate * local + 2 * local_kv) * hd, plan.hidden)
            self.gemm(f"{name} o_proj", count, tokens, plan.hidden, local * hd)

    def composed_mla(self, name: str, layer: AttentionLayer, count: int, prefill: SeqChunk | None,
                     decode: DecodePart | None, tokens: int) -> None:
        """An MLA layer from its parts where no module table exists (docs/estimate.md)."""
        cfg, plan = self.plan.config, self.plan
        tp = plan.parallel.tp
        q_lora = cfg.get("q_lora_rank", None)
        kv_lora, nope = int(cfg.get("kv_lora_rank")), int(cfg.get("qk_nope_head_dim"))
        rope, v = int(cfg.get("qk_rope_head_dim")), int(cfg.get("v_head_dim"))
        local = layer.native_heads // tp
        self.gemm(f"{name} qkv_a_proj", count, tokens, (int(q_lora) if q_lora else 0) + kv_lora + rope, plan.hidden)
        self.gemm(f"{name} q_b_proj" if q_lora else f"{name} q_proj", count, tokens, local * (nope + rope),
                  int(q_lora) if q_lora else plan.hidden)
        heads = {"model": plan.model, "tp_size": tp}
        if prefill is not None:
            self.gemm(f"{name} kv_b_proj (prefill)", count, prefill.batch * (prefill.tokens + prefill.prefix),
                      local * (nope + v), kv_lora)
            self.op(f"{name} attention (prefill)", "attention", count, "context_mla",
                    {**heads, "batch_size": prefill.batch, "isl": prefill.tokens, "step": prefill.prefix})
        if decode is not None:
            self.op(f"{name} bmm_pre (decode)", "attention", count, "mla_bmm",
                    {**heads, "op_name": "mla_gen_pre", "num_tokens": decode.batch})
            self.op(f"{name} attention (decode)", "attention", count, "generation_mla",
                    {**heads, "batch_size": decode.batch, "step": decode.kv})
            self.op(f"{name} bmm_post (decode)", "attention", count, "mla_bmm",
                    {**heads, "op_name": "mla_gen_post", "num_tokens": decode.batch})
        self.gemm(f"{name} o_proj", count, tokens, plan.hidden, local * v)

    def gdn(self, name: str, count: int, prefill: SeqChunk | None, decode: DecodePart | None, tokens: int) -> None:
        """A gated-DeltaNet layer: its convolution and recurrence kernels (``gdn``, rank-local
        heads) per part, and its projections (GEMMs) over the step's tokens."""
        cfg, plan = self.plan.config, self.plan
        tp = plan.parallel.tp
        hk, hv = int_field(cfg, "linear_num_key_heads") // tp, int_field(cfg, "linear_num_value_heads") // tp
        dk, dv = int_field(cfg, "linear_key_head_dim"), int_field(cfg, "linear_value_head_dim")
        key = {"num_k_heads": hk, "head_k_dim": dk, "num_v_heads": hv, "head_v_dim": dv,
               "d_conv": int_field(cfg, "linear_conv_kernel_dim")}
        for phase, part, seq in (("context", prefill, prefill.tokens if prefill else 0), ("generation", decode, 1)):
            if part is None:
                continue
            word = "prefill" if phase == "context" else "decode"
            fields = {**key, "phase": phase, "batch_size": part.batch, "seq_len": seq}
            self.op(f"{name} conv ({word})", "attention", count, "gdn", fields,
                    kernels=lambda k: "conv1d" in k, kernel_class="convolution")
            self.op(f"{name} recurrence ({word})", "attention", count, "gdn", fields,
                    kernels=lambda k: "conv1d" not in k, kernel_class="recurrence")
        self.gemm(f"{name} in_proj_qkvz", count, tokens, 2 * hk * dk + 2 * hv * dv, plan.hidden)
        self.gemm(f"{name} in_proj_ba", count, tokens, 2 * hv, plan.hidden)
        self.gemm(f"{name} out_proj", count, tokens, plan.hidden, hv * dv)

    def mlp_tp(self, inter: int) -> int:
        """The tensor parallelism a dense MLP of ``inter`` columns runs at: tp, except where the
        backend caps a MoE model's dense MLPs at ``gcd(inter / block, tp)`` within one node
        (:data:`MLP_TP_CAPPING_BACKENDS`)."""
        plan = self.plan
        tp = plan.parallel.tp
        if plan.backend not in MLP_TP_CAPPING_BACKENDS or all(b.kind == "dense" for b, _, _ in plan.ffn):
            return tp
        capped = math.gcd(inter // QUANT_BLOCK.get(str(plan.config.quantization.gemm), 1), tp)
        return math.gcd(capped, plan.gpu.gpus_per_node) if capped > plan.gpu.gpus_per_node else capped

    def dense(self, name: str, count: int, inter: int, tokens: int) -> None:
        """A gated MLP sharded by tp (or the backend's capped tp, :meth:`mlp_tp`): gate/up
        column-parallel (n = 2 inter / tp), down row-parallel (k = inter / tp), and the SiLU x
        up element-wise op between them."""
        local = inter // self.mlp_tp(inter)
        self.gemm(f"{name} gate_up", count, tokens, 2 * local, self.plan.hidden)
        self.gemm(f"{name} down", count, tokens, self.plan.hidden, local)
        self.roofline(f"{name} activation", count, 6.0 * tokens * local, "SiLU(gate) x up: read 2 x inter/tp, write "
                      "inter/tp per token (bf16)")

    def moe(self, block: FfnLayer, count: int, label: str, tokens: int, has_prefill: bool) -> None:
        plan, par = self.plan, self.plan.parallel
        name = f"{label} moe"
        self.gemm(f"{name} router", count, tokens, block.experts, plan.hidden, unquantized=True)
        fields: dict[str, Any] = {
            "num_tokens": tokens * par.attention_dp, "hidden_size": block.hidden, "inter_size": block.inter,
            "topk": block.topk, "num_experts": block.experts, "moe_tp_size": par.moe_tp_size,
            "moe_ep_size": par.moe_ep}
        quant = plan.config.quantization.moe
        own = quant in MXFP4_KERNELS and quant == plan.config.checkpoint.moe
        if own:  # the checkpoint's mxfp4 experts run on the backend's default kernel for the GPU
            quant = MXFP4_DEFAULT_KERNEL.get((plan.backend, plan.gpu.sm_version // 10), quant)
        if quant is not None:
            fields["moe_dtype"] = quant
        self.op(f"{name} experts" + ("" if quant == plan.config.quantization.moe else f" ({quant} kernel)"),
                "moe", count, "moe", fields)
        if self.ops[-1].ms is None and own:
            # an mxfp4 checkpoint runs on whichever mxfp4 kernel the backend has for the GPU
            # (activations in bf16 on Hopper, in mxfp8 on Blackwell): the weights are the same (a
            # kernel named as the deployment's choice is kept: its miss is the answer)
            missed = self.ops.pop()
            for other in MXFP4_KERNELS:
                if other != quant:
                    self.op(f"{name} experts ({other} kernel)", "moe", count, "moe", {**fields, "moe_dtype": other})
                    if self.ops[-1].ms is not None:
                        break
                    self.ops.pop()
            else:
                self.ops.append(missed)
        if block.shared_inter:
            self.dense(f"{name} shared expert", count, block.shared_inter, tokens)
        if par.moe_ep > 1:
            self.alltoall(name, count, block, tokens, has_prefill)

    def alltoall(self, name: str, count: int, block: FfnLayer, tokens: int, has_prefill: bool) -> None:
        """Dispatch and combine of one MoE layer at moe_ep > 1: each rank sends its share of the
        group's tokens (``ceil(T x dp / (moe_tp x moe_ep))``); high-throughput kernels in a step
        with prefill, low-latency ones in a decode-only step."""
        plan, par = self.plan, self.plan.parallel
        per_rank = -(-tokens * par.attention_dp // (par.moe_tp_size * par.moe_ep))
        nodes = -(-par.moe_ep // plan.gpu.gpus_per_node)
        mode = "ht" if has_prefill else "ll"
        common = {"ep_size": par.moe_ep, "node_num": nodes, "hidden_size": block.hidden, "topk": block.topk,
                  "num_experts": block.experts, "num_tokens": per_rank}
        if "moe_a2a" in plan.versions:
            table, extra = "moe_a2a", dict[str, Any]()
            prefer = {"comm_backend": (lambda v: str(v).endswith("_" + mode))}
        elif "wideep_deepep_normal" in plan.versions or "wideep_deepep_ll" in plan.versions:
            table = "wideep_deepep_normal" if mode == "ht" else "wideep_deepep_ll"
            extra, prefer = {}, {}  # one op per mode
        else:
            for phase in ("dispatch", "combine"):
                self.not_covered(f"{name} {phase}", "communication", count,
                                 f"no {plan.system}/{plan.backend} version holds an all-to-all table "
                                 f"({', '.join(ALLTOALL_TABLES)})")
            return
        version = plan.versions[table]
        if "sms" in self.db.table(plan.system, plan.backend, version, table).spec.axes:
            extra["sms"] = DEEPEP_SMS
        for phase in ("dispatch", "combine"):
            fields = {**common, **extra, "phase": phase}
            before = len(self.ops)
            # the kernel class names the mode: the resolved comm_backend is cached per class
            cls = f"{'high-throughput' if mode == 'ht' else 'low-latency'} all-to-all"
            self.op(f"{name} {phase}", "communication", count, table, fields, prefer=prefer, kernel_class=cls)
            if "sms" in extra and self.ops[-1].ms is None:  # kernels without an SM setting are stored at 0
                del self.ops[before:]
                self.op(f"{name} {phase}", "communication", count, table, {**fields, "sms": 0}, prefer=prefer,
                        kernel_class=cls)
            if self.ops[-1].ms is None:
                self._gather_scatter(name, phase, count, block, per_rank, self.ops.pop())

    def _gather_scatter(self, name: str, phase: str, count: int, block: FfnLayer, per_rank: int,
                        missed: OpCost) -> None:
        """Dispatch / combine where the all-to-all table has no bucket for this group: an NCCL
        all-to-all over the EP group in which each rank sends its tokens to their top-k
        experts' ranks (``tokens per rank x min(topk, ep) x hidden`` elements), from the
        system's NCCL table; the op says so."""
        par = self.plan.parallel
        before = len(self.ops)
        self.collective(f"{name} {phase} (nccl alltoall: {missed.table} has no bucket)", count, "alltoall",
                        per_rank * min(block.topk, par.moe_ep) * block.hidden, par.moe_ep)
        if self.ops[-1].ms is None:  # neither answers: keep the all-to-all table's reason
            del self.ops[before:]
            self.ops.append(missed)

    def allreduce(self, name: str, count: int, elements: int) -> None:
        """All-reduce over the tp group: the backend's custom all-reduce table, else the system's
        NCCL table (the op's table says which)."""
        if count <= 0 or elements <= 0:
            return
        tp = self.plan.parallel.tp
        fields = {"op_name": "all_reduce", "num_gpus": tp, "message_size": elements}
        try:
            a = self.ask("custom_allreduce", fields)
        except _MISS as exc:
            self.notes.append(f"{name}: custom_allreduce does not answer ({exc.detail}); NCCL all_reduce instead")
            self.collective(name, count, "all_reduce", elements, tp)
            return
        shape = {k: v for k, v in a.fields.items() if k not in _SLOT_FIELDS}
        self.ops.append(OpCost(name, "communication", "custom_allreduce", a.version, a.kind, a.latency_ms, count,
                               shape, None, self.plan.backend))

    def collective(self, name: str, count: int, op: str, elements: int, gpus: int) -> None:
        """A collective from the system's NCCL table (the release its yaml names, else the newest)."""
        if count <= 0 or elements <= 0:
            return
        plan = self.plan
        if plan.nccl is None:
            self.not_covered(name, "communication", count, f"{plan.system} has no nccl table", "nccl")
            return
        self.op(name, "communication", count, "nccl", {"op_name": op, "num_gpus": gpus, "message_size": elements},
                backend="nccl", version=plan.nccl)
        missed = self.ops[-1]
        if missed.ms is None and gpus > 1 and "holds no bucket" in (missed.reason or ""):
            self.ops.pop()
            self.ops.append(self._wider_group(name, count, op, elements, gpus, missed))

    def _wider_group(self, name: str, count: int, op: str, elements: int, gpus: int, missed: OpCost) -> OpCost:
        """A collective over more GPUs than the table measured (across nodes): the table's
        answer at the largest measured group below it, plus what the wider group adds by the
        ring's bandwidth share over its slowest link and one hop latency per doubling
        (docs/estimate.md)."""
        plan, gpu = self.plan, self.plan.gpu
        nbytes = 2.0 * elements  # bfloat16 activations

        def share(n: int) -> float:  # bytes each rank moves per byte of the message
            return float(bus_factor(op, n))

        for group in (g for g in (64, 32, 16, 8, 4, 2) if g < gpus):
            try:
                a = self.ask("nccl", {"op_name": op, "num_gpus": group, "message_size": elements}, backend="nccl",
                             version=plan.nccl)
            except _MISS:
                continue
            extra = max(0.0, share(gpus) * nbytes / gpu.link_bw(gpus) - share(group) * nbytes / gpu.link_bw(group))
            hops = (gpus // group - 1).bit_length() * (2 if op == "all_reduce" else 1)
            ms = a.latency_ms + (extra + hops * gpu.p2p_latency) * 1e3
            return OpCost(f"{name} (nccl {group}-GPU {op} widened to {gpus})", "communication", "nccl", a.version,
                          ROOFLINE, ms, count, {"op_name": op, "num_gpus": gpus, "measured_group": group,
                                                "message_size": elements}, None, "nccl")
        return missed


__all__ = ["FLOOR_ELEMENTS", "FLOOR_POINTS", "GemmFloors", "StepPricer", "gemm_floors"]
