import subprocess
import sys
from pathlib import Path

import pytest

from modperf import errors as E
from modperf.data.catalog import Catalog, refs_for_paths, resolve_data_root, sidecar_problems
from modperf.data.families import declared_tables, model_head_axis_tables
from modperf.fast.cache_keys import embedded_data_root


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.scan()


def test_embedded_root_is_found_without_importing_the_data_package():
    code = (
        "import sys; from modperf.data.catalog import Catalog; c = Catalog.scan(); "
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
    assert [(type(p), str(p)) for p in catalog.problems] == [
        (E.SidecarError, f"{version}/reuse.yaml: mla_context_module reuses version 0.29.0, which has no such table. "
                         "Fix: restore the donor table or correct reuse.yaml")]
    assert catalog.problems[0].exit_code == 1  # the data root's fault, not the request's


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


# --- parts of a data root that cannot be read or trusted: problems, never skipped ---------------

MLA = "07_latent_collision/wheel/gb300/mla/vllm/0.27.0/mla_context_module_perf.parquet"


def _root_with_table(fixtures: Path, root: Path) -> Path:
    version = root / "gb300" / "mla" / "vllm" / "0.27.0"
    version.mkdir(parents=True)
    (version / "mla_context_module_perf.parquet").write_bytes((fixtures / MLA).read_bytes())
    return version


@pytest.mark.parametrize("text, message", [
    ("5\n", "reuse.yaml holds a int, not a mapping"),
    ("reuse: 7\n", "reuse.yaml: 'reuse' holds a int, not a list"),
    ("reuse: [1]\n", "reuse.yaml: entry 0 is not a {table, from_version} mapping"),
    ("reuse: [\n", "cannot parse reuse.yaml"),
    ("\x00\x01", "cannot parse reuse.yaml"),
])
def test_malformed_reuse_yaml_is_a_problem(fixtures: Path, tmp_path: Path, text: str, message: str):
    """A scalar reuse.yaml used to be an internal error (iterating an int); a YAML error made every
    command exit 2. Now the catalog scans, the table still answers, and the sidecar is a problem."""
    version = _root_with_table(fixtures, tmp_path)
    (version / "reuse.yaml").write_text(text)
    catalog = Catalog.scan(tmp_path)
    assert [r.table for r in catalog.slots] == ["mla_context_module"]
    assert len(catalog.problems) == 1 and isinstance(catalog.problems[0], E.SidecarError)
    assert message in str(catalog.problems[0]) and catalog.problems[0].exit_code == 1


def test_malformed_collection_meta_reads_as_empty_and_is_reported(fixtures: Path, tmp_path: Path):
    """With and without --json alike: provenance reads as unknown, and the audits report the file."""
    version = _root_with_table(fixtures, tmp_path)
    (version / "collection_meta.yaml").write_text("tables: [\n")
    ref = Catalog.scan(tmp_path).slots[0]
    assert ref.to_dict()["provenance"] is None and ref.status is None
    [problem] = sidecar_problems([version])
    assert isinstance(problem, E.SidecarError)
    assert "cannot parse collection_meta.yaml: did not find expected node content (line 2, column 1)" in str(problem)


def test_links_out_of_the_root_are_refused_and_dangling_links_fail_loudly(fixtures: Path, tmp_path: Path):
    version = tmp_path / "gb300" / "mla" / "vllm" / "0.27.0"
    version.mkdir(parents=True)
    (version / "mla_context_module_perf.parquet").symlink_to(fixtures / MLA)
    (version / "mla_generation_module_perf.parquet").symlink_to(tmp_path / "nowhere")
    inside = tmp_path / "gb300" / "mla" / "vllm" / "0.28.0"
    inside.mkdir()
    (inside / "mla_context_module_perf.parquet").symlink_to(version / "mla_generation_module_perf.parquet")
    catalog = Catalog.scan(tmp_path)
    assert [type(p) for p in catalog.problems] == [E.LinkOutsideRootError]
    assert catalog.problems[0].file == str(version / "mla_context_module_perf.parquet")
    # the dangling link (inside the root) is listed, so that loading it reports it
    assert sorted(r.path.name for r in catalog.files) == ["mla_context_module_perf.parquet",
                                                          "mla_generation_module_perf.parquet"]
    problems: list[E.ModperfError] = []
    refs_for_paths([tmp_path], problems)
    assert [type(p) for p in problems] == [E.LinkOutsideRootError]
    with pytest.raises(E.LinkOutsideRootError):
        refs_for_paths([tmp_path])  # without a list to collect into, the problem is raised


def test_a_folder_named_like_a_table_and_leftover_temp_files(fixtures: Path, tmp_path: Path):
    version = _root_with_table(fixtures, tmp_path)
    (version / "mla_generation_module_perf.parquet").mkdir()
    (version / ".mla_context_module_perf.parquet.x1y2.modperf-tmp").write_bytes(b"half")
    kinds = sorted(p.kind for p in Catalog.scan(tmp_path).problems)
    assert kinds == ["stale_temp_file", "unreadable"]
    problems: list[E.ModperfError] = []
    assert [r.table for r in refs_for_paths([tmp_path], problems)] == ["mla_context_module"]
    assert sorted(p.kind for p in problems) == ["stale_temp_file", "unreadable"]


def test_slot_lookup_follows_a_replaced_list_of_slots(db) -> None:
    from modperf.data.catalog import Catalog

    catalog = Catalog.scan()
    first = catalog.slots[0]
    assert catalog.slot(*first.slot) is first
    catalog.slots = catalog.slots[1:]
    assert catalog.slot(*first.slot) is next((r for r in catalog.slots if r.slot == first.slot), None)
    catalog.slots.append(first)
    assert catalog.slot(*first.slot) is next(r for r in catalog.slots if r.slot == first.slot)
