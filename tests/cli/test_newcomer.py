"""A newcomer's first ten minutes (issue 25), as a user runs the CLI: ``python -m modperf`` in a
child process, its output a pipe (not a terminal), ``COLUMNS=80`` unless a test says otherwise.

Every command's human output is rendered at 80 and 120 columns (:data:`RENDERED`): no line is
longer than the width, none ends in spaces, and the label column is there. The runs are shared
between the tests (``user``): the rendering runs go first, a few at a time, and the tests about
one item read the same output where they can.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from tests.helpers import FIXTURES, STALE_DIR, run_cli

from modperf.fast.cache_keys import embedded_data_root

DATA = embedded_data_root()
NCCL_MISPLACED = DATA / "b300_sxm/comm/trtllm/1.3.0rc10/nccl_perf.parquet"
KIMI_SUBSTITUTED = ("query", "mla_context_module", "--system", "gb300", "--backend", "vllm", "--version", "0.27.0",
                    "--native-heads", "64", "--tp", "8", "--batch-size", "4", "--isl", "2048", "--kernel-source",
                    "FLASH_ATTN", "--kv-cache-dtype", "bfloat16", "--gemm-type", "bfloat16", "--allow-substitute")
V3 = ("--model", "deepseek-ai/DeepSeek-V3", "--system", "h200_sxm", "--backend", "vllm", "--isl", "2048",
      "--osl", "512")
V3_ESTIMATE = ("estimate", *V3, "--tp", "1,2,4,8", "--batch", "8")
V3_PREDICT = ("predict", *V3, "--tp", "8", "--batch", "8")
V3_PREDICT_TPS = ("predict", *V3, "--tp", "4,8", "--batch", "8")
V3_UNPRICED = ("estimate", *V3, "--tp", "8", "--batch", "100000")

#: Every command's human output (what a user sees), with the labels that must be on screen at
#: any width: the label column's cells, or a command's own first words.
RENDERED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "query": (KIMI_SUBSTITUTED, ("0.3556 ms  substituted (from native 96)", "slot ", "heads ", "key ", "files ")),
    "estimate": (V3_ESTIMATE, ("│ prefill attention ", "│ prefill communication ", "│ decode step (kv 2304) ",
                               "│ decode ops by kind ", "610.7081", "22.6015")),
    "estimate unpriced": (V3_UNPRICED, ("│ prefill attention ", "│ decode moe ", "not covered tp=8 prefill")),
    "estimate attention": (("estimate", "--model", "moonshotai/Kimi-K3", "--system", "gb300", "--backend", "vllm",
                            "--tp", "1,2,4,8", "--isl", "2048", "--osl", "512", "--batch", "8", "--scope",
                            "attention"), ("│ local heads ", "│ MLA x24 prefill ", "│ MLA kernel (decode) ")),
    "predict": (V3_PREDICT, ("│ TTFT ms ", "200.9", "│ TPOT ms ", "18.38", "│ prefill_one ")),
    "predict tps": (V3_PREDICT_TPS, ("│ TTFT ms ", "200.9", "│ GPUs ", "not predicted tp=4")),
    "ls": (("ls", "--system", "gb300"), ("61 tables, system gb300", "│ mla_context_module ", "--all lists them")),
    "check": (("check", "--table", "mla_context_module"), ("│ mla_module ", "tables, 107,467 rows checked")),
    "check warning": (("check", str(NCCL_MISPLACED)), ("WARN misplaced_table:", "│ collective ")),
    "check quality": (("check", "--quality", "--table", "mla_context_module"), ("│ mla_module ", "quality: ")),
    "coverage": (("coverage", "--system", "gb300", "--table", "mla_context_module"),
                 ("│ mla_context_module ", "a number in parentheses")),
    "coverage model": (("coverage", "--model", "moonshotai/Kimi-K3", "--system", "gb300"),
                       ("│ mla_context_module ", "interp. / extrap. = no point at that local")),
    "coverage diff": (("coverage", "--diff", "0.24.0", "0.27.0", "--backend", "vllm", "--system", "gb300"),
                      ("coverage change 0.24.0 → 0.27.0, system gb300, backend vllm", "│ mla_context_module ")),
    "dedupe": (("dedupe", str(DATA / "gb300"), "--table", "generation_mla"),
               ("duplicate rows (one identity", "widest spreads over 10.00%", "│ gb300 sglang ", "identity = table")),
    "cache info": (("cache", "info"), ("cache: ",)),
    "help": (("--help",), ("The performance database for LLM-inference modules:",)),
    "coverage help": (("coverage", "--help"), ("[plot] extra",)),
}
WIDTHS = (80, 120)

_runs: dict[tuple[tuple[str, ...], int | None, bytes | None], subprocess.CompletedProcess] = {}


def user(*argv: str, columns: int | None = 80, stdin: bytes | None = None,
         again: bool = False) -> subprocess.CompletedProcess:
    """``modperf ARGV`` as a user runs it (a child process, a pipe, COLUMNS=columns), run once
    per module and shared by every test that reads it (``again``: run it anew)."""
    key = (argv, columns, stdin)
    if again or key not in _runs:
        _runs[key] = run_cli(list(argv), columns=columns, stdin=stdin, timeout=300)
    return _runs[key]


@pytest.fixture(scope="module", autouse=True)
def _rendered_first() -> None:
    """The rendering runs, three at a time (most of each is starting Python and waiting)."""
    keys = [(argv, width) for argv, _ in RENDERED.values() for width in WIDTHS]
    with ThreadPoolExecutor(3) as pool:
        done = pool.map(lambda k: run_cli(list(k[0]), columns=k[1], timeout=300), keys)
        for (argv, width), result in zip(keys, done):
            _runs[(argv, width, None)] = result


def _text(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


def _path_after(lines: list[str], head: str) -> str:
    """The path printed under a finding's head line (folded over lines where it is wider)."""
    at = lines.index(head) + 1
    parts = []
    while not lines[at].startswith("    "):
        parts.append(lines[at])
        at += 1
    return "".join(parts)


