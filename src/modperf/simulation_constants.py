"""The simulation's fitted constants (docs/serving.md, "The simulation", lists each with its value).

Written by ``python bench/silicon.py --simulate --fit`` from the CALIBRATION rows of the corpus's
silicon_sample.csv only (aggregated; re-exports counted once); never edited by hand.
"""

from __future__ import annotations

from .percentiles import SimConstants

AGG: dict[str, SimConstants] = {
    "sglang": SimConstants(s_pre=0.9412, s_dec=1.204, tau0_ms=110.6931, osl_spread=0.0),
    "trtllm": SimConstants(s_pre=1.1996, s_dec=0.916, tau0_ms=145.2181, osl_spread=0.4682),
    "vllm": SimConstants(s_pre=1.2566, s_dec=0.9899, tau0_ms=51.2888, osl_spread=0.0512),
}
PROVENANCE = ("fitted 2026-12-03 on calibration rows of silicon_sample.csv "
              "(sglang 277, trtllm 492, vllm 503; form: first wave measured)")
