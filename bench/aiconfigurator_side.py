"""The best tool, side by side: aiconfigurator-core's answer for a held-out point of a table.

Used by bench/accuracy.py. Nothing here imports aiconfigurator: the tool runs in a child
process (bench/aiconfigurator_child.py, JSON lines over a pipe). For each held-out point this
side

1. writes the table *without that point* (every raw row the loader merged into it) to a fresh
   systems root laid out as the tool expects (``<system>.yaml`` and
   ``data/<system>/<family>/<backend>/<version>/<table>_perf.parquet``), so the tool, like
   modperf, answers from the rest of the table and nothing else (its shared layer, which
   fills a shape from sibling versions, is off);
2. asks the tool for the point through the op its model code builds for that table (the op's
   ``OpSpec`` JSON wire form: the local heads, dtypes, and for module tables the model
   geometry from the HF config), evaluated at the point's batch, sequence and prefix.

Two guards keep the comparison honest:

- *mapping*: a point counts only if the tool, given the full table, returns the stored
  latency bit for bit (then the op, its key and its axes address exactly this row). Tables
  where the tool adds a correction to every answer (DeepSeek-V4 context modules: top-k and
  prefix kernel deltas; generation attention: the mean of five kv lengths within +-10 %)
  fail this for every point and are reported as not comparable.
- *no sibling rows*: the tool keys some tables more coarsely than modperf (DSA rows of
  several kernel lanes or models share one grid). If its held-out answer equals a latency
  stored anywhere in the table, it answered from another row at the same coordinates, not by
  interpolation; such points are left out and counted.

Families the tool has no op for (the sparse-kernel tables it reads only inside composite
corrections) are reported as not drivable, with the reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import modperf
from modperf.data.buckets import NATIVE
from modperf.data.families.base import HEADS, MODEL
from modperf.data.reader import read_table

CHILD = Path(__file__).with_name("aiconfigurator_child.py")

#: Why a family cannot be asked (no op of the tool reads its table as a lookup).
NOT_DRIVABLE = {
    "sparse_kernel": "no tool op reads these tables as a lookup: the tool uses them only inside composite "
                     "corrections (DeepSeek-V4 prefix / top-k deltas, DSA context-parallel composition)",
}

_KV = {"fp8_e4m3": "fp8"}  # the tool's KV-cache dtype names


class NotDrivable(Exception):
    """The tool cannot be asked for this point (the message says why)."""


class Tool:
    """The child process and the temporary systems roots it reads."""

    def __init__(self, python: str | None = None) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="modperf-tool-"))
        self._n = 0
        self.proc = subprocess.Popen([python or sys.executable, str(CHILD)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        hello = json.loads(self.proc.stdout.readline() or '{"ready": false, "error": "child exited"}')
        self.ready = bool(hello.get("ready"))
        self.version = hello.get("version")
        self.error = hello.get("error")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def ask(self, slot: tuple[str, str, str], root: Path, queries: list[list[Any]]) -> tuple[list, list]:
        system, backend, version = slot
        self.proc.stdin.write(json.dumps({"root": str(root), "system": system, "backend": backend,
                                          "version": version, "queries": queries}) + "\n")
        reply = json.loads(self.proc.stdout.readline())
        return reply["latency"], reply["error"]

    def root_with(self, ref: modperf.TableRef, table: pa.Table) -> Path:
        """A fresh systems root holding ``table`` as the file of ``ref`` (a new directory every
        time: the tool's loaded tables must never be confused between variants)."""
        path = Path(ref.path)
        systems = path.parents[4].parent  # <systems>/data/<system>/<family>/<backend>/<version>/<file>
        rel = path.relative_to(systems)
        self._n += 1
        root = self.tmp / f"r{self._n}"
        (root / rel.parent).mkdir(parents=True)
        shutil.copy(systems / f"{ref.system}.yaml", root)
        meta = path.parent / "collection_meta.yaml"
        if meta.exists():
            shutil.copy(meta, root / rel.parent)
        name = rel.name if rel.suffix == ".parquet" else rel.name.rsplit(".", 1)[0] + ".parquet"
        pq.write_table(table, root / rel.parent / name)
        return root

    def drop_root(self, root: Path) -> None:
        shutil.rmtree(root, ignore_errors=True)


class RawTable:
    """The table's stored rows, for writing variants without a held-out point."""

    def __init__(self, keyed: modperf.KeyedTable) -> None:
        self.keyed = keyed
        self.table = read_table(Path(keyed.ref.path), as_stored=True)
        self.columns = {c: self.table.column(c) for c in self.table.column_names}
        self.latency = np.asarray(self.table.column("latency").to_numpy(zero_copy_only=False), dtype=np.float64)
        natives = None
        if MODEL in self.columns:
            models = self.columns[MODEL].to_pylist()
            natives = np.array([keyed.model_native.get(m, -1) for m in models])
        self.native = natives

    def rows_of(self, b: int, p: int) -> np.ndarray:
        """Mask of the stored rows the loader merged into point ``p`` of bucket ``b``."""
        keyed = self.keyed
        mask = np.ones(self.table.num_rows, dtype=bool)
        for name, value in zip(keyed.key_names, keyed.bucket_keys[b]):
            if name == NATIVE:
                if self.native is not None:
                    mask &= self.native == int(value)
                continue
            if name not in self.columns:
                continue
            mask &= np.asarray(pc.equal(self.columns[name], pa.scalar(value)).to_numpy(zero_copy_only=False))
        for a in keyed.spec.axes:
            mask &= np.asarray(pc.equal(self.columns[a], int(keyed.axes[a][p])).to_numpy(zero_copy_only=False))
        return mask

    def mates(self, p: int) -> np.ndarray:
        """Mask of the stored rows at the coordinates of point ``p`` (its axes and head count),
        whatever their other keys: the rows a coarser key than modperf's could answer from."""
        keyed = self.keyed
        b = int(np.searchsorted(keyed.offsets, p, side="right") - 1)
        mask = np.ones(self.table.num_rows, dtype=bool)
        for a in keyed.spec.axes:
            mask &= np.asarray(pc.equal(self.columns[a], int(keyed.axes[a][p])).to_numpy(zero_copy_only=False))
        if HEADS in self.columns and HEADS in keyed.key_names:
            value = keyed.bucket_keys[b][keyed.key_names.index(HEADS)]
            mask &= np.asarray(pc.equal(self.columns[HEADS], int(value)).to_numpy(zero_copy_only=False))
        return mask

    def without(self, mask: np.ndarray) -> pa.Table:
        return self.table.filter(pa.array(~mask))


def point_query(keyed: modperf.KeyedTable, db: modperf.Database, b: int, p: int) -> list[Any]:
    """The tool's question for point ``p`` of bucket ``b``: [op, is_context, batch, s, prefix]."""
    fam = keyed.family.name
    if fam in NOT_DRIVABLE:
        raise NotDrivable(NOT_DRIVABLE[fam])
    table = keyed.ref.table
    key = dict(zip(keyed.key_names, keyed.bucket_keys[b]))
    ax = {a: int(keyed.axes[a][p]) for a in keyed.spec.axes}
    local = int(keyed.bucket_local[b])
    kv = _KV.get(str(key.get("kv_cache_dtype")), key.get("kv_cache_dtype"))
    name = {"name": "q", "scale_factor": 1.0}
    if table == "gemm":
        op = {"Gemm": {**name, "n": ax["n"], "k": ax["k"], "quant_mode": key["gemm_dtype"], "scale_num_tokens": 1,
                       "low_precision_input": False, "seq_split": 1, "below_grid_sol": False}}
        return [op, False, ax["m"], 1, 0]
    if table == "mla_bmm":
        op = {"MlaBmm": {**name, "num_heads": local, "quant_mode": key["bmm_dtype"],
                         "is_pre": key["op_name"] == "mla_gen_pre"}}
        return [op, False, ax["num_tokens"], 1, 0]
    if not {"batch_size", "isl", "step"} <= set(ax):
        raise NotDrivable(f"{table}: the bench maps attention, gemm and mla_bmm tables to the tool's ops only")
    b_, isl, step = ax["batch_size"], ax["isl"], ax["step"]
    context = keyed.spec.phase == "context"
    where = [True, b_, isl, step] if context else [False, b_, isl + step, 0]
    if table in ("context_attention", "generation_attention"):
        fields = {**name, "n": local, "n_kv": int(key["num_key_value_heads"]), "head_size": int(key["head_dim"]),
                  "window_size": int(key["window_size"]), "kv_cache_dtype": kv}
        if context:
            op = {"ContextAttention": {**fields, "fmha_quant_mode": key["attn_dtype"], "use_qk_norm": False,
                                       "cp_size": 1, "lane_order": [key["kernel_source"]]}}
        else:
            op = {"GenerationAttention": {**fields, "lane_order": [key["kernel_source"]]}}
        return [op, *where]
    if table == "context_mla":
        op = {"ContextMla": {**name, "num_heads": local, "kv_cache_dtype": kv, "fmha_quant_mode": key["mla_dtype"],
                             "cp_size": 1}}
        return [op, *where]
    if table == "generation_mla":
        return [{"GenerationMla": {**name, "num_heads": local, "kv_cache_dtype": kv}}, *where]
    if table in ("wideep_context_mla", "wideep_generation_mla"):
        fields = {**name, "num_heads": local, "kv_cache_dtype": kv, "fmha_quant_mode": key["mla_dtype"],
                  "attn_backend": key["kernel_source"]}
        if context:
            return [{"WideEpContextMla": {**fields, "cp_size": 1}}, *where]
        # wide-EP decode rows store the kv length in isl (step 0)
        return [{"WideEpGenerationMla": fields}, False, b_, isl, 0]
    native = int(key[NATIVE]) if NATIVE in key else None
    model = keyed.bucket_models[b][0] if keyed.bucket_models[b] else None
    config = db.models.get(model) if model else None
    gemm = key.get("gemm_type")
    dtypes = {"kv_cache_dtype": kv, "fmha_quant_mode": key.get("mla_dtype"), "gemm_quant_mode": gemm}
    if table in ("mla_context_module", "mla_generation_module"):
        kind = "MlaModuleContext" if context else "MlaModuleGeneration"
        return [{kind: {**name, "num_heads": local, **dtypes, "native_num_heads": native}}, *where]
    if config is None:
        raise NotDrivable("no model recorded for the bucket")
    get = config.text.get
    if table in ("dsa_context_module", "dsa_generation_module"):
        skip = str(key["op_name"]).endswith("_skip_indexer")
        op = {**name, "num_heads": local, **dtypes, "architecture": config.architectures[0],
              "index_topk": int(get("index_topk")), "cp_size": 1, "full_frac": 0.0 if skip else 1.0,
              "attn_projection_quant_modes": {"q": gemm, "kv": gemm, "o": gemm, "indexer": gemm}}
        return [{"DsaContext" if context else "DsaGeneration": op}, *where]
    if fam == "dsv4":
        ratio = int(key["compress_ratio"])
        op = {**name, "attn_kind": {4: "Csa", 128: "Hca"}.get(ratio, "Swa"), "num_heads": local,
              "native_heads": native, "tp_size": max(1, native // local), **dtypes,
              "architecture": config.architectures[0], "cp_size": 1, "window_size": int(get("sliding_window")),
              "hidden_size": int(get("hidden_size")), "q_lora_rank": int(get("q_lora_rank")),
              "o_lora_rank": int(get("o_lora_rank")), "head_dim": int(get("head_dim")),
              "rope_head_dim": int(get("qk_rope_head_dim")), "index_n_heads": int(get("index_n_heads")),
              "index_head_dim": int(get("index_head_dim")), "index_topk": int(get("index_topk")),
              "o_groups": int(get("o_groups"))}
        return [{"Dsv4Context" if context else "Dsv4Generation": op}, *where]
    if fam == "msa":
        sparse = get("sparse_attention_config") or {}
        tp = max(1, native // local)
        op = {**name, "num_heads": local, "num_kv_heads": max(1, int(get("num_key_value_heads")) // tp),
              "hidden_size": int(get("hidden_size")), "head_dim": int(get("head_dim")),
              "v_head_dim": int(get("v_head_dim", get("head_dim"))),
              "index_n_heads": int(sparse.get("sparse_num_index_heads", 4)),
              "index_head_dim": int(sparse.get("sparse_index_dim", 128)),
              "index_topk": int(sparse.get("sparse_topk_blocks", 16)) * int(sparse.get("sparse_block_size", 128)),
              "block_size": int(sparse.get("sparse_block_size", 128)), **dtypes,
              "dsa_architecture": "GlmMoeDsaForCausalLM", "dsa_scale_k": 1.0}
        return [{"MsaContext" if context else "MsaGeneration": op}, *where]
    raise NotDrivable(f"no tool op mapped for {table}")


#: Tables whose answers add a table-independent term to the looked-up value (the tool's fused
#: extras of context attention: RoPE / qk-norm / KV-write memory ops, x1.1). The term is the
#: full-table answer minus the stored latency at the same point; it is subtracted from the
#: held-out answer, leaving the tool's estimate of the table value.
ADDITIVE_EXTRAS = {"context_attention"}

#: Tables the tool never answers with the stored value, and why (not comparable).
NOT_COMPARABLE = {
    "generation_attention": "the tool answers the mean of five kv lengths within +-10 % of the query, "
                            "not the table value",
}


@dataclass
class ToolAnswers:
    """The tool's held-out answers for a list of points of one table."""

    latency: list[float | None]  # None unless status is "ok"
    status: list[str]  # ok | unmapped | refused | sibling | not drivable
    note: str = ""  # why the whole table is not asked or not comparable

    def count(self, status: str) -> int:
        return sum(1 for s in self.status if s == status)


def held_out_answers(tool: Tool, db: modperf.Database, keyed: modperf.KeyedTable,
                     points: list[tuple[int, int]]) -> ToolAnswers:
    """For every (bucket, point): the tool's answer from the table without that point (module
    doc: the mapping and sibling-row guards decide which answers count)."""
    ref = keyed.ref
    n = len(points)
    table = ref.table
    if keyed.family.name in NOT_DRIVABLE:
        return ToolAnswers([None] * n, ["not drivable"] * n, "not drivable: " + NOT_DRIVABLE[keyed.family.name])
    if table in NOT_COMPARABLE:
        return ToolAnswers([None] * n, ["unmapped"] * n, "not comparable: " + NOT_COMPARABLE[table])
    try:
        queries = [point_query(keyed, db, b, p) for b, p in points]
    except NotDrivable as exc:
        return ToolAnswers([None] * n, ["not drivable"] * n, f"not drivable: {exc}")
    slot = (ref.system, ref.backend, ref.version)
    raw = RawTable(keyed)
    root = tool.root_with(ref, raw.table)
    full, _ = tool.ask(slot, root, queries)
    tool.drop_root(root)
    additive = table in ADDITIVE_EXTRAS
    latency: list[float | None] = []
    status: list[str] = []
    for (b, p), query, at_full in zip(points, queries, full):
        stored = float(keyed.latency[p])
        if at_full is None or (at_full != stored and not additive):
            latency.append(None)
            status.append("unmapped")
            continue
        extra = at_full - stored
        rows = raw.rows_of(b, p)
        if int(rows.sum()) != int(keyed.sources[p]):
            raise AssertionError(f"{ref.label}: point {p} merges {keyed.sources[p]} rows, {rows.sum()} matched")
        root = tool.root_with(ref, raw.without(rows))
        got, _ = tool.ask(slot, root, [query])
        tool.drop_root(root)
        if got[0] is None:
            latency.append(None)
            status.append("refused")
            continue
        value = got[0] - extra
        mates = raw.latency[raw.mates(p) & ~rows]
        if np.any(np.abs(mates - value) <= 1e-12 * np.abs(mates)):
            latency.append(None)
            status.append("sibling")
            continue
        latency.append(value)
        status.append("ok")
    note = "additive extras of the tool's op subtracted (full-table answer - stored)" if additive else ""
    return ToolAnswers(latency, status, note)


__all__ = ["NOT_COMPARABLE", "NOT_DRIVABLE", "NotDrivable", "RawTable", "Tool", "ToolAnswers", "held_out_answers",
           "point_query"]
