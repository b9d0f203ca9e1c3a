"""A dtype is the deployment's choice, not the model's (issues 21 and 25): every stored point of
the attention tables, asked by model and deployment with the row's own dtypes, answers that row
bit for bit; every dtype option of every command changes the answer's dtype to the one given,
or is refused with a typed error."""

from __future__ import annotations

import collections
import json
from typing import Any

import pytest
from tests.helpers import run_cli

import modperf
from modperf import errors as E
from modperf.data.buckets import NATIVE
from modperf.data.families import model_head_axis_tables
from modperf.data.families.base import DTYPE_KEYS, HEADS, TP
from modperf.data.loader import parallel_map
from modperf.model.estimate import COMPOSED_MLA_TABLES
from modperf.query.engine import QueryEngine
from modperf.query.resolve import SERVED_COLUMNS, derive, layer_kinds
from modperf.specs.layers import layer_schedule


def _askers(db: modperf.Database, table: str, phase: str) -> list[tuple[str, Any, bool]]:
    """Who asks a table whose rows record no model (GQA attention, the MLA kernels): every
    bundled model a layer of which runs on it, or which composes its MLA layers from it
    (estimate.COMPOSED_MLA_TABLES); each with its layer kind there and whether a question must
    name the kind (several run there)."""
    out = []
    for model in db.models.ids():
        cfg = db.models.get(model)
        kinds = [k for k, _ in layer_kinds(cfg, table, phase)]
        if kinds:
            out += [(model, k, len(kinds) > 1) for k in kinds]
        elif table in COMPOSED_MLA_TABLES and any(k.family == "mla_module" for k, _ in layer_schedule(cfg).groups()):
            out.append((model, None, False))
    return out