def _flat(text: str) -> str:
    """Text with its wrapping undone (a message wrapped at 80 columns read as one line)."""
    return " ".join(text.split())


# --- output a person can read -------------------------------------------------------------


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", list(RENDERED))
def test_every_command_fits_the_width_and_keeps_its_labels(name: str, width: int) -> None:
    argv, labels = RENDERED[name]
    result = user(*argv, columns=width)
    assert result.returncode in (0, 1), _text(result)
    lines = _text(result).splitlines()
    assert lines, f"{name} printed nothing"
    too_long = [line for line in lines if len(line) > width]
    assert not too_long, f"{name} at {width}: {len(too_long)} line(s) wider, e.g. {too_long[0]!r}"
    padded = [line for line in lines if line != line.rstrip()]
    assert not padded, f"{name} at {width}: trailing spaces on {padded[0]!r}"
    text = _text(result)
    for label in labels:
        assert label in text, f"{name} at {width}: {label!r} not shown"
    assert "…" not in text  # a cell is wrapped, never cut


def test_a_narrow_terminal_leaves_out_the_widest_tp_columns_and_says_so_wide_prints_them() -> None:
    argv = ("estimate", *V3, "--tp", "1,2,4,8,16,32", "--batch", "8")
    narrow, wide = user(*argv), user(*argv, "--wide")
    assert narrow.returncode == wide.returncode == 1  # (tp 32: the moe table holds no moe_tp 32)
    assert "not shown at 80 columns: tp=32 (--wide prints every column; --json holds everything)" in \
        _flat(narrow.stdout)
    assert "tp=32" not in narrow.stdout.split("not shown")[0]
    header = next(line for line in wide.stdout.splitlines() if "tp=1" in line)
    assert all(f"tp={t}" in header for t in (1, 2, 4, 8, 16, 32)) and len(header) > 80
    assert "│ prefill attention     │" in wide.stdout and "not shown" not in wide.stdout
    refused = user("ls", "--system", "gb300", "--wide", "--json")  # --wide with no table to lay out: refused
    assert refused.returncode == 2
    assert json.loads(refused.stdout)["error"]["message"] == ("--wide lays out tables, and --json prints none "
                                                               "[wide=True]. Fix: drop --wide or --json")


