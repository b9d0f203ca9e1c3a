"""What a user sees when a command meets hostile input (issue 12): a typed error with the
documented exit code (1 data, 2 usage; never 3), the same with and without --json, strict JSON
under --json, no raw control character, no line of a file that is not a table, no hang.
The larger campaign is ``python bench/hostile.py``."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.helpers import LEGACY_DIR, STALE_DIR, run_cli, run_main, strict_json, world_readable_tmp, writable_copy

MLA = "07_latent_collision/wheel/gb300/mla/vllm/0.27.0/mla_context_module_perf.parquet"
CSA = "01_dsv4_stale_vs_migrated/migrated_93dfd1fd2/b200_sxm/sparse_attention/sglang/0.5.10/" \
      "dsv4_csa_context_module_perf.parquet"
SLOT = ["mla_context_module", "--system", "gb300", "--backend", "vllm", "--version", "0.27.0"]
KEY = ["--kernel-source", "FLASH_ATTN", "--mla-dtype", "bfloat16", "--kv-cache-dtype", "bfloat16",
       "--gemm-type", "bfloat16"]
KIMI = ["estimate", "--model", "moonshotai/Kimi-K3", "--system", "gb300", "--backend", "vllm", "--isl", "1024",
        "--osl", "64", "--batch", "2", "--scope", "attention"]
ESC = "\x1b"


def _layout(root: Path, table: pa.Table, name: str = "mla_context_module", where: str = "gb300/mla/vllm/0.27.0") -> Path:
    (root / where).mkdir(parents=True, exist_ok=True)
    pq.write_table(table, root / where / f"{name}_perf.parquet")
    return root


def _with(table: pa.Table, name: str, values: list) -> pa.Table:
    return table.set_column(table.column_names.index(name), name, pa.array(values, type=table.schema.field(name).type))


@pytest.fixture(scope="module")
def hostile(fixtures: Path, tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("hostile")
    mla = pq.read_table(fixtures / MLA)
    heads, models = mla.column("num_heads").to_pylist(), mla.column("model").to_pylist()
    p = {"good": _layout(tmp / "good", mla), "empty": _layout(tmp / "empty", mla.slice(0, 0))}
    p["dup"] = _layout(tmp / "dup", pa.Table.from_arrays([*mla.columns, mla.column("batch_size")],
                                                         names=[*mla.column_names, "batch_size"]))
    p["heads62"] = _layout(tmp / "heads62", _with(mla, "num_heads", [2**62] + heads[1:]))
    csa = pq.read_table(fixtures / CSA)
    hs, tps = csa.column("num_heads").to_pylist(), csa.column("tp_size").to_pylist()
    hs[tps.index(4)] = 2**62 + 32  # * 4 is 128 modulo 2**64
    p["wrap"] = _layout(tmp / "wrap", _with(csa, "num_heads", hs), "dsv4_csa_context_module",
                        "b200_sxm/sparse_attention/sglang/0.5.10")
    nan = pa.array([float("nan")] + [float(h) for h in heads[1:]])
    p["nan_heads"] = _layout(tmp / "nan_heads", mla.set_column(mla.column_names.index("num_heads"), "num_heads", nan))
    p["esc_model"] = _layout(tmp / "esc_model", _with(mla, "model", [f"{ESC}[2Jevil"] + models[1:]))
    p["passwd"] = tmp / "passwd"
    (p["passwd"] / "h200_sxm/mla/trtllm/0.20.0").mkdir(parents=True)
    (p["passwd"] / "h200_sxm/mla/trtllm/0.20.0/context_mla_perf.txt").symlink_to("/etc/passwd")
    p["outside"] = tmp / "outside"
    (p["outside"] / "gb300/mla/vllm/0.27.0").mkdir(parents=True)
    (p["outside"] / "gb300/mla/vllm/0.27.0/mla_context_module_perf.parquet").symlink_to(fixtures / MLA)
    for name, text in (("scalar_reuse", "5\n"), ("list_reuse", "reuse: 7\n"), ("bad_meta", "tables: [\n")):
        p[name] = _layout(tmp / name, mla)
        target = "reuse.yaml" if "reuse" in name else "collection_meta.yaml"
        (p[name] / "gb300/mla/vllm/0.27.0" / target).write_text(text)
    p["dir_table"] = tmp / "dir_table"
    (p["dir_table"] / "gb300/mla/vllm/0.27.0/mla_context_module_perf.parquet").mkdir(parents=True)
    cfg = tmp / "configs"
    cfg.mkdir()
    base = json.loads((fixtures / "09_hf_configs/deepseek-ai--DeepSeek-V3_config.json").read_text())
    for model, change in (("Heads1e9", {"num_attention_heads": 10**9}), ("Layers1e7", {"num_hidden_layers": 10**7}),
                          ("Int70", {"num_attention_heads": 2**70})):
        (cfg / f"acme--{model}_config.json").write_text(json.dumps({**base, **change}))
    (cfg / "acme--Deep_config.json").write_text("[" * 100_000 + "]" * 100_000)
    p["configs"] = cfg
    p["file"] = tmp / "a_file.txt"
    p["file"].write_text("not a folder\n")
    p["legacy"] = writable_copy(fixtures / LEGACY_DIR, tmp / "legacy")
    # a legacy table without its step column: --fill step=... decides it
    nostep = tmp / "nostep"
    nostep.mkdir()
    lines = (p["legacy"] / "context_mla_perf.txt").read_text().splitlines()
    col = lines[0].split(",").index("step")
    (nostep / "context_mla_perf.txt").write_text(
        "\n".join(",".join(v for i, v in enumerate(line.split(",")) if i != col) for line in lines) + "\n")
    p["nostep"] = nostep
    p["foreign_out"] = tmp / "foreign_out"
    foreign = p["foreign_out"] / "gb300/mla/vllm/0.27.0/mla_context_module_perf.parquet"
    foreign.parent.mkdir(parents=True)
    foreign.write_text("my notes, not a table\n")
    return p


def cases(p: dict[str, Path]) -> list[tuple[str, list[str], int, str]]:
    """(name, argv, exit code, error kind or failure kind expected in the output)."""
    q = ["query", *SLOT, *KEY]
    kimi = [*q, "--model", "moonshotai/Kimi-K3", "--tp", "3"]
    return [
        ("check: duplicate column names", ["check", str(p["dup"])], 1, "duplicate_column"),
        ("check: empty table with a valid schema", ["check", str(p["empty"])], 1, "empty_table"),
        ("check: num_heads 2**62 at tp 1", ["check", str(p["heads62"])], 1, "invalid_heads"),
        ("check: 2**62 + 32 at tp 4 (wraps to 128)", ["check", str(p["wrap"])], 1, "invalid_heads"),
        ("check: NaN head count", ["check", str(p["nan_heads"])], 1, "non_integer_heads"),
        ("check: ESC in a model name", ["check", str(p["esc_model"])], 1, "unknown_model"),
        ("check: table linked to /etc/passwd, in a folder", ["check", str(p["passwd"])], 1, "link_outside_root"),
        ("check: table linked to /etc/passwd, named", ["check", str(p["passwd"] / "h200_sxm/mla/trtllm/0.20.0/"
                                                                               "context_mla_perf.txt")], 1, "unreadable"),
        ("check: link out of the data root", ["check", "--data-root", str(p["outside"])], 1, "link_outside_root"),
        ("check: scalar reuse.yaml", ["check", "--data-root", str(p["scalar_reuse"])], 1, "sidecar"),
        ("check: reuse.yaml with a scalar list", ["check", str(p["list_reuse"])], 1, "sidecar"),
        ("check: malformed collection_meta.yaml", ["check", str(p["bad_meta"])], 1, "sidecar"),
        ("check: a folder named like a table", ["check", "--data-root", str(p["dir_table"])], 1, "unreadable"),
        ("ls: malformed collection_meta.yaml", ["ls", "--data-root", str(p["bad_meta"])], 1, "sidecar"),
        ("ls: scalar reuse.yaml", ["ls", "--data-root", str(p["scalar_reuse"])], 1, "sidecar"),
        ("dedupe: negative --examples", ["dedupe", str(p["good"]), "--examples", "-5"], 2, "option_value"),
        ("check: negative --quality-examples", ["check", str(p["good"]), "--quality", "--quality-examples", "-1"], 2,
         "option_value"),
        ("check: missing --model-configs folder", ["check", str(p["good"]), "--model-configs",
                                                  str(p["file"]) + ".no"], 2, "model_configs"),
        ("query: duplicate column names", ["query", *SLOT, "--data-root", str(p["dup"]), *KEY, "--native-heads", "96",
                                           "--tp", "3", "--batch-size", "4", "--isl", "2048"], 1, "table_rejected"),
        ("query: superscript two", [*kimi, "--batch-size", "\u00b2", "--isl", "2048"], 2, "query_field"),
        ("query: batch_size 0", [*kimi, "--batch-size", "0", "--isl", "2048"], 2, "query_field"),
        ("query: isl 0", [*kimi, "--batch-size", "4", "--isl", "0"], 2, "query_field"),
        ("query: field named self", [*kimi, "--batch-size", "4", "--isl", "2048", "--self", "1"], 2, "query_field"),
        ("query: allow_substitute as text", [*kimi, "--batch-size", "4", "--isl", "2048", "--allow_substitute=false"],
         2, "query_field"),
        ("query: native 10**12 at tp 7", [*q, "--native-heads", "1000000000000", "--tp", "7", "--batch-size", "4",
                                          "--isl", "2048"], 2, "query_field"),
        ("query: a value the parser refuses", [*q, "--native-heads", "abc"], 2, "usage"),
        ("query: ESC in a model id", [*q, "--model", f"{ESC}[2Jevil", "--tp", "3", "--batch-size", "4", "--isl",
                                      "2048"], 2, "unknown_model"),
        ("estimate: --tp 1,,2", [*KIMI, "--tp", "1,,2"], 2, "option_value"),
        ("estimate: --kernel-source for a table it does not use", [*KIMI, "--kernel-source", "nope=K"], 2,
         "option_value"),
        ("estimate: config of 10**9 heads", ["estimate", "--model", "acme/Heads1e9", "--system", "gb300", "--backend",
                                             "vllm", "--isl", "8", "--osl", "8", "--batch", "1", "--tp", "3",
                                             "--model-configs", str(p["configs"])], 1, "model_config"),
        ("estimate: config of 10**7 layers", ["estimate", "--model", "acme/Layers1e7", "--system", "gb300",
                                              "--backend", "vllm", "--isl", "8", "--osl", "8", "--batch", "1",
                                              "--model-configs", str(p["configs"])], 1, "model_config"),
        ("estimate: 2**70 in a config", ["estimate", "--model", "acme/Int70", "--system", "gb300", "--backend", "vllm",
                                         "--isl", "8", "--osl", "8", "--batch", "1", "--model-configs",
                                         str(p["configs"])], 1, "model_config"),
        ("estimate: deeply nested config", ["estimate", "--model", "acme/Deep", "--system", "gb300", "--backend",
                                            "vllm", "--isl", "8", "--osl", "8", "--batch", "1", "--model-configs",
                                            str(p["configs"])], 1, "model_config"),
        ("migrate: --out is a file", ["migrate", str(p["legacy"]), "--out", str(p["file"])], 2, "usage"),
        ("migrate: --out under a file", ["migrate", str(p["legacy"]), "--out", str(p["file"] / "x")], 2, "usage"),
        ("migrate: overflowing --fill", ["migrate", str(p["nostep"]), "--model", "deepseek-ai/DeepSeek-V3", "--fill",
                                         "step=99999999999999999999999", "--out", str(p["file"].parent / "o")],
         2, "option_value"),
        ("migrate: --fill that is not a number", ["migrate", str(p["nostep"]), "--model", "deepseek-ai/DeepSeek-V3",
                                                  "--fill", "step=abc", "--out", str(p["file"].parent / "o")],
         2, "option_value"),
        ("migrate: --fill that fills nothing", ["migrate", str(p["legacy"]), "--model", "deepseek-ai/DeepSeek-V3",
                                                "--fill", "stepp=0", "--out", str(p["file"].parent / "o")],
         2, "option_value"),
        ("dedupe: --write over a file modperf did not write", ["dedupe", str(p["good"]), "--write",
                                                               str(p["foreign_out"])], 2, "not_owned"),
        ("dedupe: --write to a file", ["dedupe", str(p["good"]), "--write", str(p["file"])], 2, "dedupe_output"),
    ]


def test_every_case_is_typed_and_the_same_with_json(hostile: dict[str, Path], capsys) -> None:
    for name, argv, code, kind in cases(hostile):
        start = time.perf_counter()
        plain_code, out, err = run_main(argv, capsys)
        json_code, json_out, json_err = run_main([*argv, "--json"], capsys)
        seconds = time.perf_counter() - start
        assert (plain_code, json_code) == (code, code), (name, plain_code, json_code, err[:300], json_out[:300])
        doc = strict_json(json_out)  # RFC 8259: NaN would not parse
        text = json.dumps(doc)
        assert f'"kind": "{kind}"' in text, (name, text[:400])
        assert f"({kind})" in err or f"{kind}" in out + err, (name, err[:300], out[:300])
        for stream in (out, err, json_out, json_err):
            assert ESC not in stream, name
            assert "root:x:0:0" not in stream, name
            assert "Traceback" not in stream, name
        assert seconds < 20, (name, seconds)  # no hang (each case runs twice)


def test_json_is_written_by_jsonio_alone() -> None:
    """Strict JSON everywhere: no module but modperf.base.jsonio serialises JSON (jsonio writes NaN as null)."""
    src = Path(__file__).resolve().parents[2] / "src" / "modperf"
    writers = sorted(str(p.relative_to(src)) for p in src.rglob("*.py")
                     if p.name != "jsonio.py" and ("json.dump" in p.read_text() or "print_json" in p.read_text()))
    assert writers == []


def test_nan_in_check_json_is_null(hostile: dict[str, Path], capsys) -> None:
    code, out, _ = run_main(["check", str(hostile["nan_heads"]), "--json"], capsys)
    failure = strict_json(out)["files"][0]["failures"][0]
    assert code == 1 and failure["kind"] == "non_integer_heads" and failure["values"]["examples"] == [None]


def test_escape_sequences_in_data_are_shown_escaped(hostile: dict[str, Path], capsys) -> None:
    _, out, _ = run_main(["check", str(hostile["esc_model"])], capsys)
    assert "no HF config for model '\\x1b[2Jevil'" in out and ESC not in out


def test_dedupe_force_replaces_a_file_modperf_did_not_write(hostile: dict[str, Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    shutil.copytree(hostile["foreign_out"], out)
    code, _, err = run_main(["dedupe", str(hostile["good"]), "--write", str(out)], capsys)
    assert code == 2 and "error (not_owned): " in err and "pass --force to replace them" in err
    assert (out / "gb300/mla/vllm/0.27.0/mla_context_module_perf.parquet").read_text() == "my notes, not a table\n"
    code, _, _ = run_main(["dedupe", str(hostile["good"]), "--write", str(out), "--force"], capsys)
    assert code == 0
    # now the file is modperf's own: a later run replaces it without --force
    code, _, _ = run_main(["dedupe", str(hostile["good"]), "--write", str(out)], capsys)
    assert code == 0


# --- permission bits (as root they are made to apply by dropping CAP_DAC_*) -------------------


@pytest.fixture
def perms(fixtures: Path, tmp_path: Path) -> dict[str, Path]:
    base = world_readable_tmp(tmp_path)
    mla = pq.read_table(fixtures / MLA)
    p = {"sub": _layout(base / "sub", mla)}
    _layout(p["sub"], mla, where="h200_sxm/mla/vllm/0.27.0")
    (p["sub"] / "h200_sxm").chmod(0)
    p["root"] = _layout(base / "root", mla)
    p["root"].chmod(0)
    p["ro"] = writable_copy(fixtures / STALE_DIR, base / "ro")
    for q in sorted(p["ro"].rglob("*"), reverse=True):
        q.chmod(0o555 if q.is_dir() else 0o444)
    p["ro_out"] = base / "ro_out"
    p["ro_out"].mkdir()
    p["ro_out"].chmod(0o555)
    yield p
    for q in [base, *base.rglob("*")]:
        if not q.is_symlink():
            q.chmod(0o755)


@pytest.mark.parametrize("argv, code, kind", [
    (["check", "{sub}"], 1, "unreadable_folder"),  # an unreadable sub-folder of a given path is not skipped
    (["check", "--data-root", "{sub}"], 1, "unreadable_folder"),
    (["check", "--data-root", "{root}"], 1, "unreadable_folder"),
    (["ls", "--data-root", "{root}"], 1, "unreadable_folder"),
    (["dedupe", "{sub}"], 1, "unreadable_folder"),
    (["query", *SLOT, "--data-root", "{root}", *KEY, "--native-heads", "96", "--tp", "3", "--batch-size", "4",
      "--isl", "2048"], 1, "data_layout"),
    (["migrate", "{ro}", "--execute"], 1, "write_failed"),
    (["dedupe", "{sub}", "--write", "{ro_out}"], 1, "write_failed"),
])
def test_unreadable_and_read_only(perms: dict[str, Path], argv: list[str], code: int, kind: str) -> None:
    args = [a.format(**perms) for a in argv]
    plain = run_cli(args, drop_privileges=True)
    as_json = run_cli([*args, "--json"], drop_privileges=True)
    assert (plain.returncode, as_json.returncode) == (code, code), (plain.stderr, as_json.stdout[:500])
    assert kind in json.dumps(strict_json(as_json.stdout))
    assert "Traceback" not in plain.stderr + as_json.stderr