class _Walk:
    """One stored point per (attention table, model, dtype combination, tp) of the corpus, as the
    question a user asks: model, tp, the layer kind where the model runs several on the table,
    the row's dtypes and other keys, the point's shape -- everything the model fixes left out
    (modperf.query.resolve.derive) -- with the stored latency. The models are those the rows record;
    for tables whose rows record none, the first model (by id) of those that run the table
    (:func:`_askers`) whose geometry at some tp is the bucket's."""

    def __init__(self, db: modperf.Database) -> None:
        self.db = db
        self.points: dict[tuple[Any, ...], tuple[dict[str, Any], float]] = {}
        #: Buckets no deployment of the model that measured them can ask, by reason.
        self.unaskable: collections.Counter = collections.Counter()
        #: Buckets of tables that record no model whose geometry no bundled model has, by table.
        self.unmatched: collections.Counter = collections.Counter()
        self._derived: dict[tuple[Any, ...], dict[str, Any] | None] = {}
        self._askers: dict[tuple[str, str], list[tuple[str, Any, bool]]] = {}
        self._kinds: dict[tuple[str, str, str], list[Any]] = {}

    def kinds(self, model: str, table: str, phase: str) -> list[Any]:
        """The model's layer kinds on the table (modperf.query.resolve.layer_kinds), once per model."""
        ident = (model, table, phase)
        if ident not in self._kinds:
            self._kinds[ident] = [k for k, _ in layer_kinds(self.db.models.get(model), table, phase)]
        return self._kinds[ident]

    def fixed(self, keyed: Any, model: str, layer: Any, tp: int) -> dict[str, Any] | None:
        """The key columns ``model`` at ``tp`` fixes on this table (the dtypes it serves left out);
        None where its kv heads do not shard at this tp."""
        keys = frozenset(keyed.key_names) | frozenset(keyed.spec.axes)
        ident = (keyed.ref.table, model, layer.name if layer is not None else None, tp, keys)
        if ident not in self._derived:
            try:
                found = derive(self.db.models.get(model), keyed.family, keyed.ref.table, keyed.spec.phase, set(keys),
                               tp=tp, layer=layer.name if layer is not None else None).fields
                self._derived[ident] = {c: v for c, v in found.items() if c not in SERVED_COLUMNS}
            except E.ModperfError:
                self._derived[ident] = None
        return self._derived[ident]

    def add(self, keyed: Any, b: int, model: str, layer: Any, several: bool, tp: int, fixed: dict[str, Any]) -> None:
        ref, spec = keyed.ref, keyed.spec
        key = dict(zip(keyed.key_names, keyed.bucket_keys[b]))
        dtypes = tuple((c, key[c]) for c in sorted(DTYPE_KEYS) if c in key)
        ident = (ref.table, model, dtypes, tp)
        if ident in self.points:
            return
        fields: dict[str, Any] = {"table": ref.table, "system": ref.system, "backend": ref.backend,
                                  "version": ref.version, "model": model, "tp_size": tp}
        fields.update({c: v for c, v in key.items() if c not in (NATIVE, "local_num_heads", HEADS, TP, *fixed)})
        if several:
            fields["layer"] = layer.name
        lo = int(keyed.offsets[b])
        fields.update({a: int(keyed.axes[a][lo]) for a in spec.axes})
        self.points[ident] = (fields, float(keyed.latency[lo]))

    def recorded(self, keyed: Any) -> None:
        """A table whose rows record their models: each bucket asked by each of its models."""
        table, phase = keyed.ref.table, keyed.spec.phase
        for b, values in enumerate(keyed.bucket_keys):
            key = dict(zip(keyed.key_names, values))
            local = int(keyed.bucket_local[b])
            for model in keyed.bucket_models[b]:
                cfg = self.db.models.get(model)
                kinds = self.kinds(model, table, phase)
                fitting = [k for k in kinds if all(str(key[c]) == str(v) for c, v in k.fields_for(phase).items()
                                                   if c in key and c != "num_key_value_heads")]
                layer = fitting[0] if fitting else None
                if TP in key:
                    tp = int(key[TP])
                else:
                    native = layer.native_heads if layer is not None else cfg.native_heads
                    if native % local:  # a local count no tp of the model gives (128 of its 64 heads)
                        self.unaskable[(table, model, native, local)] += 1
                        continue
                    tp = native // local
                fixed = self.fixed(keyed, model, layer, tp)
                assert fixed is not None and all(str(key[c]) == str(v) for c, v in fixed.items()), (keyed.ref, b)
                self.add(keyed, b, model, layer, len(kinds) > 1, tp, fixed)

    def unrecorded(self, keyed: Any) -> None:
        """A table whose rows record no model: each bucket asked by the first model whose
        geometry at some tp is the bucket's (:func:`_askers`)."""
        table, phase = keyed.ref.table, keyed.spec.phase
        askers = self._askers.get((table, phase))
        if askers is None:
            askers = self._askers[(table, phase)] = _askers(self.db, table, phase)
        locals_ = sorted({int(x) for x in keyed.bucket_local})
        by_columns: dict[tuple[str, ...], dict[tuple[Any, ...], tuple[Any, ...]]] = {}
        for model, layer, several in askers:
            native = layer.native_heads if layer is not None else self.db.models.get(model).native_heads
            for local in (v for v in locals_ if native % v == 0):
                fixed = self.fixed(keyed, model, layer, native // local)
                if fixed is not None:
                    columns = tuple(sorted(fixed))
                    found = by_columns.setdefault(columns, {})
                    found.setdefault((local, *(str(fixed[c]) for c in columns)),
                                     (model, layer, several, native // local, fixed))
        for b, values in enumerate(keyed.bucket_keys):
            key = dict(zip(keyed.key_names, values))
            local = int(keyed.bucket_local[b])
            for columns, found in by_columns.items():
                asker = found.get((local, *(str(key[c]) for c in columns)))
                if asker is not None:
                    self.add(keyed, b, *asker)
                    break
            else:
                self.unmatched[table] += 1


def stored_points(db: modperf.Database) -> _Walk:
    refs = db.catalog.select(tables=model_head_axis_tables())
    parallel_map(db.load, refs, workers=2)  # the tables, read once (two cores)
    walk = _Walk(db)
    for ref in refs:
        keyed = db.load(ref)
        (walk.recorded if any(keyed.bucket_models) else walk.unrecorded)(keyed)
    return walk


@pytest.mark.slow
def test_every_stored_attention_point_asked_by_model_with_its_own_dtypes_answers_bit_for_bit(
        db: modperf.Database) -> None:
    """Issue 21: on main before this change, 402 of these 1,133 points were refused as
    contradictions (DeepSeek-V3, DeepSeek-V3.2 and the DeepSeek-V4 -FP8 checkpoints asked with
    bf16 or nvfp4 GEMMs, Kimi-K3, GLM-5 and MiniMax-M3 with fp8_block or nvfp4, ...)."""
    walk = stored_points(db)
    points = list(walk.points.values())
    assert len(points) == 1133 and {f["table"] for f, _ in points} == set(model_head_axis_tables())
    assert sum(f.get("gemm_type") not in (None, db.models.get(f["model"]).checkpoint.gemm) for f, _ in points) == 402
    # left out: buckets whose rank-local heads are no tp's share of their model's (64 or 128 of
    # Kimi-K3's 96, 128 of GLM-5's 64), and in tables whose rows record no model, geometries no
    # bundled model has (head-count sweeps)
    assert all(native % local for (_, _, native, local) in walk.unaskable) and sum(walk.unaskable.values()) == 248
    refs = db.catalog.select(tables=model_head_axis_tables())
    recorded = {r.table for r in refs if any(db.load(r).bucket_models)}
    unrecorded = {r.table for r in refs if not any(db.load(r).bucket_models)}
    assert set(walk.unmatched) <= unrecorded
    assert {"context_attention", "context_mla", "mla_bmm"} <= unrecorded - recorded
    engine = QueryEngine(db.store, db.models)  # no persisted plans: the engine's own answers
    wrong = []
    for fields, latency in points:
        try:
            answer = engine.query(fields, quality=False)
        except E.ModperfError as exc:
            wrong.append((fields, f"{type(exc).__name__}: {exc}"))
            continue
        if (answer.latency_ms, answer.kind) != (latency, "exact"):
            wrong.append((fields, (answer.latency_ms, answer.kind, latency)))
        elif any(str(answer.fields[c]) != str(fields[c]) for c in DTYPE_KEYS if c in fields):
            wrong.append((fields, {c: answer.fields[c] for c in DTYPE_KEYS if c in fields}))
    assert not wrong, f"{len(wrong)} of {len(points)}: {wrong[:3]}"


# --- every command x every dtype option it accepts -------------------------------------------------------
#
# Each command runs as a user runs it (a child process, 80 columns, --json). Options that answer
# are given together where the table measured them together (one process per run); the answer
# reports each one given. Options that do not apply are refused with a typed error, one run each.

QUERY = ["query", "mla_context_module", "--system", "h200_sxm", "--backend", "trtllm", "--version", "1.3.0rc20",
         "--model", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--batch-size", "4", "--isl", "2048"]
ESTIMATE = ["estimate", "--model", "deepseek-ai/DeepSeek-V3", "--system", "h200_sxm", "--backend", "vllm", "--tp",
            "8", "--isl", "2048", "--osl", "512", "--batch", "8"]
PREDICT = ["predict", "--model", "deepseek-ai/DeepSeek-V3", "--system", "h200_sxm", "--backend", "vllm", "--tp", "8",
           "--isl", "2048", "--osl", "512", "--batch", "8"]


@pytest.fixture(autouse=True)
def _eighty_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


def cli(argv: list[str]) -> tuple[int, dict[str, Any]]:
    """The command as a user runs it (a child process, 80 columns, JSON out)."""
    run = run_cli([*argv, "--json"], timeout=180)
    assert "Traceback" not in run.stderr, run.stderr
    return run.returncode, json.loads(run.stdout)


def refusal(argv: list[str]) -> tuple[int, dict[str, Any]]:
    code, doc = cli(argv)
    assert code in (1, 2) and set(doc) == {"error"}, doc
    return code, doc["error"]


def _reported(doc: dict[str, Any]) -> dict[str, set[str]]:
    """Every dtype an estimate's answers report, column -> values (attention scope: per table;
    model scope: per priced op, but the router and the logits, which read bf16 activations
    whatever the weights are served in)."""
    out: dict[str, set[str]] = collections.defaultdict(set)
    if doc.get("scope") == "model":
        for t in doc["tps"]:
            for op in (*t["prefill_ops"], *t["decode_ops"]):
                if op["ms"] is not None and not op["name"].endswith(("router", "logits")):
                    for c in DTYPE_KEYS & set(op["fields"]):
                        out[c].add(op["fields"][c])
    else:
        for columns in doc["dtypes"].values():
            for c, v in columns.items():
                out[c].add(v)
    return out


@pytest.mark.slow
def test_query_reports_every_dtype_given_and_refuses_the_rest() -> None:
    code, doc = cli([*QUERY, "--gemm-type", "bfloat16", "--kv-cache-dtype", "fp8", "--mla-dtype", "bfloat16"])
    assert code == 0 and doc["kind"] == "exact", doc
    assert {c: doc["fields"][c] for c in ("gemm_type", "kv_cache_dtype", "mla_dtype")} == {
        "gemm_type": "bfloat16", "kv_cache_dtype": "fp8", "mla_dtype": "bfloat16"}
    assert doc["derived"]["gemm_type"].startswith("bfloat16 as given (a deployment's choice); its checkpoint stores "
                                                  "them as fp8_block")
    code, error = refusal([*QUERY, "--attn-dtype", "fp8"])  # an MLA module table keys no attn_dtype
    assert (code, error["kind"]) == (2, "query_field") and "unknown field(s) 'attn_dtype'" in error["message"]
    code, error = refusal([*QUERY, "--gemm-type", "nvfp4"])  # never measured for DeepSeek-V3 here
    assert (code, error["kind"]) == (1, "not_covered")
    assert error["fix"].startswith("the table measured this key with gemm_type=fp8_block or gemm_type=bfloat16")


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "given", "served"), [
    (["--scope", "model", "--gemm-type", "bfloat16", "--kv-cache-dtype", "fp8", "--mla-dtype", "bfloat16"],
     {"gemm_type": "bfloat16", "gemm_dtype": "bfloat16", "kv_cache_dtype": "fp8", "mla_dtype": "bfloat16"},
     {"gemm": "bfloat16"}),
    (["--scope", "model", "--gemm-dtype", "bfloat16"], {"gemm_type": "bfloat16", "gemm_dtype": "bfloat16"},
     {"gemm": "bfloat16"}),
    # b200 vllm measured DeepSeek-V3's experts in nvfp4 beside fp8_block (h200: fp8_block only)
    (["--scope", "model", "--system", "b200_sxm", "--moe-dtype", "nvfp4"], {"moe_dtype": "nvfp4"}, {"moe": "nvfp4"}),
    (["--scope", "attention", "--gemm-dtype", "bfloat16", "--kv-cache-dtype", "fp8", "--mla-dtype", "bfloat16"],
     {"gemm_type": "bfloat16", "kv_cache_dtype": "fp8", "mla_dtype": "bfloat16"}, {"gemm": "bfloat16"}),
    (["--scope", "attention", "--gemm-type", "bfloat16"], {"gemm_type": "bfloat16"}, {"gemm": "bfloat16"})])
def test_estimate_reports_every_dtype_given(argv: list[str], given: dict[str, str], served: dict[str, str]) -> None:
    """Issue 25: `estimate --gemm-type bfloat16` answered the fp8 checkpoint's numbers."""
    code, doc = cli([*ESTIMATE, *argv])
    assert code == 0, doc
    found = _reported(doc)
    assert {c: found[c] for c in given} == {c: {v} for c, v in given.items()}
    for part, value in served.items():
        assert doc["served"][part] == value and doc["served"]["checkpoint"][part] == "fp8_block"
    assert doc["served"]["model"].startswith("deepseek-ai/DeepSeek-V3@")
    assert doc["notes"][0].startswith("dtypes chosen: deepseek-ai/DeepSeek-V3 served with its ")


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "kind", "message"), [
    (["--scope", "model", "--attn-dtype", "fp8"], "option_value",  # DeepSeek-V3 runs no GQA table
     "attn_dtype=fp8: no table this estimate prices"),
    (["--scope", "attention", "--bmm-dtype", "fp8"], "option_value",  # vllm has MLA modules: nothing composed
     "bmm_dtype=fp8: no table this estimate prices (mla_context_module, mla_generation_module) keys bmm_dtype"),
    (["--scope", "attention", "--moe-dtype", "nvfp4"], "usage", "moe_dtype applies to scope model only"),
    (["--gemm-type", "bfloat16", "--gemm-dtype", "fp8_block"], "usage",
     "gemm_type=bfloat16 and gemm_dtype=fp8_block both name the dtype of deepseek-ai/DeepSeek-V3's linear layers")])