def test_piped_output_without_a_terminal_width_is_whole_and_unpadded() -> None:
    result = user("ls", "--system", "gb300", columns=None)
    lines = result.stdout.splitlines()
    assert result.returncode == 0
    assert max(map(len, lines)) > 120  # no terminal, no COLUMNS: the table at its natural width
    assert not [line for line in lines if line != line.rstrip()]
    assert lines[0].strip() == "61 tables, system gb300"  # a centred title, without the padding after it


def test_a_finding_puts_its_path_on_a_line_of_its_own_and_wraps_the_message(tmp_path: Path) -> None:
    result = user(*RENDERED["check warning"][0])
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert _path_after(lines, "WARN misplaced_table:") == str(NCCL_MISPLACED)
    message = _flat("\n".join(lines[lines.index("WARN misplaced_table:") + 1:]).split(".parquet", 1)[1])
    assert message.startswith("nccl table filed in the trtllm framework folder b300_sxm/comm/trtllm/1.3.0rc10/")
    broken = _broken_root(tmp_path)
    failed = user("check", str(broken / "h200_sxm"))
    assert failed.returncode == 1
    lines = failed.stdout.splitlines()
    assert _path_after(lines, "FAIL unreadable:") == str(broken / "h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet")
    assert any(line.startswith("    cannot read table: Parquet magic bytes not found in footer.") for line in lines)
    assert all(len(line) <= 80 and line == line.rstrip() for line in lines)


def test_the_first_line_of_a_substituted_answer_says_substituted() -> None:
    result = user(*KIMI_SUBSTITUTED)
    first, second = result.stdout.splitlines()[:2]
    assert result.returncode == 0
    assert first == "0.3556 ms  substituted (from native 96), exact at that native"
    assert second.startswith("SUBSTITUTED: answered from native bucket 96, not the native asked (64)")


def test_coverage_says_its_cells_in_words() -> None:
    matrix = user(*RENDERED["coverage"][0])
    model = user(*RENDERED["coverage model"][0])
    assert matrix.returncode == model.returncode == 0
    # context_mla's 128 native is answerable only through the local key: in parentheses
    legend = _flat(matrix.stdout.split("cells:")[1])
    assert legend.startswith("a number = grid points measured for this native at that tp")
    assert "green" not in matrix.stdout and "yellow" not in matrix.stdout
    wider = user(*RENDERED["coverage"][0], columns=120).stdout
    rows = [line.split("│")[2:] for line in wider.splitlines() if "mla_context_module" in line]
    # Kimi-K3's native 96 at vllm 0.27.0: 1.1k points at tp 1..8; tp 16 (local 6) lies between measured locals
    assert [c.strip() for c in rows[2][:7]] == ["mla_context_module", "96", "1.1k", "1.1k", "1.1k", "1.1k", "interp."]
    assert "(0)" not in matrix.stdout + wider
    assert "✓" not in model.stdout and "✗" not in model.stdout
    assert "interp." in model.stdout and "0 interpolated" not in model.stdout
    assert "no = not answerable without substitution" in _flat(model.stdout)


def test_help_reads_as_text() -> None:
    top = user("--help")
    coverage = user("coverage", "--help")
    query = user("query", "--help")
    assert "attention modules" not in top.stdout
    assert "The performance database for LLM-inference modules: measured latency tables," in top.stdout
    assert "Also draw a heatmap (needs the [plot] extra)." in _flat(coverage.stdout)
    # a paragraph is re-wrapped to the width, not broken where the docstring's lines end
    assert "--layer picks the layer kind where a model runs\n  several on one table (e.g. --layer sliding)" in query.stdout
    assert "export" in top.stdout


# --- nothing silently ignored ---------------------------------------------------------------


def test_predict_refuses_a_version_the_corpus_does_not_hold() -> None:
    result = user(*V3_PREDICT, "--version", "9.9.9")
    assert result.returncode == 2 and result.stdout == ""
    assert _flat(result.stderr) == ("error (option_value): h200_sxm/vllm has no version '9.9.9' [version='9.9.9']. "
                                    "Fix: versions: 0.1.dev19262, 0.14.0, 0.18.0, 0.19.0, 0.24.0")
    estimate = user(*V3_ESTIMATE, "--version", "9.9.9")
    assert estimate.returncode == 2 and _flat(estimate.stderr) == _flat(result.stderr)


