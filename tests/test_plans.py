"""Persisted query plans (modperf.fast.plans): an answer from a plan is the engine's, bit for bit,
and a plan is never used once anything it depends on changed. Correctness only, never speed.

Every test keeps its cache in its own tmp folder (the ``cache_dir`` fixture)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.helpers import REPO, point_fields, run_cli
from tests.test_cache import MLA, POINTS, _rewrite, answers, bits, copy_root

import modperf
from modperf.data import scan_cache
from modperf.fast import plans
from modperf.query.interp import EXTRAPOLATED_CELL

#: Tables of three families and both phases (exact, blended and filled points of each).
TABLES = [("h200_sxm", "trtllm", "1.3.0rc20", "mla_context_module"),
          ("h200_sxm", "trtllm", "1.3.0rc20", "mla_generation_module"),
          ("h200_sxm", "sglang", "0.5.14", "context_attention"),
          ("h200_sxm", "sglang", "0.5.14", "generation_attention"),
          ("h200_sxm", "sglang", "0.5.14", "dsv4_csa_context_module"),
          ("h100_sxm", "vllm", "0.24.0", "context_attention")]


#: A scan is remembered (and a plan written under it) only when no folder it lists changed within
#: scan_cache.RACY_NS; the tests' copies are fresh, so the window is made short and waited out.
WINDOW_NS = 50_000_000
#: The window a child process keeps (nothing patches it there).
CHILD_WINDOW_S = scan_cache.RACY_NS / 1e9


@pytest.fixture
def root(tmp_path: Path, db: modperf.Database, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(scan_cache, "RACY_NS", WINDOW_NS)
    out = copy_root(tmp_path, db)
    time.sleep(2 * WINDOW_NS / 1e9)
    return out


def plan_files(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / plans.FOLDER).glob("*" + plans.SUFFIX))


def questions(reference: modperf.Database) -> list[dict[str, Any]]:
    """Per table, measured points of its first buckets and, beside each, points between and
    beyond measured values along each axis."""
    out = []
    for slot in TABLES:
        try:
            keyed = reference.table(*slot)
        except modperf.ModperfError:
            continue
        for b in range(0, min(keyed.n_buckets, 40), 4):
            p = int(keyed.offsets[b])
            fields = point_fields(keyed, b, p)
            out.append(fields)
            for axis in keyed.spec.axes:
                value = fields[axis]
                for moved in (value + 1, value * 3 // 2 + 1, value * 4 + 7):
                    out.append({**fields, axis: moved})
            out += filled_cells(reference, fields)
    return out


def filled_cells(reference: modperf.Database, fields: dict[str, Any], count: int = 2) -> list[dict[str, Any]]:
    """Points on lattice cells of the fields' grid that no measurement holds but the fill
    extrapolated (inside the measured range: a plan answers them)."""
    try:
        grid = reference.queries.grid(fields)
    except modperf.ModperfError:
        return []
    out = []
    for flat in np.flatnonzero(grid.state.ravel() == EXTRAPOLATED_CELL)[:count]:
        at = np.unravel_index(int(flat), grid.shape)
        out.append({**fields, **{a: int(grid.values[i][at[i]]) for i, a in enumerate(grid.axes)}})
    return out


def noted(reference: modperf.Database, per_table: int = 6) -> list[dict[str, Any]]:
    """Measured points that quality findings name (``modperf check --quality``), a few per
    table of :data:`TABLES` that has them."""
    out = []
    for slot in TABLES:
        keyed = reference.table(*slot)
        engine = reference.queries
        groups = engine.index(keyed).groups
        found = []
        for group, by_point in engine._whole_findings(keyed).items():
            for b in groups[group]:
                for p in range(int(keyed.offsets[b]), int(keyed.offsets[b + 1])):
                    coords = tuple(int(keyed.axes[a][p]) for a in keyed.spec.axes)
                    if (int(keyed.bucket_local[b]), coords) in by_point:
                        found.append(point_fields(keyed, b, p))
        out += found[:per_table]
    return out


def answered(database: modperf.Database, fields: dict[str, Any], quality: bool = False) -> Any:
    try:
        return database.answer(fields, quality=quality)
    except modperf.ModperfError as exc:
        return type(exc).__name__, str(exc)


def test_answers_from_plans_are_the_engines_bit_for_bit(cache_dir: Path) -> None:
    reference = modperf.open(cache=False)
    asked = questions(reference)
    assert len(asked) > 300
    writer = modperf.open()
    for fields in asked:  # resolves (and writes) every plan
        answered(writer, fields)
    assert plan_files(cache_dir)
    reader = modperf.open()
    assert reader._plans is not None
    kinds: dict[str, int] = {}
    for fields in asked:
        got = reader._plans.answer(fields, False)
        want = answered(reference, fields)
        if got is None:  # left to the engine: a refusal, a point past the measured range, a lane rule
            assert answered(reader, fields) == want
            continue
        assert got == want
        assert got.to_dict() == want.to_dict()
        assert float(got.latency_ms).hex() == float(want.latency_ms).hex()
        assert [type(v) for v in got.fields.values()] == [type(v) for v in want.fields.values()]
        kinds[got.kind] = kinds.get(got.kind, 0) + 1
    assert kinds.get("exact", 0) >= 40 and kinds.get("interpolated", 0) >= 40, kinds
    assert kinds.get("extrapolated", 0) >= 1, kinds  # a filled cell inside the measured range


_CHILD = """
import json, sys
import modperf
db = modperf.open()
out = [db.answer(f, quality=False).to_dict() for f in json.loads(sys.argv[1])]
print(json.dumps({"answers": out, "numpy": "numpy" in sys.modules, "pyarrow": "pyarrow" in sys.modules,
                  "engine": db._query_engine is not None}))
