"""Only the user's own cache is read (modperf.fast.cache_trust; issue 21, part 3).

A forged plan or keyed-table entry (re-framed with its own, unkeyed digest around a changed
latency) is what a reader without the ownership rule serves: each test shows that first, in a
folder of the user's own, then that the same file is never read from a folder others can write,
from another user's folder, as another user's file or one others can write, or through a link;
a link planted at a temporary file's name never redirects a write. The CLI runs as a user runs
it (a child process); every test keeps its cache in its own tmp folder (``cache_dir``)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from tests.helpers import files_of, run_cli, stored_latency
from tests.test_cache import SLOT, copy_root

import modperf
from modperf.base import atomic
from modperf.base.errors import WriteFailedError
from modperf.data import keyed_cache as cache
from modperf.fast import cache_keys, cache_trust, persist, plans
from modperf.fast.lattice import Lattice

QUERY = ["query", "mla_context_module", "--system", "h200_sxm", "--backend", "trtllm", "--version", "1.3.0rc20",
         "--model", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--batch-size", "4", "--isl", "2048", "--json"]
#: The latency a forged file claims at every point.
FORGED = 0.001
#: A user id that is not the tests' (nobody).
OTHER_UID = 65534


@pytest.fixture(autouse=True)
def _judged_afresh() -> None:
    """Each test judges its folders anew (a verdict is kept for the life of a process)."""
    cache_trust.forget()


#: QUERY's point as the table file stores it (DeepSeek-V3's 128 heads at tp 8: 16 per GPU).
STORED = {"model": "deepseek-ai/DeepSeek-V3", "num_heads": 16, "batch_size": 4, "isl": 2048, "step": 0,
          "gemm_type": "fp8_block", "mla_dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "kernel_source": "default"}


@pytest.fixture(scope="module")
def real() -> float:
    """The latency the table file stores at QUERY's point, read with pyarrow alone, and checked
    to be what the engine answers without a cache."""
    run = run_cli(["--no-cache", *QUERY])
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    (path,) = answer["files"]
    latency = stored_latency(Path(path), STORED)
    assert (latency, answer["latency_ms"], answer["kind"]) == (1.0389, latency, "exact")
    return latency


@pytest.fixture
def other_uid(tmp_path: Path) -> int:
    """Another user's id, where this process can give a file to another user (root); else the
    test is skipped, saying why."""
    if os.geteuid() != 0:
        pytest.skip(f"giving a file to another user needs root (CAP_CHOWN); the tests run as uid {os.geteuid()}")
    probe = tmp_path / "chown-probe"
    probe.write_bytes(b"")
    try:
        os.chown(probe, OTHER_UID, OTHER_UID)
    except OSError as exc:
        pytest.skip(f"root here cannot give a file to uid {OTHER_UID} ({exc.strerror}): a user namespace without it")
    probe.unlink()
    return OTHER_UID


def ask(args: list[str] = QUERY) -> tuple[dict[str, Any], str]:
    run = run_cli(args)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout), run.stderr


def plan_file(cache_dir: Path) -> Path:
    (found,) = sorted((cache_dir / plans.FOLDER).glob("*" + plans.SUFFIX))
    return found


def forged_plan(path: Path) -> bytes:
    """The plan in ``path`` with every latency of its lattice FORGED, framed as a plan is."""
    doc = plans._unframe(path.read_bytes())
    assert type(doc) is dict
    parts = list(doc["lattice"])
    at = Lattice.PLAIN.index("lat_py")
    parts[at] = [FORGED] * len(parts[at])
    return plans._frame({**doc, "lattice": tuple(parts)})


def entry_of(cache_dir: Path, table_file: str) -> Path:
    (found,) = [p for p in sorted(cache_dir.glob("*" + cache.SUFFIX))
                if (cache.read_header(p) or {})["identity"]["source"]["path"] == table_file]
    return found


def forged_entry(path: Path) -> bytes:
    """The keyed-table entry in ``path`` with every latency FORGED, framed as an entry is."""
    framed = cache._unframe(bytearray(path.read_bytes()), cache.MAGIC)
    assert framed is not None
    header, arrays = framed
    latency = arrays["latency"].copy()
    latency[:] = FORGED
    pieces = cache._frame(cache.MAGIC, {k: v for k, v in header.items() if k != "arrays"},
                          {**arrays, "latency": latency})
    return b"".join(bytes(p) for p in pieces)


def only_the_entries(cache_dir: Path) -> None:
    """Remove the plans and grids (built from an entry), so that an answer must read the entry."""
    for folder in (cache_dir / plans.FOLDER, cache_dir / cache.GRIDS):
        for p in folder.iterdir():
            p.unlink()


def off_line(folder: Path, why: str) -> str:
    fixes = {"writable": f"is writable by others (fix: chmod go-w {folder})",
             "owned": "is owned by another user (fix: use a folder of your own: set MODPERF_CACHE_DIR)"}
    return f"cache off: {folder} {fixes[why]}\n"


def owned_by(folder: Path, uid: int) -> None:
    for p in [folder, *folder.rglob("*")]:
        os.lchown(p, uid, uid)


# --- a forged file is never read where others could have written it ---------------------------


def test_a_forged_plan_in_a_folder_others_can_write_is_never_read(cache_dir: Path, real: float) -> None:
    assert ask()[0]["latency_ms"] == real  # (the engine answers, and writes the plan)
    plan = plan_file(cache_dir)
    plan.write_bytes(forged_plan(plan))
    forged, err = ask()
    assert (forged["latency_ms"], forged["kind"], err) == (FORGED, "exact", "")  # what the plan says, read
    cache_dir.chmod(0o777)
    before = files_of(cache_dir)
    answer, err = ask()
    assert (answer["latency_ms"], answer["kind"]) == (real, "exact")
    assert err == off_line(cache_dir, "writable")
    text = run_cli(QUERY[:-1])  # the command without --json: the same one line
    assert text.returncode == 0 and text.stderr == off_line(cache_dir, "writable")
    assert files_of(cache_dir) == before  # nor written


def test_a_forged_keyed_table_entry_in_a_folder_others_can_write_is_never_read(cache_dir: Path, real: float) -> None:
    answer, _ = ask()
    entry = entry_of(cache_dir, answer["files"][0])
    entry.write_bytes(forged_entry(entry))
    only_the_entries(cache_dir)
    forged, err = ask()
    assert (forged["latency_ms"], forged["kind"], err) == (FORGED, "exact", "")  # what the entry says, read
    only_the_entries(cache_dir)
    cache_dir.chmod(0o777)
    before = files_of(cache_dir)
    answer, err = ask()
    assert (answer["latency_ms"], answer["kind"]) == (real, "exact")
    assert err == off_line(cache_dir, "writable")
    assert files_of(cache_dir) == before


def test_a_folder_above_the_cache_that_others_can_write_turns_it_off(cache_dir: Path, real: float) -> None:
    ask()
    plan = plan_file(cache_dir)
    plan.write_bytes(forged_plan(plan))
    cache_dir.parent.chmod(0o777)  # others could rename the cache folder away and put theirs there
    answer, err = ask()
    assert answer["latency_ms"] == real
    assert err == (f"cache off: {cache_dir.parent} is writable by others (fix: chmod go-w {cache_dir.parent}, or "
                   "set MODPERF_CACHE_DIR to a folder elsewhere)\n")
    cache_dir.parent.chmod(0o1777)  # sticky, as /tmp: others cannot rename or remove what is the user's
    forged, err = ask()
    assert (forged["latency_ms"], err) == (FORGED, "")  # the rule trusts it: the forged plan is read


def test_a_cache_owned_by_another_user_is_not_read(cache_dir: Path, real: float, other_uid: int) -> None:
    ask()
    plan = plan_file(cache_dir)
    plan.write_bytes(forged_plan(plan))
    owned_by(cache_dir, other_uid)
    before = files_of(cache_dir)
    answer, err = ask()
    assert (answer["latency_ms"], answer["kind"]) == (real, "exact")
    assert err == off_line(cache_dir, "owned")
    assert files_of(cache_dir) == before
    assert all(p.lstat().st_uid == other_uid for p in [cache_dir, *cache_dir.rglob("*")])


@pytest.mark.parametrize("whose", ["writable by others", "another user's"])
def test_a_file_of_another_user_or_that_others_can_write_is_not_read(cache_dir: Path, real: float, whose: str,
                                                                   request: pytest.FixtureRequest) -> None:
    ask()
    plan = plan_file(cache_dir)
    plan.write_bytes(forged_plan(plan))
    if whose == "writable by others":
        plan.chmod(0o666)
    else:
        os.chown(plan, request.getfixturevalue("other_uid"), -1)
    answer, err = ask()
    assert (answer["latency_ms"], answer["kind"], err) == (real, "exact", "")  # the folder is fine: no line
    st = plan.lstat()  # the user's own plan took its name
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o600)
    assert plans._unframe(plan.read_bytes()) is not None and ask()[0]["latency_ms"] == real


def test_a_link_at_a_plans_name_is_not_followed(cache_dir: Path, real: float, tmp_path: Path) -> None:
    ask()
    plan = plan_file(cache_dir)
    elsewhere = tmp_path / "forged.mpq"
    forged = forged_plan(plan)
    elsewhere.write_bytes(forged)
    elsewhere.chmod(0o600)  # the user's own file: only the link is wrong
    plan.unlink()
    plan.symlink_to(elsewhere)
    answer, err = ask()
    assert (answer["latency_ms"], err) == (real, "")
    assert not plan.is_symlink() and plans._unframe(plan.read_bytes()) is not None  # a plan took the link's name
    assert elsewhere.read_bytes() == forged  # and the file it pointed at is as it was


# --- a planted link never redirects a write -----------------------------------------------------


def _planted(target: Path, random_bytes: int, victim: Path) -> Path:
    """A link at the name the next temporary file of ``target`` gets (os.urandom made zeros)."""
    temp = target.parent / f"{atomic._temp_prefix(target)}{'00' * random_bytes}{atomic.TMP_SUFFIX}"
    temp.symlink_to(victim)
    return temp


def test_a_link_planted_at_a_temporary_files_name_does_not_redirect_the_write(
        cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db: modperf.Database) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    monkeypatch.setattr(os, "urandom", lambda n: b"\0" * n)
    # a keyed-table entry (atomic.write_atomically): the store fails, the answer does not
    root = copy_root(tmp_path, db)
    database = modperf.open(root)
    ref = database.ref(*SLOT)
    source = cache.source_identity(ref.path)
    assert source is not None
    entry = cache_dir / cache._entry_name(source, cache.registry_fingerprint(database.models))
    cache_dir.mkdir(mode=0o700)
    link = _planted(entry, 4, victim)
    keyed = database.table(*SLOT)
    assert keyed.latency.tolist() == modperf.open(root, cache=False).table(*SLOT).latency.tolist()
    assert any(f"cache not written ({cache_dir})" in note for note in persist.NOTES)
    assert not entry.exists() and link.is_symlink()
    # a plan (atomic.replace_unsynced, as grids are written)
    target = cache_dir / plans.FOLDER / "planted.mpq"
    target.parent.mkdir(mode=0o700)
    link = _planted(target, 6, victim)
    assert plans._write(str(target), b"forged") is False  # (modperf.fast.persist.write: a note, no error)
    assert any(f"query plan not written ({target.parent})" in note for note in persist.NOTES)
    assert not target.exists() and link.is_symlink()
    # any file written through modperf.base.atomic
    other = tmp_path / "out.txt"
    _planted(other, 4, victim)
    with pytest.raises(WriteFailedError):
        atomic.write_atomically(other, atomic.text_writer("forged"), overwrite=True)
    assert victim.read_bytes() == b"precious" and stat.S_IMODE(victim.stat().st_mode) == 0o644


def test_a_link_at_an_entrys_name_is_neither_read_nor_written_through(
        cache_dir: Path, tmp_path: Path, db: modperf.Database) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    root = copy_root(tmp_path, db)
    database = modperf.open(root)
    source = cache.source_identity(database.ref(*SLOT).path)
    assert source is not None
    entry = cache_dir / cache._entry_name(source, cache.registry_fingerprint(database.models))
    cache_dir.mkdir(mode=0o700)
    entry.symlink_to(victim)
    keyed = database.table(*SLOT)
    assert keyed.latency.tolist() == modperf.open(root, cache=False).table(*SLOT).latency.tolist()
    assert any(f"cache not written ({cache_dir}): target is a symbolic link" in note for note in persist.NOTES)
    assert entry.is_symlink() and victim.read_bytes() == b"precious"


# --- what the folders and files are made with, and the rule ---------------------------------------


def test_the_cache_is_made_0700_and_0600(cache_dir: Path) -> None:
    old = os.umask(0)  # (the child's: a mode left to the umask would be 0777 and 0666)
    try:
        ask()
    finally:
        os.umask(old)
    made = [cache_dir, *cache_dir.rglob("*")]
    assert {stat.S_IMODE(p.stat().st_mode) for p in made if p.is_dir()} == {0o700}
    assert {stat.S_IMODE(p.stat().st_mode) for p in made if p.is_file()} == {0o600}
    assert len([p for p in made if p.is_file()]) >= 4  # entries, a grid, a scan record, a plan


def test_the_rule_folder_by_folder(tmp_path: Path) -> None:
    judge = cache_trust.folder_problem
    base = tmp_path / "base"
    base.mkdir(mode=0o755)
    assert judge(str(base / "not" / "yet")) is None  # made 0700 when written
    cache_trust.make_folder(base / "not" / "yet")
    assert {stat.S_IMODE(p.stat().st_mode) for p in (base / "not", base / "not" / "yet")} == {0o700}
    base.chmod(0o775)
    cache_trust.forget()
    assert judge(str(base)) == f"{base} is writable by others (fix: chmod go-w {base})"
    assert judge(str(base / "not")) == (f"{base} is writable by others (fix: chmod go-w {base}, or set "
                                        "MODPERF_CACHE_DIR to a folder elsewhere)")
    base.chmod(0o1777)
    cache_trust.forget()
    assert judge(str(base / "not")) is None
    (base / "not" / "plans").mkdir(mode=0o777)
    (base / "not" / "plans").chmod(0o777)
    cache_trust.forget()
    assert judge(str(base / "not"), ("plans",)) == (f"{base / 'not' / 'plans'} is writable by others (fix: chmod "
                                                     f"go-w {base / 'not' / 'plans'})")
    link = tmp_path / "link"
    link.symlink_to(base / "not" / "yet")
    cache_trust.forget()
    assert judge(str(link)) is None  # (the user's link, to a folder of the user's)
    cache_trust.make_folder(link)  # (written through as well)
    assert judge(str(link / ".." / "plans")) == judge(str(base / "not" / "plans"))  # .. after the link, as the kernel
    file = tmp_path / "file"
    file.write_text("")
    assert judge(str(file / "cache")) == f"{file} is not a folder (fix: remove it, or set MODPERF_CACHE_DIR to a " \
                                        "folder)"
    with pytest.raises(PermissionError, match="is writable by others"):
        cache_trust.make_folder(base / "not" / "plans")


def test_a_link_to_the_cache_owned_by_another_user_turns_it_off(tmp_path: Path, other_uid: int) -> None:
    folder = tmp_path / "mine"
    folder.mkdir(mode=0o700)
    link = tmp_path / "theirs"
    link.symlink_to(folder)
    os.lchown(link, other_uid, other_uid)
    assert cache_trust.folder_problem(str(link)) == (f"{link} is a symbolic link owned by another user (fix: use a "
                                                     "folder of your own: set MODPERF_CACHE_DIR)")


# --- what the CLI says ----------------------------------------------------------------------------


def test_cache_info_says_whether_the_cache_is_on_and_why_not(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ask()
    on = run_cli(["cache", "info", "--json"])
    found = json.loads(on.stdout)
    assert (found["enabled"], found["off_reason"], found["trusted"], found["trust_problem"]) == (True, None, True, None)
    assert found["count"] >= 1 and found["plans"]["count"] == 1 and on.stderr == ""
    monkeypatch.setenv(cache_keys.NO_CACHE_ENV, "1")
    off = json.loads(run_cli(["cache", "info", "--json"]).stdout)
    assert (off["enabled"], off["off_reason"], off["trusted"]) == (False, "switched off (MODPERF_NO_CACHE or "
                                                                   "--no-cache)", True)
    assert off["count"] == found["count"]
    monkeypatch.delenv(cache_keys.NO_CACHE_ENV)
    cache_dir.chmod(0o777)
    problem = f"{cache_dir} is writable by others (fix: chmod go-w {cache_dir})"
    untrusted = run_cli(["cache", "info", "--json"])
    shown = json.loads(untrusted.stdout)
    assert (shown["enabled"], shown["off_reason"], shown["trusted"], shown["trust_problem"]) == (False, problem,
                                                                                                False, problem)
    assert (shown["location"], shown["exists"], shown["count"], shown["entries"], shown["plans"]["count"]) == \
        (str(cache_dir), True, 0, [], 0)  # not looked into
    assert untrusted.stderr == ""
    text = run_cli(["cache", "info"])
    assert text.returncode == 0 and text.stdout.startswith(f"cache: {cache_dir} (off: {problem}; set "
                                                           "MODPERF_CACHE_DIR to move it)")
    before = files_of(cache_dir)
    cleared = run_cli(["cache", "clear", "--json"])
    error = json.loads(cleared.stdout)["error"]
    assert (cleared.returncode, error["type"], error["file"]) == (1, "WriteFailedError", str(cache_dir))
    assert error["message"] == (f"{cache_dir}: the cache folder is not used, so nothing was removed: {problem}. Fix: "
                                "fix the folder as said, then clear it, or remove it yourself")
    assert files_of(cache_dir) == before


# --- the formats load plain data ----------------------------------------------------------------


def test_a_plan_holding_anything_but_plain_values_is_not_used(cache_dir: Path, real: float) -> None:
    ask()
    plan = plan_file(cache_dir)
    doc = plans._unframe(plan.read_bytes())
    assert type(doc) is dict and plans.plain(doc)
    code = compile("1", "forged", "eval")  # marshal builds code objects (never called; still not plain)
    for odd in (code, b"bytes", frozenset({1}), 1j):
        loaded = plans._unframe(plans._frame({**doc, "echoed": odd}))
        assert type(loaded["echoed"]) is type(odd) and not plans.plain(loaded)  # marshal builds it: not plain
    lattice = list(doc["lattice"])
    lattice[Lattice.PLAIN.index("lat_py")] = [*lattice[Lattice.PLAIN.index("lat_py")][:-1], code]
    assert not plans.plain(plans._unframe(plans._frame({**doc, "lattice": tuple(lattice)})))
    assert plans.plain([10**400, 1.0, True, None, "x", (1, [2.5])])
    assert doc["template"]["reuse_reason"] is None
    plan.write_bytes(plans._frame({**doc, "template": {**doc["template"], "reuse_reason": code}}))  # (it is printed)
    answer, err = ask()
    assert (answer["latency_ms"], answer["kind"], answer["reuse_reason"], err) == (real, "exact", None, "")


def test_an_entry_array_of_any_dtype_but_numbers_is_not_read(cache_dir: Path, real: float) -> None:
    answer, _ = ask()
    entry = entry_of(cache_dir, answer["files"][0])
    data = entry.read_bytes()
    magic, length = cache.MAGIC, cache._LEN
    (n,) = length.unpack_from(data, len(magic))
    start = len(magic) + length.size
    header = json.loads(data[start:start + n])
    body = data[start + n + (-(start + n) % 64):-32]  # the arrays, as they lie
    for row in header["arrays"]:
        if row[0] == "latency":
            assert row[1] == "<f8"
            row[1] = "|O8"  # numpy objects: 8-byte pointers
    text = json.dumps(header, separators=(",", ":")).encode()
    head = magic + length.pack(len(text)) + text
    forged = head + b"\0" * (-len(head) % 64) + body
    forged += hashlib.blake2b(forged, digest_size=32).digest()  # (unkeyed: anyone can frame one)
    with pytest.raises(ValueError, match="array 'latency' of dtype '\\|O8': not numbers"):
        cache._unframe(bytearray(forged), magic)
    entry.write_bytes(forged)
    only_the_entries(cache_dir)
    again, err = ask()
    assert (again["latency_ms"], again["kind"], err) == (real, "exact", "")