@pytest.mark.parametrize("command", ["ls", "coverage", "export"])
def test_a_system_that_does_not_exist_is_refused_with_the_nearest(command: str) -> None:
    extra = ("--out", "/nonexistent/x.csv") if command == "export" else ()
    result = user(command, "--system", "h200", *extra)
    assert result.returncode == 2 and result.stdout == ""
    message = _flat(result.stderr)
    assert message.startswith("error (unknown_table): no system 'h200' under ")
    assert "Fix: did you mean system h200_sxm, gb200? systems: a100_sxm, b200_sxm, b300_sxm, b60, gb200, gb300, " \
           "h100_sxm, h200_sxm, l40s, rtx_pro_6000_server" in message


def test_estimate_prints_a_dash_for_what_it_could_not_price() -> None:
    result = user(*V3_UNPRICED)
    as_json = json.loads(user(*V3_UNPRICED, "--json").stdout)
    assert result.returncode == 1
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in result.stdout.splitlines() if line.startswith("│")}
    assert rows["prefill attention"] == rows["prefill moe"] == rows["decode attention"] == "—"
    assert rows["decode gemm"] == "241.7249" and rows["prefill other"] == "383140.3950"
    assert rows["prefill"] == rows["decode step (kv 2304)"] == "partial"
    assert "0.0000" not in result.stdout
    assert "— = an op of that component could not be priced (not covered, below)" in _flat(result.stdout)
    assert ("not covered tp=8 decode: L0-60 mla attention (decode): mla_generation_module: point {'num_heads': 16, "
            "'batch_size': 100000, 'isl': 1, 'step': 2304} lies beyond the extrapolation limit") in _flat(result.stdout)
    tp8 = as_json["tps"][0]
    assert tp8["prefill_ms"] is None and tp8["decode_ms"] is None
    assert tp8["prefill_complete"] is False and len(tp8["prefill_not_covered"]) == 9


def test_an_empty_batch_says_so_on_stderr(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    for argv in (("query", "--batch", str(empty)), ("predict", "--batch", str(empty))):
        result = user(*argv)
        assert (result.returncode, result.stdout) == (0, "")
        assert result.stderr == f"0 lines read from {empty}: nothing to answer\n"
    blank = user("query", "--batch", "-", stdin=b"\n  \n")
    assert (blank.returncode, blank.stdout, blank.stderr) == (0, "", "0 lines read from stdin: nothing to answer\n")


def test_a_malformed_predict_line_shows_a_deployment_line(tmp_path: Path) -> None:
    from modperf.serving.predict import DEPLOYMENT_EXAMPLE

    batch = tmp_path / "deployments.jsonl"
    batch.write_text(DEPLOYMENT_EXAMPLE + "\n{not json\n")
    result = user("predict", "--batch", str(batch))
    good, bad = (json.loads(line) for line in result.stdout.splitlines())
    assert result.returncode == 1
    # the example itself is a deployment predict answers (Qwen3-32B tp 2 on h200 vllm)
    assert round(good["ttft_ms"], 1) == 209.4 and round(good["tpot_ms"], 2) == 13.92
    assert bad["error"]["fix"] == ("one deployment per line: a JSON object of silicon_sample.csv columns, e.g. "
                                   + DEPLOYMENT_EXAMPLE)
    assert '"table"' not in bad["error"]["fix"]


# --- names users type -----------------------------------------------------------------------


def test_a_renamed_model_resolves_to_its_config_and_says_which() -> None:
    args = ("--system", "h200_sxm", "--backend", "trtllm", "--isl", "2048", "--osl", "512", "--batch", "8", "--tp", "8")
    renamed = json.loads(user("predict", "--model", "meta-llama/Llama-3.1-70B", *args, "--json").stdout)
    bundled = json.loads(user("predict", "--model", "meta-llama/Meta-Llama-3.1-70B", *args, "--json").stdout)
    assert (renamed["ttft_ms"], renamed["tpot_ms"]) == (bundled["ttft_ms"], bundled["tpot_ms"])
    assert round(renamed["ttft_ms"], 1) == 265.8 and round(renamed["tpot_ms"], 2) == 9.57
    assert renamed["notes"][0] == ("meta-llama/Llama-3.1-70B answered from the bundled config "
                                   "meta-llama/Meta-Llama-3.1-70B (Hugging Face renamed the Llama 3.1 repositories "
                                   "meta-llama/Meta-Llama-3.1-* to meta-llama/Llama-3.1-*)")
    assert renamed["notes"][0] not in bundled["notes"]


def test_predict_takes_a_tp_list_one_answer_per_tp() -> None:
    result = user(*V3_PREDICT_TPS, "--json")
    single = json.loads(user(*V3_PREDICT, "--json").stdout)
    found = json.loads(result.stdout)
    assert result.returncode == 1  # tp 4 does not fit: a partial answer, as estimate's
    assert found["tps"] == [4, 8]
    assert found["predictions"][0]["error"]["kind"] == "does_not_fit"  # an impossible deployment, with its figures
    assert ("deepseek-ai/DeepSeek-V3 does not fit one GPU on h200_sxm: its weights take 156.7 GiB per GPU at tp 4"
            in found["predictions"][0]["error"]["message"])
    assert found["predictions"][1]["ttft_ms"] == single["ttft_ms"] and round(single["ttft_ms"], 1) == 200.9
    table = user(*V3_PREDICT_TPS).stdout
    ttft = next(line for line in table.splitlines() if line.startswith("│ TTFT ms"))
    assert [c.strip() for c in ttft.split("│")[2:4]] == ["—", "200.9"]


def test_no_cache_is_accepted_after_the_command() -> None:
    before = user(*KIMI_SUBSTITUTED, "--json")
    after = user(*KIMI_SUBSTITUTED, "--no-cache", "--json")
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout) == json.loads(before.stdout)
    assert json.loads(after.stdout)["latency_ms"] == 0.3556