def test_estimate_refuses_a_dtype_it_would_not_price(argv: list[str], kind: str, message: str) -> None:
    code, error = refusal([*ESTIMATE, *argv])
    assert (code, error["kind"]) == (2, kind) and error["message"].startswith(message), error


@pytest.mark.slow
@pytest.mark.parametrize(("argv", "part", "value"), [
    (["--gemm-quant", "bfloat16"], "gemm", "bfloat16"),
    (["--system", "b200_sxm", "--moe-quant", "nvfp4"], "moe", "nvfp4")])
def test_predict_reports_the_dtype_given(db: modperf.Database, argv: list[str], part: str, value: str) -> None:
    from modperf.serving.predict import deployment_from_row, predict

    code, doc = cli([*PREDICT, *argv])
    assert code == 0, doc
    assert doc["served"][part] == value and doc["served"]["checkpoint"][part] == "fp8_block"
    assert doc["served"]["model"].startswith("deepseek-ai/DeepSeek-V3@")
    system = doc["deployment"]["system"]
    own = predict(db, deployment_from_row({"model_path": "deepseek-ai/DeepSeek-V3", "system": system,
                                           "backend": "vllm", "mode": "agg", "isl": 2048, "osl": 512,
                                           "batch_size": 8, "tp_size": 8}))
    assert own.served[part] == "fp8_block" and own.ttft_ms != doc["ttft_ms"]