"""


def _child(fields: list[dict[str, Any]], env: dict[str, str] | None = None) -> dict[str, Any]:
    run = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(fields)], capture_output=True, text=True,
                         env=env or dict(os.environ), timeout=180)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_a_process_answering_from_plans_imports_neither_numpy_nor_pyarrow(cache_dir: Path) -> None:
    fields = [{**MLA, **p} for p in POINTS[:2]] + [
        {"table": "context_attention", "system": "h200_sxm", "backend": "sglang", "version": "0.5.14",
         "model": "Qwen/Qwen3-32B", "tp_size": 4, "batch_size": 2, "isl": 3000}]
    want = [modperf.open(cache=False).answer(f, quality=False).to_dict() for f in fields]
    first, second = _child(fields), _child(fields)
    assert first["answers"] == second["answers"] == want
    assert first["numpy"] and first["engine"]
    assert not second["numpy"] and not second["pyarrow"] and not second["engine"]


def test_quality_answers_come_from_a_plan_only_where_the_group_has_no_notes(cache_dir: Path) -> None:
    fields = {**MLA, **POINTS[0]}
    want = modperf.open(cache=False).answer(fields)
    modperf.open().answer(fields, quality=False)  # written without looking at quality
    reader = modperf.open()
    assert reader._plans is not None
    assert reader._plans.answer(fields, True) is None  # "unknown": the engine answers
    assert reader._plans.answer(fields, False) is not None
    assert reader.answer(fields) == want  # (rewrites the plan, having looked)
    again = modperf.open()
    assert again._plans is not None
    got = again._plans.answer(fields, True)
    assert want.quality is None and got == want


def test_edited_source_gives_the_fresh_answer(cache_dir: Path, root: Path) -> None:
    old = answers(modperf.open(root))
    assert len(plan_files(cache_dir)) == 1
    path = next(root.rglob("*_perf.parquet"))
    _rewrite(path, 2.0, keep_mtime=True)
    fresh = answers(modperf.open(root, cache=False))
    assert fresh[0]["latency_ms"] == 2.0 * old[0]["latency_ms"]
    reader = modperf.open(root)
    assert reader._plans is not None and reader._plans.answer({**MLA, **POINTS[0]}, False) is None
    assert answers(reader) == fresh
    assert answers(modperf.open(root)) == fresh  # the rewritten plan serves it afterwards


@pytest.mark.parametrize("damage", ["truncated", "flipped", "emptied"])
def test_a_damaged_plan_is_never_served(cache_dir: Path, root: Path, damage: str) -> None:
    want = answers(modperf.open(root, cache=False))
    assert answers(modperf.open(root)) == want
    (plan,) = plan_files(cache_dir)
    data = bytearray(plan.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped":
        data[len(data) // 3] ^= 0x01
    else:
        data = bytearray()
    plan.write_bytes(bytes(data))
    reader = modperf.open(root)
    assert reader._plans is not None and reader._plans.answer({**MLA, **POINTS[0]}, False) is None
    assert answers(reader) == want
    assert bits(answers(modperf.open(root))) == bits(want)


def test_a_changed_data_root_or_model_config_is_a_miss(cache_dir: Path, root: Path, tmp_path: Path,
                                                         fixtures: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fields = {**MLA, **POINTS[0]}

    def plan_answers() -> bool:
        reader = modperf.open(root)
        assert reader._plans is not None
        return reader._plans.answer(fields, False) is not None

    configs = tmp_path / "configs"
    configs.mkdir()
    monkeypatch.setenv("MODPERF_MODEL_CONFIGS", str(configs))
    modperf.open(root).answer(fields, quality=False)
    assert plan_answers()
    # a folder added to the data root (the scan would now see it)
    (root / "h200_sxm" / "new_family").mkdir()
    assert not plan_answers()
    time.sleep(2 * WINDOW_NS / 1e9)  # (a scan just after a change is not remembered, nor a plan written under it)
    modperf.open(root).answer(fields, quality=False)
    assert plan_answers()
    # a model config added beside the others
    shutil.copyfile(next(fixtures.rglob("*_config.json")), configs / "org--Added_config.json")
    assert not plan_answers()


def test_another_numpy_or_code_is_a_miss(cache_dir: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fields = {**MLA, **POINTS[0]}
    modperf.open(root).answer(fields, quality=False)
    reader = modperf.open(root)
    assert reader._plans is not None and reader._plans.answer(fields, False) is not None
    monkeypatch.setattr(plans, "numpy_fingerprint", lambda: "another numpy")
    reader = modperf.open(root)
    assert reader._plans is not None and reader._plans.answer(fields, False) is None
    monkeypatch.undo()
    monkeypatch.setattr(plans, "code_fingerprint", lambda: "other code")
    reader = modperf.open(root)
    assert reader._plans is not None and reader._plans.answer(fields, False) is None


def test_a_changed_gpu_spec_file_is_a_miss(cache_dir: Path, root: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from modperf.specs import roofline
    spec = tmp_path / "h200_sxm.yaml"
    spec.write_bytes(roofline.spec_file("h200_sxm").read_bytes())  # type: ignore[union-attr]
    monkeypatch.setattr(roofline, "spec_file", lambda system, systems_dir=None: spec)
    fields = {**MLA, **POINTS[0]}
    modperf.open(root).answer(fields, quality=False)
    reader = modperf.open(root)
    assert reader._plans is not None and reader._plans.answer(fields, False) is not None
    spec.write_text(spec.read_text() + "\n# edited\n")
    reader = modperf.open(root)
    assert reader._plans is not None and reader._plans.answer(fields, False) is None


def test_points_a_plan_leaves_to_the_engine_get_the_engines_answer_or_error(cache_dir: Path, root: Path) -> None:
    reference = modperf.open(root, cache=False)
    modperf.open(root).answer({**MLA, **POINTS[0]}, quality=False)
    for point, why in (({"batch_size": 1, "isl": 40000}, "past the measured range"),
                       ({"batch_size": 4096, "isl": 1 << 20}, "refused"),
                       ({"batch_size": " 4", "isl": 1024}, "text the query strips"),
                       ({"batch_size": "+4", "isl": 1024}, "text with a sign"),
                       ({"batch_size": 4.0, "isl": 1024}, "a float")):
        fields = {**MLA, **point}
        reader = modperf.open(root)
        assert reader._plans is not None and reader._plans.answer(fields, False) is None, why
        assert answered(reader, fields) == answered(reference, fields), why
    # axis values as text of ASCII digits (the command line's) are read as the query reads them
    fields = {**MLA, "batch_size": "3", "isl": "1500"}
    reader = modperf.open(root)
    assert reader._plans is not None
    got = reader._plans.answer(fields, False)
    assert got is not None and got == reference.answer(fields, quality=False)
    assert got.fields["batch_size"] == 3 and got.kind == "interpolated"


_FILL = """
import json, sys
import modperf
db = modperf.open(sys.argv[1])
print(json.dumps([float(db.answer({**json.loads(sys.argv[3]), **p}, quality=False).latency_ms).hex()
                  for p in json.loads(sys.argv[2])]))
