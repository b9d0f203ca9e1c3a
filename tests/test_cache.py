"""The persisted cache of keyed tables (modperf.data.keyed_cache): correctness, never speed.

Every test keeps its cache in its own tmp folder (MODPERF_CACHE_DIR); conftest.py points the
whole suite at a session folder so that nothing writes to the user's cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tests.helpers import REPO, run_cli, stored_latency

import modperf
from modperf.data import cache_info
from modperf.data import keyed_cache as cache
from modperf.fast import cache_keys, persist
from modperf.query import interp

SLOT = ("h200_sxm", "trtllm", "1.3.0rc20", "mla_context_module")
MLA = {"table": "mla_context_module", "system": "h200_sxm", "backend": "trtllm", "version": "1.3.0rc20",
       "model": "deepseek-ai/DeepSeek-V3", "tp_size": 8}
#: One exact hit, one between measured points, one past the measured range (extrapolated).
POINTS = [{"batch_size": 4, "isl": 1024}, {"batch_size": 3, "isl": 1500}, {"batch_size": 1, "isl": 40000}]


@pytest.fixture
def root(tmp_path: Path, db: modperf.Database) -> Path:
    return copy_root(tmp_path, db)


def copy_root(tmp_path: Path, db: modperf.Database) -> Path:
    """A data root holding one real table (a writable copy of the corpus's file)."""
    ref = db.ref(*SLOT)
    out = tmp_path / "root" / ref.system / ref.family_dir / ref.backend / ref.version / ref.path.name
    out.parent.mkdir(parents=True)
    shutil.copyfile(ref.path, out)
    return tmp_path / "root"


def answers(database: modperf.Database) -> list[dict]:
    return [database.answer({**MLA, **p}, quality=False).to_dict() for p in POINTS]


def bits(found: list[dict]) -> list[str]:
    return [float(a["latency_ms"]).hex() for a in found]


def entry_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*" + cache.SUFFIX))


def assert_same_keyed(a: modperf.KeyedTable, b: modperf.KeyedTable) -> None:
    for name in ("offsets", "latency", "sources", "bucket_native", "bucket_local"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert a.axes.keys() == b.axes.keys()
    for name in a.axes:
        assert a.axes[name].dtype == b.axes[name].dtype and np.array_equal(a.axes[name], b.axes[name]), name
    for name in ("key_names", "bucket_keys", "bucket_models", "model_native", "model_geometry", "rows_read",
                 "rows_stored", "duplicates_merged", "alias_duplicate_points", "natives_seen",
                 "recorded_versions", "missing_optional"):
        assert getattr(a, name) == getattr(b, name), name
    assert [type(v) for k in a.bucket_keys for v in k] == [type(v) for k in b.bucket_keys for v in k]


def test_cold_cache_answers_bit_for_bit_like_no_cache(cache_dir: Path, root: Path) -> None:
    fresh = answers(modperf.open(root, cache=False))
    assert not cache_dir.exists()  # cache=False neither reads nor writes
    cold = modperf.open(root)  # fills the cache
    first = answers(cold)
    assert len(entry_files(cache_dir)) == 1
    warm_db = modperf.open(root)  # answers from the entry
    warm = answers(warm_db)
    assert first == fresh and warm == fresh
    assert bits(warm) == bits(fresh)
    assert [a["kind"] for a in warm] == ["exact", "interpolated", "extrapolated"]
    # the file stores rank-local heads with tp_size 1 (the module measured on one rank)
    key = {k: warm[0]["fields"][k] for k in ("model", "gemm_type", "mla_dtype", "kv_cache_dtype", "step", "batch_size",
                                              "isl")}
    key["num_heads"] = warm[0]["local"]
    assert warm[0]["latency_ms"] == stored_latency(cold.ref(*SLOT).path, key)
    assert_same_keyed(warm_db.table(*SLOT), modperf.open(root, cache=False).table(*SLOT))


def test_every_corpus_table_of_a_system_round_trips(cache_dir: Path, db: modperf.Database) -> None:
    built = modperf.open(cache=False)
    modperf.open().tables(system="h100_sxm")  # a generator: nothing loaded yet
    first = modperf.open()
    loaded = 0
    for ref in first.catalog.select(system="h100_sxm", physical=True):
        if modperf.family_of(ref.table) is None:
            continue
        try:
            want = built.load(ref)
        except modperf.ModperfError:
            continue
        first.load(ref)  # writes the entry
        assert_same_keyed(modperf.open().load(ref), want)  # a new database reads it back
        loaded += 1
    assert loaded >= 20
    assert len(entry_files(cache_dir)) == loaded


def _rewrite(path: Path, factor: float, *, keep_mtime: bool) -> None:
    st = path.stat()
    table = pq.read_table(path)
    i = table.schema.get_field_index("latency")
    table = table.set_column(i, "latency", pc.multiply(table.column("latency"), factor))
    pq.write_table(table, path, compression="zstd")
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("keep_mtime", [False, True], ids=["edited", "edited-same-mtime"])
def test_edited_source_gives_the_fresh_answer(cache_dir: Path, root: Path, keep_mtime: bool) -> None:
    old = answers(modperf.open(root))
    assert len(entry_files(cache_dir)) == 1
    path = next(root.rglob("*_perf.parquet"))
    _rewrite(path, 2.0, keep_mtime=keep_mtime)
    fresh = answers(modperf.open(root, cache=False))
    assert fresh[0]["latency_ms"] == 2.0 * old[0]["latency_ms"]
    assert answers(modperf.open(root)) == fresh
    assert answers(modperf.open(root)) == fresh  # and the rebuilt entry serves it afterwards


def _latency_region(entry: Path) -> tuple[int, int]:
    header = cache.read_header(entry)
    assert header is not None
    size = int.from_bytes(entry.read_bytes()[len(cache.MAGIC):len(cache.MAGIC) + 8], "little")
    start = len(cache.MAGIC) + 8 + size
    data = start + (-start % 64)
    (offset, nbytes), = [(o, n) for name, _, _, o, n in header["arrays"] if name == "latency"]
    return data + offset, nbytes


@pytest.mark.parametrize("damage", ["truncate", "flip", "flip-last", "garbage"])
def test_damaged_entry_is_rebuilt_never_served(cache_dir: Path, root: Path, damage: str) -> None:
    want = answers(modperf.open(root, cache=False))
    want_keyed = modperf.open(root, cache=False).table(*SLOT)
    modperf.open(root).table(*SLOT)
    (entry,) = entry_files(cache_dir)
    good = entry.read_bytes()
    data = bytearray(good)
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":  # the top byte of a latency in the middle of the table
        start, nbytes = _latency_region(entry)
        data[start + (nbytes // 16) * 8 + 7] ^= 0x40
    elif damage == "flip-last":  # the digest itself
        data[-1] ^= 0x01
    else:
        data = bytearray(b"not an entry at all")
    entry.write_bytes(bytes(data))
    assert cache.decode(bytearray(data), want_keyed.ref) is None
    got_db = modperf.open(root)
    assert answers(got_db) == want
    assert_same_keyed(got_db.table(*SLOT), want_keyed)
    assert entry.read_bytes() == good  # rebuilt, atomically, to the same bytes


def test_another_model_config_set_is_another_entry(cache_dir: Path, root: Path, fixtures: Path) -> None:
    modperf.open(root).table(*SLOT)
    modperf.open(root, [fixtures / "09_hf_configs"]).table(*SLOT)
    assert len(entry_files(cache_dir)) == 2


def test_the_size_bound_removes_the_entry_used_longest_ago(cache_dir: Path, root: Path, fixtures: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries of another model-config set (or an older modperf) are never read again: past
    MODPERF_CACHE_MAX_BYTES the one used longest ago goes, the one just written stays, and the
    answers are the same."""
    want = answers(modperf.open(root, cache=False))
    modperf.open(root).table(*SLOT)
    (first,) = entry_files(cache_dir)
    monkeypatch.setenv(persist.MAX_BYTES_ENV, str(first.stat().st_size + 1))
    other = modperf.open(root, [fixtures / "09_hf_configs"])
    other.table(*SLOT)
    (second,) = entry_files(cache_dir)
    assert second != first and not first.exists()
    assert answers(other) == want and answers(modperf.open(root, [fixtures / "09_hf_configs"])) == want
    assert entry_files(cache_dir) == [second]
    monkeypatch.setenv(persist.MAX_BYTES_ENV, "lots")
    assert persist.max_bytes() == persist.DEFAULT_MAX_BYTES
    assert any("is not a whole number of bytes" in n for n in persist.NOTES)


def test_unwritable_cache_degrades_to_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, root: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(cache_keys.CACHE_DIR_ENV, str(blocker / "cache"))
    want = answers(modperf.open(root, cache=False))
    capsys.readouterr()
    assert answers(modperf.open(root)) == want
    assert capsys.readouterr().err == (f"cache off: {blocker} is not a folder (fix: remove it, or set "
                                       "MODPERF_CACHE_DIR to a folder)\n")
    assert not (blocker / "cache").exists()


def test_env_turns_the_cache_off(cache_dir: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cache_keys.NO_CACHE_ENV, "1")
    answers(modperf.open(root))
    assert not cache_dir.exists()
    assert modperf.open(root, cache=True).store.cache


_FILL = """
import json, sys
import modperf
db = modperf.open(sys.argv[1])
points = json.loads(sys.argv[2])
out = [db.answer({**json.loads(sys.argv[3]), **p}, quality=False).latency_ms for p in points]
print(json.dumps([float(x).hex() for x in out]))
"""


def test_two_processes_filling_at_once_both_answer_right(cache_dir: Path, root: Path, db: modperf.Database) -> None:
    # several tables, so that the two writers overlap on more than one entry
    ref = db.ref(*SLOT)
    for table in ("mla_generation_module",):
        src = ref.path.with_name(f"{table}_perf.parquet")
        shutil.copyfile(src, next(root.rglob("*_perf.parquet")).with_name(src.name))
    want = bits(answers(modperf.open(root, cache=False)))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [sys.executable, "-c", _FILL, str(root), json.dumps(POINTS), json.dumps(MLA)]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
             for _ in range(4)]
    results = [p.communicate(timeout=120) for p in procs]
    for (out, err), p in zip(results, procs):
        assert p.returncode == 0, err
        assert json.loads(out) == want
    assert len(entry_files(cache_dir)) == 1
    assert not [p for p in cache_dir.iterdir() if p.name.endswith(".modperf-tmp")]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert json.loads(done.stdout) == want


def test_cache_info_and_clear_cli(cache_dir: Path, root: Path) -> None:
    query = ["query", "mla_context_module", "--system", "h200_sxm", "--backend", "trtllm", "--version", "1.3.0rc20",
             "--model", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--batch-size", "4", "--isl", "1024",
             "--data-root", str(root), "--json"]
    off = run_cli(["--no-cache", *query])
    assert off.returncode == 0, off.stderr
    assert not cache_dir.exists()
    on = run_cli(query)
    assert on.returncode == 0, on.stderr
    assert json.loads(on.stdout)["latency_ms"] == json.loads(off.stdout)["latency_ms"]
    info = run_cli(["cache", "info", "--json"])
    assert info.returncode == 0, info.stderr
    found = json.loads(info.stdout)
    (entry,) = entry_files(cache_dir)
    assert found["location"] == str(cache_dir)
    assert found["count"] == 1 and found["bytes"] == entry.stat().st_size
    assert found["entries"][0]["source"] == str(next(root.rglob("mla_context_module_perf.parquet")).resolve())
    (grid,) = grid_files(cache_dir)  # the query's group's grid, kept beside its entry
    assert found["grids"] == {"count": 1, "bytes": grid.stat().st_size}
    text = run_cli(["cache", "info"])
    assert text.returncode == 0 and "1 entries" in text.stdout and str(cache_dir) in text.stdout
    assert "1 grid file(s) beside the entries" in text.stdout
    cleared = run_cli(["cache", "clear", "--json"])
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(cleared.stdout) == {"location": str(cache_dir), "removed": 1, "bytes": found["bytes"],
                                          "catalogs_removed": len(found["catalogs"]), "grids_removed": 1,
                                          "grid_bytes_removed": found["grids"]["bytes"],
                                          "plans_removed": found["plans"]["count"],
                                          "plan_bytes_removed": found["plans"]["bytes"]}
    assert entry_files(cache_dir) == [] and grid_files(cache_dir) == []
    after = json.loads(run_cli(["cache", "info", "--json"]).stdout)
    assert after["count"] == 0 and after["grids"] == {"count": 0, "bytes": 0}


# --- grids beside the entries -------------------------------------------------------------------


def grid_files(folder: Path) -> list[Path]:
    return sorted((folder / cache.GRIDS).glob("*" + cache.GRID_SUFFIX))


def assert_same_grid(a: interp.Grid, b: interp.Grid) -> None:
    """Every attribute a lookup reads, bit for bit (NaN cells included)."""
    assert a.axes == b.axes and a.shape == b.shape and a.heads_axis == b.heads_axis and a.limit == b.limit
    assert a.curvature == b.curvature and a.n_measured == b.n_measured
    for name in ("latency", "state", "distance", "roof", "_lat_p", "_dist_p", "_state_p"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name
    for name in ("values", "octaves", "coords", "_u_p", "_inv_p"):
        assert [v.tobytes() for v in getattr(a, name)] == [v.tobytes() for v in getattr(b, name)], name
    for name in ("lat_py", "state_py", "_dist_py", "offsets_py", "_axes_py", "_pstrides"):
        assert getattr(a, name) == getattr(b, name), name
    assert [type(v) for v in a.lat_py] == [type(v) for v in b.lat_py]


def test_grids_are_kept_beside_the_entry_and_restored_bit_for_bit(cache_dir: Path, root: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fresh_db = modperf.open(root, cache=False)
    fresh = answers(fresh_db)
    first = modperf.open(root)
    assert answers(first) == fresh
    (kept,) = grid_files(cache_dir)  # the one group the questions ask
    assert first.table(*SLOT).cache_home is not None and fresh_db.table(*SLOT).cache_home is None

    def no_fill(*_args: object) -> None:
        raise AssertionError("a kept grid is restored, not filled")

    monkeypatch.setattr(interp.Grid, "_fill", no_fill)
    warm_db = modperf.open(root)
    warm = answers(warm_db)
    assert warm == fresh and bits(warm) == bits(fresh)
    assert [a["kind"] for a in warm] == ["exact", "interpolated", "extrapolated"]
    assert_same_grid(warm_db.queries.grid(MLA), fresh_db.queries.grid(MLA))
    monkeypatch.undo()
    assert grid_files(cache_dir) == [kept]
    cache_info.clear(cache_dir)
    assert grid_files(cache_dir) == [] and entry_files(cache_dir) == []


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_damaged_grid_file_is_rebuilt_never_served(cache_dir: Path, root: Path, damage: str) -> None:
    fresh_db = modperf.open(root, cache=False)
    want = answers(fresh_db)
    answers(modperf.open(root))
    (kept,) = grid_files(cache_dir)
    good = kept.read_bytes()
    data = bytearray(good)
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":  # a byte in the middle of the arrays (the digest no longer matches)
        data[len(data) // 2] ^= 0x40
    else:
        data = bytearray(b"not a grid at all")
    kept.write_bytes(bytes(data))
    assert cache.decode_grid(bytearray(data)) is None
    got_db = modperf.open(root)
    assert bits(answers(got_db)) == bits(want) and answers(got_db) == want
    assert_same_grid(got_db.queries.grid(MLA), fresh_db.queries.grid(MLA))
    assert kept.read_bytes() == good  # rebuilt to the same bytes


def test_a_grid_file_serves_only_its_own_identity(cache_dir: Path, root: Path) -> None:
    """A grid's file name is a digest of its identity, and the identity stored inside must equal
    the one asked for: the file of one group, system or GPU is never another's."""
    db = modperf.open(root)
    answers(db)
    (kept,) = grid_files(cache_dir)
    keyed = db.table(*SLOT)
    home = keyed.cache_home
    assert home is not None
    found = cache.decode_grid(bytearray(kept.read_bytes()))
    assert found is not None
    identity = found[0]
    assert identity["system"] == "h200_sxm" and identity["table"] == home[1]
    assert cache.load_grid(home, identity) is not None
    others = [{**identity, "group": {"t": ["another"]}}, {**identity, "system": "b200_sxm"},
              {**identity, "gpu": identity["gpu"].replace("h200", "b200")}, {**identity, "code": "0" * 32},
              {**identity, "table": "0" * 32}, {**identity, "limit": repr(2.0)}]
    for other in others:
        path = cache._grid_path(home, other)
        assert path != kept
        path.write_bytes(kept.read_bytes())  # the right bytes under another identity's name
        assert cache.load_grid(home, other) is None
        path.unlink()
