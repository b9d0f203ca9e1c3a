"""What the persisted caches are keyed by (modperf.fast.cache_keys), in the standard library only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import modperf
from modperf.fast import cache_keys
from modperf.fast.cache_keys import embedded_data_root


def test_the_cache_folder_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODPERF_CACHE_DIR", str(tmp_path / "explicit"))
    assert cache_keys.cache_folder() == str(tmp_path / "explicit")
    monkeypatch.delenv("MODPERF_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_keys.cache_folder() == str(tmp_path / "xdg" / "modperf")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_keys.cache_folder() == str(tmp_path / "home" / ".cache" / "modperf")


def test_a_table_files_identity_is_its_footer_and_stat(tmp_path: Path, db: modperf.Database) -> None:
    src = db.ref("h200_sxm", "trtllm", "1.3.0rc20", "mla_context_module").path
    copy = tmp_path / src.name
    copy.write_bytes(src.read_bytes())
    found = cache_keys.source_identity(copy)
    assert found == cache_keys.source_identity(str(copy))
    assert found is not None and found["path"] == str(copy.resolve()) and found["size"] == copy.stat().st_size
    data = copy.read_bytes()
    footer = int.from_bytes(data[-8:-4], "little")
    assert found["content"] == cache_keys.blake2b(data[-8 - footer:-8], digest_size=16).hexdigest()
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    touched = cache_keys.source_identity(copy)
    assert touched is not None and touched["mtime_ns"] != found["mtime_ns"] and touched != found
    assert cache_keys.source_identity(tmp_path / "missing.parquet") is None


def test_the_corpus_package_is_found_without_importlib_metadata() -> None:
    base = cache_keys.distribution_base()
    assert base is not None
    assert Path(base, "aiconfigurator_core", "systems", "data") == embedded_data_root()


def test_a_scan_is_unchanged_until_a_folder_changes(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    sidecar = tmp_path / "a" / "reuse.yaml"
    sidecar.write_text("x: 1\n")
    st = os.stat(tmp_path / "a")
    folders = [("a", [st.st_dev, st.st_ino, st.st_mode, st.st_mtime_ns, st.st_ctime_ns])]
    sidecars = [("a/reuse.yaml", cache_keys.blake2b(b"x: 1\n", digest_size=16).hexdigest())]
    assert cache_keys.scan_unchanged(str(tmp_path), folders, sidecars)
    sidecar.write_text("x: 2\n")
    assert not cache_keys.scan_unchanged(str(tmp_path), folders, sidecars)
    sidecar.write_text("x: 1\n")
    (tmp_path / "a" / "new").mkdir()
    assert not cache_keys.scan_unchanged(str(tmp_path), folders, sidecars)
