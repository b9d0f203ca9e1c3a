"""The serving model's fitted constants (docs/serving.md lists each with its value).

Written by ``python bench/silicon.py --fit`` from the CALIBRATION rows of the corpus's
silicon_sample.csv only (the split rule is in docs/serving.md); never edited by hand.
"""

from __future__ import annotations

from .serving import Constants, DisaggConstants

AGG: dict[str, Constants] = {
    "sglang": Constants(s_pre=0.8535, s_dec=1.1254, tau0_ms=162.5081, kappa=1.0),
    "trtllm": Constants(s_pre=1.1241, s_dec=0.9164, tau0_ms=134.2166, kappa=0.1412),
    "vllm": Constants(s_pre=1.0607, s_dec=0.9892, tau0_ms=33.6216, kappa=0.1516),
}
DISAGG: DisaggConstants | None = DisaggConstants(s_pre=0.7619, s_dec=0.9044, tau0_ms=257.62, kappa=0.2258)
PROVENANCE: dict[str, str] = {
    "agg": "fitted 2026-12-03 on calibration rows of silicon_sample.csv "
           "(sglang 277, trtllm 492, vllm 503; re-exports once)",
    "disagg": "fitted 2026-12-03 on 91 calibration rows of silicon_sample.csv (re-exports once)",
}
