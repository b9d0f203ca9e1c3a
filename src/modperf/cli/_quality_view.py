"""Printing ``modperf check --quality`` findings."""

from __future__ import annotations

from rich.table import Table

from ..data.quality import QualityReport
from ._audit_format import compact_key, short_file, short_label
from ._common import console, print_table


def _point(d: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in d.items())


def print_quality(report: QualityReport, shown: int = 10, tables_shown: int = 40) -> None:
    th = report.thresholds
    files = [f for f in report.files if f.total]
    per_file = Table(title="quality findings per table (the load is not rejected)")
    for col in ("table", "points", "non-monotone", "spikes", "cross-file", "corroborated", "vs others (median ratio)"):
        per_file.add_column(col, justify="left" if col in ("table", "vs others (median ratio)") else "right",
                            overflow="fold")
    for f in sorted(files, key=lambda f: -f.total)[:tables_shown]:
        ratios = ", ".join(f"{short_file(c['with'])}: {c['median_ratio']:.2g}x"
                           for c in f.comparisons if c["median_ratio"] > 2 or c["median_ratio"] < 0.5)
        per_file.add_row(short_label(f.ref), f"{f.points:,}", f"{f.counts['non_monotone']:,}", f"{f.counts['spike']:,}",
                         f"{f.counts['cross_file']:,}", f"{f.corroborated:,}", ratios)
    if files:
        print_table(per_file, ("corroborated", "points", "vs others (median ratio)"))
        if len(files) > tables_shown:
            console.print(f"... and {len(files) - tables_shown} more tables with findings (every table: --json)",
                          style="dim")
    worst = sorted(((x, f) for f in report.files for x in f.findings if x.kind == "cross_file"),
                   key=lambda xf: (-xf[0].detail.get("corroborated", False), -xf[0].ratio))
    if worst:
        grid = Table(title=f"widest cross-file disagreements (> {th.cross_factor:g}x every other file)")
        for col in ("table", "bucket", "point", "ms", "others (ms)", "ratio"):
            grid.add_column(col, overflow="fold")
        for x, f in worst[:shown]:
            others = "; ".join(f"{short_file(o['file'])}: {o['latency']:g}"
                               for o in x.detail["others"])
            grid.add_row(short_label(f.ref), compact_key(x.bucket), _point(x.point), f"{x.latency:,.4g}", others,
                         f"{x.ratio:,.0f}x" + (" (corroborated)" if x.detail.get("corroborated") else ""))
        print_table(grid, ("others (ms)", "bucket"))
    spikes = sorted(((x, f) for f in report.files for x in f.findings if x.kind == "spike"),
                    key=lambda xf: -xf[0].ratio)
    if spikes:
        grid = Table(title=f"largest isolated spikes (> {th.spike_factor:g}x both neighbours)")
        for col in ("table", "bucket", "point", "ms", "neighbour ms", "ratio"):
            grid.add_column(col, overflow="fold")
        for x, f in spikes[:shown]:
            grid.add_row(short_label(f.ref), compact_key(x.bucket), _point(x.point), f"{x.latency:,.4g}",
                         f"{x.reference:,.4g}",
                         f"{x.ratio:,.1f}x")
        print_table(grid, ("neighbour ms", "bucket"))
    noted = [(f, n) for f in report.files for n in f.provenance]
    if noted:
        grid = Table(title="provenance: rows not collected in their own folder (the load is not rejected)")
        for col in ("table", "note"):
            grid.add_column(col, overflow="fold")
        for f, n in noted[:tables_shown]:
            text = (f"version column says {', '.join(n['recorded'])} (folder {n['folder']})"
                    if n["kind"] == "version_column" else
                    "identical to " + ", ".join(short_file(x) for x in n["identical_to"]))
            grid.add_row(short_label(f.ref), text)
        print_table(grid)
        if len(noted) > tables_shown:
            console.print(f"... and {len(noted) - tables_shown} more notes (every note: --json)", style="dim")
    t = report.totals()
    console.print(
        f"quality: {t['files_with_findings']} of {t['files']} tables with findings: {t['non_monotone']:,} non-monotone "
        f"pairs (> {100 * th.monotone_tolerance:g}% fall), {t['spike']:,} spikes, {t['cross_file']:,} cross-file "
        f"points ({t['cross_file_corroborated']:,} corroborated), provenance notes "
        f"{', '.join(f'{k} {v}' for k, v in t['provenance'].items()) or 'none'}; ignoring differences under "
        f"{th.min_delta_ms:g} ms; "
        f"{report.seconds:.1f} s. Every finding: --json.", style="dim")
