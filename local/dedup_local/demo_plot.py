"""The demo's picture: input throughput and consumer lag per partition over time, the
node kill and the handover marked (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure


@dataclass(frozen=True)
class Point:
    """One sample of one partition, `t` seconds after the demo's clock started."""

    t: float
    partition: int
    rate: float | None  # input records per second (None: not known at this sample)
    lag: int | None


@dataclass(frozen=True)
class Handover:
    partition: int
    reason: str
    decided: float  # seconds on the demo's clock
    steps: Mapping[str, float]  # seconds after the decision


def plot(
    points: Sequence[Point],
    path: Path,
    killed: tuple[float, str] | None = None,
    handovers: Sequence[Handover] = (),
    title: str = "dedup-operator demo",
) -> Path:
    """Writes the figure as a PNG at `path`."""
    fig = figure(points, killed, handovers, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def figure(
    points: Sequence[Point],
    killed: tuple[float, str] | None = None,
    handovers: Sequence[Handover] = (),
    title: str = "dedup-operator demo",
) -> Figure:
    """Two panels sharing the time axis: input records/s and consumer lag per partition;
    a dashed red line where the node was killed, an orange span per handover (from the
    operator's decision to the replacement Ready)."""
    fig = Figure(figsize=(10, 6.5), dpi=80)
    top, bottom = fig.subplots(2, 1, sharex=True)
    partitions = sorted({p.partition for p in points})
    for n in partitions:
        mine = [p for p in points if p.partition == n]
        top.plot(
            [p.t for p in mine],
            [p.rate if p.rate is not None else float("nan") for p in mine],
            label=f"partition {n}",
            linewidth=1.4,
        )
        bottom.plot(
            [p.t for p in mine],
            [p.lag if p.lag is not None else float("nan") for p in mine],
            label=f"partition {n}",
            linewidth=1.4,
        )
    top.set_ylabel("input committed (records/s)")
    bottom.set_ylabel("consumer lag (records)")
    bottom.set_xlabel("seconds since the pipeline was applied")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        if killed is not None:
            ax.axvline(killed[0], color="red", linestyle="--", linewidth=1.5)
        for h in handovers:
            end = h.decided + h.steps.get("ready", max(h.steps.values(), default=0.0))
            ax.axvspan(h.decided, end, color="orange", alpha=0.25)
    if killed is not None:
        top.annotate(
            f"{killed[1]} killed",
            xy=(killed[0], 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(-4, -14),
            textcoords="offset points",
            ha="right",
            color="red",
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},
        )
    for h in handovers:
        total = h.steps.get("ready")
        label = f"p{h.partition} handover ({h.reason})" + (f": {total:.1f}s" if total else "")
        top.annotate(
            label,
            xy=(h.decided, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(4, -28),
            textcoords="offset points",
            ha="left",
            color="darkorange",
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},
        )
    top.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
