"""RealCluster's reading of the kubelets' CRI log files (dedup_local.real_cluster)."""

from __future__ import annotations

from dedup_local.real_cluster import _cri_log


def test_cri_log_lines_without_their_prefix() -> None:
    text = (
        '2026-11-26T05:59:08.454825Z stdout F {"level": "INFO", "msg": "worker ready"}\n'
        "2026-11-26T05:59:08.5Z stderr F Traceback (most recent call last):\n"
    )
    assert _cri_log(text) == (
        '{"level": "INFO", "msg": "worker ready"}\nTraceback (most recent call last):\n'
    )


def test_cri_log_joins_partial_lines_and_keeps_empty_ones() -> None:
    text = (
        "2026-11-26T05:59:08Z stdout P first half, \n"
        "2026-11-26T05:59:08Z stdout F second half\n"
        "2026-11-26T05:59:09Z stdout F \n"
        "2026-11-26T05:59:09Z stdout F last\n"
    )
    assert _cri_log(text) == "first half, second half\n\nlast\n"
