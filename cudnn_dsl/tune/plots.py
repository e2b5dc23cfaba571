"""Bar charts of measured GPU times, one panel per graph (`bench --plot`, `tune --plot`)."""

from __future__ import annotations

import attrs


@attrs.frozen
class Panel:
    """One graph's bars: a label, a median and the spread below and above it, for each contender or plan."""

    title: str
    labels: list[str]
    medians: list[float]
    below: list[float]
    above: list[float]
    ylabel: str
    colors: list[str] | None = None
    log: bool = False
    """a log scale, where one pathological bar would flatten the rest"""
    tick_size: int = 7
    tick_rotation: int = 30


def draw(panels: list[Panel], path: str, side_by_side: bool, size: tuple[float, float]) -> None:
    """The panels in one figure (in a row, or stacked), saved as a PNG at `path`."""
    import matplotlib  # the CLI checks that it is installed before any work

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shape = (1, len(panels)) if side_by_side else (len(panels), 1)
    fig, axes = plt.subplots(*shape, figsize=(size[0] * shape[1], size[1] * shape[0]), squeeze=False)
    for ax, p in zip(axes.flat, panels):
        ax.bar(range(len(p.labels)), p.medians, yerr=[p.below, p.above], color=p.colors)
        ax.set_title(p.title)
        ax.set_ylabel(p.ylabel)
        if p.log:
            ax.set_yscale("log")
        ax.set_xticks(range(len(p.labels)))
        ax.set_xticklabels(p.labels, rotation=p.tick_rotation, fontsize=p.tick_size)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