"""


def test_processes_writing_plans_at_once_all_answer_right(cache_dir: Path, root: Path) -> None:
    want = bits(answers(modperf.open(root, cache=False)))
    time.sleep(CHILD_WINDOW_S + 0.1)  # (the children keep the whole window)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [sys.executable, "-c", _FILL, str(root), json.dumps(POINTS[:2]), json.dumps(MLA)]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
             for _ in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        assert json.loads(out) == want[:2]
    assert len(plan_files(cache_dir)) == 1
    assert not [p for p in (cache_dir / plans.FOLDER).iterdir() if p.name.endswith(".modperf-tmp")]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=180)
    assert json.loads(done.stdout) == want[:2]


def test_cache_info_counts_plans_and_clear_removes_them(cache_dir: Path, root: Path) -> None:
    modperf.open(root).answer({**MLA, **POINTS[0]}, quality=False)
    assert len(plan_files(cache_dir)) == 1
    info = run_cli(["cache", "info", "--json"])
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["plans"]["count"] == 1
    text = run_cli(["cache", "info"])
    assert "1 query plan(s)" in text.stdout
    cleared = run_cli(["cache", "clear", "--json"])
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(cleared.stdout)["plans_removed"] == 1
    assert not list((cache_dir / plans.FOLDER).iterdir())


def test_a_root_given_otherwise_has_its_own_plans(cache_dir: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers name their files by the paths a scan of the root as given builds: a plan made
    under the absolute root does not answer for the same root given relative to the working
    folder (nor the other way round)."""
    fields = {**MLA, **POINTS[0]}
    absolute = modperf.open(root).answer(fields, quality=False)
    monkeypatch.chdir(root.parent)
    want = modperf.open(root.name, cache=False).answer(fields, quality=False)
    assert want.files != absolute.files and want.files[0].startswith(root.name + os.sep)
    reader = modperf.open(root.name)
    assert reader._plans is not None and reader._plans.answer(fields, False) is None
    assert reader.answer(fields, quality=False) == want
    again = modperf.open(root.name)
    assert again._plans is not None and again._plans.answer(fields, False) == want
    by_path = modperf.open(root)
    assert by_path._plans is not None and by_path._plans.answer(fields, False) == absolute