def test_query_batch_with_a_number_asks_for_batch_size() -> None:
    result = user("query", "mla_context_module", "--system", "gb300", "--batch", "4")
    assert result.returncode == 2 and result.stdout == ""
    assert _flat(result.stderr) == ("error (query_field): --batch takes a JSON-lines file of queries, and there is no "
                                    "file '4' [batch='4']. Fix: did you mean --batch-size 4? (--batch FILE answers a "
                                    "file)")


# --- rows users can take away ---------------------------------------------------------------


@pytest.fixture
def short_folder() -> Iterator[Path]:
    """A folder with a short path (pytest's own, under a worker's popen-gwN, can be wider than the
    80 columns the messages below are asserted whole at)."""
    folder = Path(tempfile.mkdtemp(prefix="mp-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_export_writes_parquet_and_csv_with_the_slot_columns(tmp_path: Path, short_folder: Path) -> None:
    out = short_folder / "mla.parquet"
    select = ("--system", "gb300", "--table", "mla_context_module", "--version", "0.27.0")
    result = user("export", *select, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert _flat(result.stdout).startswith(f"wrote 21,860 rows of 1 table(s) to {out} (parquet; columns: system, "
                                           "backend, version, table, family, op_name, kernel_source,")
    rows = pq.read_table(out)
    assert rows.num_rows == 21860
    assert rows.column_names[:5] == ["system", "backend", "version", "table", "family"]
    asked = {"kernel_source": "FLASH_ATTN", "mla_dtype": "bfloat16", "kv_cache_dtype": "bfloat16",
             "gemm_type": "bfloat16", "native": 96, "num_heads": 12, "batch_size": 4, "isl": 2048, "step": 0}
    point = [r for r in rows.to_pylist() if all(r[k] == v for k, v in asked.items())]
    assert len(point) == 1
    assert (point[0]["system"], point[0]["family"], point[0]["latency_ms"]) == ("gb300", "mla_module", 0.4078)
    assert point[0]["models"] == "moonshotai/Kimi-K3"
    again = user("export", *select, "--out", str(out), again=True)
    assert again.returncode == 2
    assert _flat(again.stderr) == (f"error (target_exists): {out}: the export file already exists. Fix: pass --force "
                                   "to replace it, or choose another --out")
    csv = tmp_path / "mla.csv"
    assert user("export", *select, "--out", str(csv)).returncode == 0
    assert pcsv.read_csv(csv).num_rows == 21860
    forced = user("export", "--system", "gb300", "--table", "mla_context_module", "--out", str(out), "--force",
                  "--json")
    assert forced.returncode == 0
    assert json.loads(forced.stdout)["rows"] == pq.read_metadata(out).num_rows == 36500
    wrong = user("export", *select, "--out", str(tmp_path / "rows.xlsx"))
    assert wrong.returncode == 2 and "--out must end in .parquet or .csv" in wrong.stderr


def _broken_root(tmp_path: Path) -> Path:
    """A data root of two tables: a real one, and a gemm table file that is not parquet."""
    root = tmp_path / "root"
    good = root / "h200_sxm/mla/vllm/0.24.0"
    good.mkdir(parents=True)
    (good / "mla_context_module_perf.parquet").write_bytes(
        (DATA / "h200_sxm/mla/vllm/0.24.0/mla_context_module_perf.parquet").read_bytes())
    bad = root / "h200_sxm/gemm/vllm/0.24.0"
    bad.mkdir(parents=True)
    (bad / "gemm_perf.parquet").write_bytes(b"not a parquet file\n")
    return root


def test_export_fails_closed_when_a_table_fails(tmp_path: Path) -> None:
    root = _broken_root(tmp_path)
    out = tmp_path / "h200.parquet"
    result = user("export", "--system", "h200_sxm", "--data-root", str(root), "--out", str(out))
    assert result.returncode == 1 and not out.exists()
    assert _path_after(result.stdout.splitlines(), "FAIL table_rejected:") == str(
        root / "h200_sxm/gemm/vllm/0.24.0/gemm_perf.parquet")
    assert _flat(result.stdout).endswith("nothing written: 1 of 2 table(s) failed to load (narrow the selection with "
                                         "--backend, --version or --table to leave them out)")
    narrowed = user("export", "--system", "h200_sxm", "--data-root", str(root), "--table", "mla_context_module",
                    "--out", str(out))
    assert narrowed.returncode == 0 and pq.read_metadata(out).num_rows > 0


def test_ls_says_how_many_tables_it_hides() -> None:
    hidden = user("ls", "--system", "gb300")
    listed = user("ls", "--system", "gb300", "--all", "--json")
    as_json = json.loads(user("ls", "--system", "gb300", "--json").stdout)
    assert _flat(hidden.stdout).endswith(
        "50 more tables without the model's attention head axis are not listed (alltoall, collective, "
        "custom_allreduce, encoder_attention, gemm, kda, linear_attention, mhc, moe, quantize): --all lists them")
    assert len(json.loads(listed.stdout)["tables"]) == 111 == len(as_json["tables"]) + 50
    assert as_json["hidden"] == {"tables": 50, "families": ["alltoall", "collective", "custom_allreduce",
                                                            "encoder_attention", "gemm", "kda", "linear_attention",
                                                            "mhc", "moe", "quantize"], "shown_with": "--all"}


# --- the README -------------------------------------------------------------------------------


def test_the_readme_says_a_legacy_migration_is_a_dry_run_without_execute() -> None:
    from tests.helpers import REPO

    lines = [line for line in (REPO / "README.md").read_text().splitlines() if "migrate LEGACY.txt" in line]
    assert lines[0].split("#")[1].strip().startswith("dry run")
    assert "--execute" in lines[1] and "write" in lines[1].split("#")[1]


def test_a_migration_dry_run_prints_at_80_columns() -> None:
    if not (FIXTURES / "README.md").is_file():
        pytest.skip("../shared/fixtures not found (the dry run reads a stale fixture)")
    result = user("migrate", str(FIXTURES / STALE_DIR))
    assert result.returncode == 0
    assert all(len(line) <= 80 and line == line.rstrip() for line in result.stdout.splitlines())
    assert "dry run: 5 file(s): 5 to migrate (4,135 rows change), 0 unchanged, 0 refused. Run again with --execute " \
           "to write." in _flat(result.stdout)
