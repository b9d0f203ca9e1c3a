"""Coverage heatmaps (``modperf coverage --plot FILE.png``) and a search's fronts (``modperf
search --plot FILE``). matplotlib is an optional extra: ``pip install 'modperf[plot]'``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..base import errors as E
from ..base.atomic import write_atomically
from ..data.versions import version_key
from .coverage import STANDARD_TP, CoverageReport, ModelCoverage, SlotCoverage

#: Above this many (slot, native) rows the matrix plot switches to the one-cell-per-table overview.
DETAIL_ROWS = 60


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or MissingExtraError with the fix (a command
    that will plot calls it first, before its work)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise E.MissingExtraError(
            "--plot needs matplotlib, which is not installed",
            fix="pip install 'modperf[plot]' (or pip install matplotlib==3.11.2)") from exc
    return plt


def _save(fig: Any, path: str | Path) -> Path:
    out = Path(path).expanduser()
    if out.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise E.OptionValueError("--plot writes .png, .svg or .pdf files", values={"plot": str(out)},
                                 fix="name the file e.g. coverage.png")
    # through the one atomic path: a killed or failing run leaves the old plot (or none), never half a file
    write_atomically(out, lambda handle: fig.savefig(handle, format=out.suffix.lower()[1:], dpi=110,
                                                     bbox_inches="tight"), overwrite=True)
    return out


def _short(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def _slot_label(s: SlotCoverage) -> str:
    reuse = f" (reuses {s.ref.reuse.from_version})" if s.ref.reuse else ""
    return f"{s.ref.system} {s.ref.backend} {s.ref.version}{reuse}"


def plot_coverage(report: CoverageReport, path: str | Path, tps: Sequence[int] | None = None) -> Path:
    """Detailed native x tp heatmap when the selection is small, else an overview of every
    (system, backend, version) x (table, native) with the share of tp cells measured."""
    rows = [(s, nc) for s in report.slots for nc in s.natives]
    if not rows:
        raise E.OptionValueError("nothing to plot: no slot in the selection records a native head count",
                                 fix="narrow or change the filters (local-only GQA tables have no native axis)")
    if len(rows) <= DETAIL_ROWS:
        return _plot_detail(rows, path, list(tps or STANDARD_TP))
    return _plot_overview(report, path, list(tps or STANDARD_TP))


def _plot_detail(rows: list, path: str | Path, tps: list[int]) -> Path:
    plt = pyplot()
    from matplotlib.colors import LogNorm

    values = np.full((len(rows), len(tps)), np.nan)
    kinds = np.zeros((len(rows), len(tps)), dtype=int)  # 0 n/a, 1 missing, 2 local-only, 3 measured
    labels = []
    tables = sorted({slot.ref.table for slot, _ in rows})
    for i, (slot, nc) in enumerate(rows):
        prefix = f"{slot.ref.table}  " if len(tables) > 1 else ""
        labels.append(f"{prefix}{_slot_label(slot)}  N={nc.native}")
        for j, t in enumerate(tps):
            c = nc.cell(t)
            if c is None or nc.native % t:
                continue
            kinds[i, j] = 3 if c.measured else 2 if c.answerable else 1
            if c.answerable and c.points:
                values[i, j] = c.points
    fig, ax = plt.subplots(figsize=(2.2 + 0.75 * len(tps) + 4.5, 1.2 + 0.28 * len(rows)))
    ax.set_facecolor("white")
    finite = values[np.isfinite(values)]
    norm = LogNorm(vmin=max(finite.min(), 1), vmax=max(finite.max(), 2)) if finite.size else None
    cmap = plt.get_cmap("Blues").with_extremes(bad="white")
    img = ax.imshow(np.where(kinds == 3, values, np.nan), aspect="auto", cmap=cmap, norm=norm,
                    interpolation="nearest")
    for i in range(len(rows)):
        for j in range(len(tps)):
            k = kinds[i, j]
            if k == 0:
                ax.text(j, i, "n/a", ha="center", va="center", fontsize=7, color="#bbbbbb")
            elif k == 1:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, color="#f3c4c4"))
                ax.text(j, i, "missing", ha="center", va="center", fontsize=7, color="#a33")
            elif k == 2:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="#fff2b3", hatch="///",
                                           edgecolor="#d9b300", linewidth=0))
                ax.text(j, i, _short(int(values[i, j])) if np.isfinite(values[i, j]) else "", ha="center",
                        va="center", fontsize=7, color="#665500")
            else:
                v = values[i, j]
                dark = norm is not None and np.isfinite(v) and norm(v) > 0.55
                ax.text(j, i, _short(int(v)) if np.isfinite(v) else "", ha="center", va="center", fontsize=7,
                        color="white" if dark else "black")
    ax.set_xticks(range(len(tps)), [f"tp{t}" for t in tps])
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.xaxis.tick_top()
    ax.set_xticks(np.arange(-0.5, len(tps)), minor=True)
    ax.set_yticks(np.arange(-0.5, len(rows)), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    if norm is not None:
        cbar = fig.colorbar(img, ax=ax, fraction=0.03, pad=0.02)
        cbar.set_label("grid points (measured cells)")
    what = tables[0] if len(tables) == 1 else "coverage"
    ax.set_title(f"{what}: native x tp (local = native / tp)\nblue = measured for this native (shade: grid points); "
                 "yellow hatched = answerable via the local key only; red = not measured", fontsize=9, pad=28)
    return _save(fig, path)


def _plot_overview(report: CoverageReport, path: str | Path, tps: list[int]) -> Path:
    plt = pyplot()

    slot_keys = sorted({(s.ref.system, s.ref.backend, s.ref.version) for s in report.slots if s.natives},
                       key=lambda k: (k[0] or "", k[1] or "", _vk(k[2])))
    cols = sorted({(s.ref.table, nc.native) for s in report.slots for nc in s.natives})
    share = np.full((len(slot_keys), len(cols)), np.nan)
    ri = {k: i for i, k in enumerate(slot_keys)}
    ci = {k: j for j, k in enumerate(cols)}
    for s in report.slots:
        for nc in s.natives:
            found = [nc.cell(t) for t in tps if nc.native % t == 0]
            cells = [c for c in found if c is not None]
            if cells:
                share[ri[(s.ref.system, s.ref.backend, s.ref.version)], ci[(s.ref.table, nc.native)]] = \
                    sum(c.answerable for c in cells) / len(cells)
    fig, ax = plt.subplots(figsize=(3 + 0.32 * len(cols), 1.5 + 0.24 * len(slot_keys)))
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="#f2f2f2")
    img = ax.imshow(np.ma.masked_invalid(share), aspect="auto", cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
    ax.set_yticks(range(len(slot_keys)), [" ".join(str(x) for x in k) for k in slot_keys], fontsize=7)
    ax.set_xticks(range(len(cols)), [f"{t}  N={n}" for t, n in cols], rotation=70, ha="right", fontsize=7)
    ax.set_xticks(np.arange(-0.5, len(cols)), minor=True)
    ax.set_yticks(np.arange(-0.5, len(slot_keys)), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.8)
    ax.tick_params(which="minor", length=0)
    cbar = fig.colorbar(img, ax=ax, fraction=0.02, pad=0.01)
    cbar.set_label(f"share of tp {','.join(map(str, tps))} cells answerable")
    ax.set_title("coverage overview: per (system, backend, version) and (table, native); grey = table absent "
                 "(narrow with --table/--system for the native x tp detail)", fontsize=9)
    return _save(fig, path)


def _vk(v: str | None) -> tuple:
    return version_key(v)


def plot_model(result: ModelCoverage, path: str | Path) -> Path:
    """One row per slot considered, one column per requested tp."""
    plt = pyplot()
    answers = result.answers
    if len(answers) > 80:
        answers = [a for a in answers if a.answerable_tps]
    if not answers:
        raise E.OptionValueError(f"nothing to plot: no slot answers {result.model}",
                                 fix="try other --tp values or filters")
    tps = result.tps
    fig, ax = plt.subplots(figsize=(3 + 0.9 * len(tps) + 4, 1.4 + 0.26 * len(answers)))
    colours = {"measured": "#2e8b57", "local": "#9acd32", "missing": "#e9a3a3", "n/a": "#f2f2f2"}
    for i, a in enumerate(answers):
        for j, t in enumerate(tps):
            c = a.cells.get(t)
            if c is None:
                kind, text = "n/a", "n/a"
            elif c.answerable:
                kind = "measured" if c.measured else "local"
                text = f"{_short(c.points)}\n{c.via}"
            else:
                kind, text = "missing", "-"
            ax.add_patch(plt.Rectangle((j, i), 1, 1, facecolor=colours[kind], edgecolor="white", linewidth=1.5))
            ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=6.5,
                    color="white" if kind == "measured" else "black")
    ax.set_xlim(0, len(tps))
    ax.set_ylim(len(answers), 0)
    ax.set_xticks([j + 0.5 for j in range(len(tps))], [f"tp{t}\nlocal {result.native // t}"
                                                        if result.native % t == 0 else f"tp{t}" for t in tps])
    ax.xaxis.tick_top()
    ax.set_yticks([i + 0.5 for i in range(len(answers))],
                  [f"{a.ref.table}  {a.ref.system} {a.ref.backend} {a.ref.version}  [{a.match}]" for a in answers],
                  fontsize=7)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, color=v) for v in colours.values()]
    ax.legend(handles,
              ["measured for this native", "answerable via the local key", "not answerable", "tp does not divide"],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7, frameon=False)
    ax.set_title(f"{result.model} (native {result.native}): where each tp is answerable without substitution",
                 fontsize=9, pad=30)
    return _save(fig, path)




def plot_fronts(result: Any, path: str | Path) -> Path:
    """The agg and disagg fronts of a search (a ``modperf.search.SearchResult``: plotting sits
    below the search in the layers) (tokens/s/GPU against tokens/s/user), the best
    deployment of each mode and backend marked, the TPOT limit as a vertical line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    styles = {"agg": ("tab:blue", "o"), "disagg": ("tab:orange", "s")}
    for mode in result.modes:
        points = result.fronts[mode]
        if not points:
            continue
        colour, marker = styles[mode]
        ax.plot([p.tokens_per_s_per_user for p in points], [p.tokens_per_s_per_gpu for p in points], marker=marker,
                color=colour, markersize=4, linewidth=1.2, drawstyle="steps-post", label=f"{mode} front")
    for p in result.best:
        ax.plot([p.tokens_per_s_per_user], [p.tokens_per_s_per_gpu], marker="*", markersize=13, linestyle="none",
                color=styles[p.mode][0], markeredgecolor="black")
        ax.annotate(f"best {p.mode} {p.backend}", (p.tokens_per_s_per_user, p.tokens_per_s_per_gpu),
                    textcoords="offset points", xytext=(6, 6), fontsize=8)
    if result.limits.tpot_ms is not None:
        ax.axvline(1000.0 / result.limits.tpot_ms, color="grey", linestyle="--", linewidth=0.8,
                   label=f"TPOT limit {result.limits.tpot_ms:.4g} ms")
    ax.set_xlabel("tokens/s per user")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_title(f"{result.model} on {result.gpus} x {result.system} (isl {result.isl}, osl {result.osl}; "
                 f"{', '.join(result.backends)})", fontsize=9)
    ax.grid(True, linewidth=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


__all__ = ["plot_coverage", "plot_fronts", "plot_model", "pyplot"]