@pytest.mark.slow
def test_predict_takes_a_named_width_in_the_checkpoints_layout_and_refuses_the_rest() -> None:
    """silicon_sample.csv names widths (fp8): on a block-scaled fp8 checkpoint that is its layout,
    fp8_block, and the answer says so (docs/serving.md, "Served dtypes")."""
    code, doc = cli([*PREDICT, "--gemm-quant", "fp8"])
    assert code == 0 and doc["served"]["gemm"] == "fp8_block" and doc["served"]["model"] == "deepseek-ai/DeepSeek-V3"
    assert "gemm dtype fp8 named; the checkpoint stores these weights as fp8_block (served as such)" in doc["notes"]
    qwen = ["predict", "--model", "Qwen/Qwen3-32B", "--system", "h200_sxm", "--backend", "vllm", "--tp", "2",
            "--isl", "2048", "--osl", "512", "--batch", "8"]
    code, error = refusal([*qwen, "--moe-quant", "fp8"])  # a dense model has no experts
    assert (code, error["kind"]) == (2, "query_field")
    assert error["message"].startswith("moe_quant_mode fp8: Qwen/Qwen3-32B has no MoE layers")
    code, error = refusal([*PREDICT, "--gemm-quant", "nvfp4"])  # no h200 vllm table measured nvfp4 GEMMs for it
    assert (code, error["kind"]) == (1, "not_covered")
    assert "the table measured this key with gemm_type=fp8_block" in error["message"]