def test_each_plan_is_checked_against_its_own_dependencies(cache_dir: Path, root: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks run once per process, per value checked: a plan written under another numpy is
    refused by a reader that has accepted one written under this numpy."""
    here, other = {**MLA, **POINTS[0]}, {**MLA, "tp_size": 4, **POINTS[0]}
    with monkeypatch.context() as patched:
        patched.setattr(plans, "numpy_fingerprint", lambda: "another numpy")
        modperf.open(root).answer(other, quality=False)
    modperf.open(root).answer(here, quality=False)
    reader = modperf.open(root)
    assert reader._plans is not None
    assert reader._plans.answer(here, False) is not None
    assert reader._plans.answer(other, False) is None
    assert reader.answer(other, quality=False) == modperf.open(root, cache=False).answer(other, quality=False)


def test_answers_with_quality_notes_from_plans_are_the_engines(cache_dir: Path) -> None:
    """With quality notes on: a plan keeps its group's notes (or that it has none) and lists
    those on the points each answer stands on, as the engine does."""
    reference = modperf.open(cache=False)
    asked = questions(reference) + noted(reference)
    writer = modperf.open()
    for fields in asked:
        answered(writer, fields, quality=True)
    reader = modperf.open()
    assert reader._plans is not None
    served = with_notes = 0
    for fields in asked:
        got = reader._plans.answer(fields, True)
        want = answered(reference, fields, quality=True)
        if got is None:
            assert answered(reader, fields, quality=True) == want
            continue
        assert got == want and got.to_dict() == want.to_dict()
        served += 1
        with_notes += bool(got.quality)
    assert served >= 250 and with_notes >= 1, (served, with_notes)


#: A dtype is the deployment's choice (issue 21): questions by model whose dtypes override the
#: checkpoint's (given as fields, or as the served variant's id), the checkpoint's own, and a
#: dtype never measured for the model (refused, naming the dtypes measured).
DTYPE_QUESTIONS = [{**MLA, **point, **dtypes} for point in POINTS for dtypes in (
    {"gemm_type": "bfloat16"}, {"gemm_type": "fp8_block"}, {}, {"gemm_type": "bfloat16", "kv_cache_dtype": "fp8"},
    {"model": "deepseek-ai/DeepSeek-V3@gemm=bfloat16"}, {"gemm_type": "nvfp4"})] + [
    {"table": "dsv4_csa_context_module", "system": "h200_sxm", "backend": "sglang", "version": "0.5.14",
     "model": "sgl-project/DeepSeek-V4-Pro-FP8", "tp_size": 8, "batch_size": 1, "isl": isl, "gemm_type": "bfloat16"}
    for isl in (1, 4096, 5000)]


def test_dtype_overridden_answers_from_plans_are_the_engines(cache_dir: Path) -> None:
    reference = modperf.open(cache=False)
    want = [answered(reference, fields) for fields in DTYPE_QUESTIONS]
    assert [w.fields["gemm_type"] for w in want[:5] if not isinstance(w, tuple)] == [
        "bfloat16", "fp8_block", "fp8_block", "bfloat16", "bfloat16"]
    assert want[0].derived["gemm_type"].startswith("bfloat16 as given (a deployment's choice)")
    assert want[5][0] == "NotCoveredError" and "gemm_type=fp8_block or gemm_type=bfloat16" in want[5][1]
    writer = modperf.open()
    for fields in DTYPE_QUESTIONS:
        answered(writer, fields)
    reader = modperf.open()
    assert reader._plans is not None
    from_plans = 0
    for fields, expected in zip(DTYPE_QUESTIONS, want):
        got = reader._plans.answer(fields, False)
        if got is None:  # a refusal, a point past the measured range: the engine answers
            assert answered(reader, fields) == expected
            continue
        assert got == expected and got.to_dict() == expected.to_dict()
        assert float(got.latency_ms).hex() == float(expected.latency_ms).hex()
        from_plans += 1
    assert from_plans >= 10, from_plans
