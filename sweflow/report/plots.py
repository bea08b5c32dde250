"""Plots of the report as inline SVG (matplotlib, Agg backend): no file, no network, no JavaScript.

Every function returns one `<svg ...>` element as text, byte-stable for the same data (fixed hash salt, no
date in the metadata), or None when there is nothing to draw. Text stays text (`svg.fonttype: none`), so
the page is small and searchable.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

# Colours of the report, colour-blind safe (Okabe-Ito).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")

_RC = {
    "svg.fonttype": "none",
    "svg.hashsalt": "sweflow-report",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.prop_cycle": None,  # set below from PALETTE
}


def _figure(width: float = 5.6, height: float = 2.8):
    import matplotlib

    matplotlib.use("Agg", force=False)
    from cycler import cycler
    from matplotlib.figure import Figure

    matplotlib.rcParams.update({**_RC, "axes.prop_cycle": cycler(color=PALETTE)})
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    start = text.index("<svg")
    return text[start:].strip()


def bars(
    groups: Mapping[str, Mapping[str, float]],
    *,
    title: str,
    ylabel: str = "",
    stacked: bool = False,
    horizontal: bool = False,
) -> str | None:
    """Bars per category (outer keys), one series per inner key; stacked or side by side."""
    cats = [c for c in groups if any(v for v in groups[c].values())]
    if not cats:
        return None
    series: list[str] = []
    for c in cats:
        series.extend(k for k in groups[c] if k not in series)
    series = [k for k in series if any(groups[c].get(k) for c in cats)]
    fig = _figure(height=max(2.4, 0.35 * len(cats) + 1.2) if horizontal else 2.8)
    ax = fig.add_subplot()
    n = len(series)
    width = 0.8 if stacked else 0.8 / n
    base = [0.0] * len(cats)
    for i, s in enumerate(series):
        vals = [float(groups[c].get(s, 0) or 0) for c in cats]
        pos = [x if stacked else x - 0.4 + width * (i + 0.5) for x in range(len(cats))]
        draw = ax.barh if horizontal else ax.bar
        kw = {"left" if horizontal else "bottom": base} if stacked else {}
        draw(pos, vals, width, label=s, color=PALETTE[i % len(PALETTE)], **kw)
        if stacked:
            base = [b + v for b, v in zip(base, vals, strict=True)]
    if horizontal:
        ax.set_yticks(range(len(cats)), cats)
        ax.invert_yaxis()
        ax.set_xlabel(ylabel)
    else:
        ax.set_xticks(range(len(cats)), cats, rotation=20 if max(map(len, cats)) > 12 else 0, ha="right")
        ax.set_ylabel(ylabel)
    ax.set_title(title, loc="left")
    if n > 1:
        ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _svg(fig)


# One style per series of a plot: the first wide and solid with filled markers, each later one narrower,
# dashed or dotted, with hollow markers of another shape, drawn on top, so a series equal to an earlier
# one (the reward mean and the resolved share when every reward is 0 or 1) still shows.
_STYLES = (
    {"linestyle": "-", "linewidth": 2.6, "marker": "o", "ms": 6},
    {"linestyle": "--", "linewidth": 1.4, "marker": "s", "ms": 4, "markerfacecolor": "white"},
    {"linestyle": ":", "linewidth": 1.4, "marker": "^", "ms": 4, "markerfacecolor": "white"},
    {"linestyle": "-.", "linewidth": 1.2, "marker": "D", "ms": 3, "markerfacecolor": "white"},
)


def lines(
    x: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    *,
    title: str,
    xlabel: str = "step",
    ylabel: str = "",
) -> str | None:
    """One line (with markers) per series over x; None values are gaps; None when every value is missing."""
    present = {k: v for k, v in series.items() if any(y is not None for y in v)}
    if not x or not present:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    for i, (name, ys) in enumerate(present.items()):
        ax.plot(x, [float("nan") if y is None else y for y in ys], label=name, color=PALETTE[i % len(PALETTE)],
                zorder=2 + i, **_STYLES[i % len(_STYLES)])  # fmt: skip
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, loc="left")
    if len(x) <= 12:
        ax.set_xticks(list(x))
    if len(present) > 1:
        ax.legend(frameon=False, fontsize=8, loc="best")
    return _svg(fig)


def panels(
    x: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    *,
    title: str,
    xlabel: str = "step",
    columns: int = 3,
) -> str | None:
    """Small multiples: one panel per series over x, each on its own y scale (a loss near 0.01 and a
    length near 500 both readable, no line under another); all-missing series are left out, None when
    every one is."""
    from matplotlib.ticker import MaxNLocator

    present = {k: v for k, v in series.items() if any(y is not None for y in v)}
    if not x or not present:
        return None
    cols = min(columns, len(present))
    rows = -(-len(present) // cols)
    fig = _figure(width=5.6, height=1.55 * rows + 0.45)
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True)
    for i, (name, ys) in enumerate(present.items()):
        ax = axes[i // cols][i % cols]
        ax.plot(x, [float("nan") if y is None else y for y in ys], color=PALETTE[i % len(PALETTE)],
                marker="o", ms=2.5, linewidth=1.4)  # fmt: skip
        ax.set_title(name, loc="left", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
        if i // cols == rows - 1 or i + cols >= len(present):
            ax.set_xlabel(xlabel, fontsize=7)
            ax.tick_params(labelbottom=True)
    for j in range(len(present), rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    fig.suptitle(title, x=0.01, ha="left", fontsize=9)
    return _svg(fig)


def histogram(samples: Mapping[str, Sequence[float]], *, title: str, xlabel: str) -> str | None:
    """Integer-binned histograms (counts such as tests per task), one series per key, side by side."""
    present = {k: list(v) for k, v in samples.items() if v}
    if not present:
        return None
    lo = int(min(min(v) for v in present.values()))
    hi = int(max(max(v) for v in present.values()))
    fig = _figure()
    ax = fig.add_subplot()
    edges = [b - 0.5 for b in range(lo, hi + 2)]
    ax.hist(list(present.values()), bins=edges, label=list(present), color=list(PALETTE[: len(present)]))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("tasks")
    ax.set_title(title, loc="left")
    if len(present) > 1:
        ax.legend(frameon=False, fontsize=8)
    return _svg(fig)


def stacked_steps(
    x: Sequence[float], parts: Mapping[str, Sequence[float | None]], *, title: str
) -> str | None:
    """Stacked bars per step (time split: rollout / train / sync)."""
    groups: dict[str, dict[str, Any]] = {}
    for i, step in enumerate(x):
        groups[str(step)] = {k: (v[i] or 0.0) for k, v in parts.items()}
    return bars(groups, title=title, ylabel="seconds", stacked=True)


def intervals(
    points: Mapping[str, tuple[float, float, float]], *, title: str, ylabel: str = ""
) -> str | None:
    """One point per category with its interval (value, low, high) as an error bar, zero values drawn too
    (a checkpoint that resolves nothing is a figure, not a gap); y from 0 to at least 1."""
    if not points:
        return None
    cats = list(points)
    fig = _figure(height=2.6)
    ax = fig.add_subplot()
    vals = [points[c][0] for c in cats]
    err = [[v - points[c][1] for v, c in zip(vals, cats, strict=True)],
           [points[c][2] - v for v, c in zip(vals, cats, strict=True)]]  # fmt: skip
    ax.errorbar(range(len(cats)), vals, yerr=err, fmt="o", ms=7, capsize=6, linewidth=2, color=PALETTE[0])
    ax.plot(range(len(cats)), vals, color=PALETTE[0], linewidth=1, alpha=0.5)
    ax.set_xticks(range(len(cats)), cats)
    ax.set_xlim(-0.5, len(cats) - 0.5)
    ax.set_ylim(-0.03, max(1.0, max(points[c][2] for c in cats)) + 0.03)
    ax.set_ylabel(ylabel)
    ax.set_title(title, loc="left")
    return _svg(fig)
