"""The README's library block runs as printed, and says what it returns."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.helpers import REPO


def _library_block() -> str:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "the README has one library block"
    return blocks[0]


def test_the_library_block_runs_as_printed() -> None:
    block = _library_block()
    code = "\n".join(line.split("#")[0] for line in block.splitlines())
    assert block.startswith("import numpy as np\n") and "..." not in code  # no argument elided
    # the block as printed, then what its comments say it returns
    check = """
import json as _json
print(_json.dumps({"natives": table.natives, "answer": [answer.latency_ms, answer.kind, answer.native],
                   "lat": lat.tolist(), "kinds": kinds.tolist(), "kind0": modperf.KINDS[int(kinds[0])],
                   "report": [report.ok, report.rows], "rows": rows.num_rows, "answers": answers.num_rows}))
"""
    proc = subprocess.run([sys.executable, "-c", block + check], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found == {"natives": [96, 128], "answer": [0.4078, "exact", 96], "lat": [0.1369, 0.4078, 1.734],
                     "kinds": [0, 0, 0], "kind0": "exact", "report": [True, 107467], "rows": 21860, "answers": 1}
    for comment in ("# [96, 128]", "# 0.4078, 'exact', 96", "[0.1369 0.4078 1.734], [0 0 0]", "# 'exact'",
                    "# 0.9745 exact", "# (True, 107467)", "# 21860"):
        assert comment in block
