"""The simulation's fitted constants (docs/serving.md, "The simulation", lists each with its value).

Written by ``python bench/silicon.py --simulate --fit`` from the CALIBRATION rows of the corpus's
silicon_sample.csv only (aggregated; re-exports counted once); never edited by hand.
"""

from __future__ import annotations

from .simulate import SimConstants

AGG: dict[str, SimConstants] = {
    "sglang": SimConstants(s_pre=0.9283, s_dec=1.2356, tau0_ms=112.8471, osl_spread=0.0),
    "trtllm": SimConstants(s_pre=1.1627, s_dec=0.9865, tau0_ms=149.0401, osl_spread=0.5743),
    "vllm": SimConstants(s_pre=1.2955, s_dec=1.0647, tau0_ms=39.6896, osl_spread=0.0407),
}
PROVENANCE = ("fitted 2026-12-03 on calibration rows of silicon_sample.csv "
              "(sglang 277, trtllm 492, vllm 503; form: first wave measured)")
