"""The demo's picture from a made-up run: both panels' axes labelled, the node kill and
the handover marked, a small PNG (what `make demo` writes from the real run)."""

from __future__ import annotations

from pathlib import Path

from dedup_local.demo_plot import Handover, Point, figure, plot

STEPS = {"fenced": 5.1, "released": 5.2, "detached": 6.0, "started": 6.1, "ready": 13.9}


def run() -> list[Point]:
    points = []
    for t in range(60):
        for p in range(3):
            down = p == 0 and 20 <= t < 34
            rate = 0.0 if down else 130.0 + 10 * p
            lag = (t - 20) * 130 if down else 0
            points.append(Point(float(t), p, None if t == 0 else rate, lag))
    return points


def test_axes_labelled_and_the_failover_marked() -> None:
    fig = figure(run(), killed=(20.0, "node-b"), handovers=[Handover(0, "NodeLost", 26.0, STEPS)])
    top, bottom = fig.axes
    assert top.get_ylabel() == "input committed (records/s)"
    assert bottom.get_ylabel() == "consumer lag (records)"
    assert bottom.get_xlabel() == "seconds since the pipeline was applied"
    assert [line.get_label() for line in top.get_lines()][:3] == [
        "partition 0",
        "partition 1",
        "partition 2",
    ]
    texts = [t.get_text() for t in top.texts]
    assert "node-b killed" in texts
    assert "p0 handover (NodeLost): 13.9s" in texts
    for ax in (top, bottom):
        kill_lines = [line for line in ax.get_lines() if list(line.get_xdata()) == [20.0, 20.0]]
        assert kill_lines, "the kill is marked on both panels"
        spans = [p for p in ax.patches if p.get_x() == 26.0]
        assert spans and abs(spans[0].get_width() - 13.9) < 1e-9


def test_png_written(tmp_path: Path) -> None:
    out = plot(run(), tmp_path / "d" / "demo.png", killed=(20.0, "node-b"))
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert 10_000 < len(data) < 200_000
