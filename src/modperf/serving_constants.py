"""The serving model's fitted constants (docs/serving.md lists each with its value).

Written by ``python bench/silicon.py --fit`` from the CALIBRATION rows of the corpus's
silicon_sample.csv only (the split rule is in docs/serving.md); never edited by hand.

May import: modperf.serving.
"""

from __future__ import annotations

from .serving import Constants

AGG: dict[str, Constants] = {
    "sglang": Constants(s_pre=0.8951, s_dec=1.1255, tau0_ms=155.3887, kappa=1.0),
    "trtllm": Constants(s_pre=1.1089, s_dec=0.9286, tau0_ms=134.8505, kappa=0.1405),
    "vllm": Constants(s_pre=1.0586, s_dec=1.0024, tau0_ms=33.0999, kappa=0.1543),
}
DISAGG: Constants | None = Constants(s_pre=0.7398, s_dec=0.8419, tau0_ms=258.9075, kappa=0.2203)
PROVENANCE: dict[str, str] = {
    "agg": "fitted 2026-12-03 on calibration rows of silicon_sample.csv "
           "(sglang 277, trtllm 492, vllm 503; re-exports once)",
    "disagg": "fitted 2026-12-03 on 91 calibration rows of silicon_sample.csv (re-exports once)",
}
