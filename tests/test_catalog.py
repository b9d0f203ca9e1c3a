import subprocess
import sys
from pathlib import Path

import pytest

from modperf import errors as E
from modperf.catalog import Catalog, embedded_data_root, refs_for_paths, resolve_data_root
from modperf.families import declared_tables, model_head_axis_tables


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.scan()


def test_embedded_root_is_found_without_importing_the_data_package():
    code = (
        "import sys; from modperf.catalog import Catalog; c = Catalog.scan(); "
        "print(len(c.files)); print('aiconfigurator_core' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["736", "False"]


def test_corpus_inventory(catalog: Catalog):
    assert embedded_data_root().name == "data"
    assert len(catalog.files) == 736
    heads = catalog.select(tables=model_head_axis_tables())
    assert len(heads) == 363
    # every table file the corpus ships has a family declaration (45 stems)
    assert len(catalog.select(tables=declared_tables())) == 736
    assert {r.table for r in catalog.files} == set(declared_tables())
    # 14 system folders, 10 of which hold tables
    assert {r.system for r in catalog.files} == {
        "a100_sxm", "b200_sxm", "b300_sxm", "b60", "gb200", "gb300", "h100_sxm", "h200_sxm", "l40s",
        "rtx_pro_6000_server",
    }
    assert catalog.problems == []


def test_reuse_slot_answers_from_the_donor(catalog: Catalog):
    ref = catalog.slot("b300_sxm", "vllm", "0.22.0", "dsa_context_module")
    assert ref is not None and ref.reuse is not None
    assert ref.reuse.from_version == "0.24.0"
    assert ref.path.parts[-2] == "0.24.0"
    assert ref.version == "0.22.0"
    assert ref.to_dict()["reused_from"] == "0.24.0"


def test_reuse_declaration_shadows_a_local_file(catalog: Catalog):
    # b200 vllm 0.22.0 ships its own (legacy) attention tables *and* declares 0.24.0 reuse:
    # the declaration answers; the local file is still a physical file that check validates.
    slot = catalog.slot("b200_sxm", "vllm", "0.22.0", "context_attention")
    assert slot is not None and slot.reuse is not None and slot.path.parts[-2] == "0.24.0"
    physical = catalog.select(system="b200_sxm", backend="vllm", version="0.22.0", table="context_attention")
    assert len(physical) == 1 and physical[0].shadowed and physical[0].provenance == "legacy"


def test_collection_meta_is_read(catalog: Catalog):
    ref = catalog.slot("h200_sxm", "trtllm", "1.3.0rc20", "mla_context_module")
    assert ref is not None
    assert (ref.provenance, ref.status) == ("collected", "complete")


def test_data_root_from_environment(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("MODPERF_DATA_ROOT", str(tmp_path))
    assert resolve_data_root() == tmp_path
    assert Catalog.scan().files == []


def test_missing_data_root_is_a_usage_error(tmp_path: Path):
    with pytest.raises(E.DataRootError) as info:
        resolve_data_root(tmp_path / "nope")
    assert info.value.exit_code == 2
    assert "data root is not a folder" in str(info.value)
    assert "Fix: pass a folder laid out {system}/{family}/{backend}/{version}/{table}_perf.parquet" in str(info.value)


def test_reuse_with_missing_donor_is_reported(tmp_path: Path):
    version = tmp_path / "h200_sxm" / "mla" / "vllm" / "0.30.0"
    version.mkdir(parents=True)
    (version / "reuse.yaml").write_text("reuse:\n- table: mla_context_module_perf\n  from_version: 0.29.0\n")
    catalog = Catalog.scan(tmp_path)
    assert catalog.slots == []
    assert catalog.problems == [
        f"{version}/reuse.yaml: mla_context_module reuses version 0.29.0, which has no such table"
    ]


def test_paths_keep_the_layout_when_they_have_it(fixtures: Path):
    legacy = fixtures / "03_legacy_no_num_heads"
    refs = refs_for_paths([legacy])
    assert sorted(r.table for r in refs) == ["context_mla", "generation_mla"]
    assert all(r.system is None and r.format == "csv" for r in refs)  # not in the standard layout
    migrated = fixtures / "01_dsv4_stale_vs_migrated" / "migrated_93dfd1fd2"
    refs = refs_for_paths([migrated])
    assert {(r.system, r.family_dir, r.backend, r.version) for r in refs} == {
        ("b200_sxm", "sparse_attention", "sglang", "0.5.10"), ("gb200", "sparse_attention", "sglang", "0.5.10")}


def test_paths_that_are_not_tables(tmp_path: Path):
    (tmp_path / "notes.csv").write_text("a,b\n")
    with pytest.raises(E.UnknownTableError, match="not a perf table file name"):
        refs_for_paths([tmp_path / "notes.csv"])
    with pytest.raises(E.UnknownTableError, match="no such file or folder"):
        refs_for_paths([tmp_path / "missing_perf.parquet"])
    with pytest.raises(E.UnknownTableError, match="folder holds no"):
        refs_for_paths([tmp_path])
