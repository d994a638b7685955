"""docs/capacity.md agrees with its generator and the measured inputs, and the plan's
arithmetic holds on figures worked out by hand."""

from __future__ import annotations

import sys

import pytest

from dedup_local.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
import capacity


def test_the_doc_is_generated_from_the_current_inputs() -> None:
    assert capacity.main(["--check", str(REPO_ROOT / "docs" / "capacity.md")]) == 0


def test_every_input_names_the_bench_that_measured_it() -> None:
    import json

    for name, entry in json.loads(capacity.INPUTS.read_text()).items():
        assert entry["source"] and entry["how"] and entry["unit"], name
        assert float(entry["value"]) > 0, name


def test_projection_passes_through_both_measurements() -> None:
    assert capacity.projected_lookups(600_000, 300_000, 1e7) == pytest.approx(600_000)
    assert capacity.projected_lookups(600_000, 300_000, 1e8) == pytest.approx(300_000)
    # halving per decade: 150,000 at 1B
    assert capacity.projected_lookups(600_000, 300_000, 1e9) == pytest.approx(150_000)


def test_plan_figures_worked_by_hand() -> None:
    measured = {
        "disk_bytes_per_id": 20.0,
        "ram_bytes_per_id": 2.0,
        "store_fixed_ram_mib": 0.0,
        "worker_base_rss_mib": 0.0,
        "worker_records_per_cpu_s": 100_000.0,
        "lookups_per_s_10m_1pct_hits": 1e12,
        "lookups_per_s_100m_1pct_hits": 1e12,
        "lookups_per_s_10m_50pct_hits": 1e12,
        "lookups_per_s_100m_50pct_hits": 1e12,
        "rebuild_ids_per_s": 100_000.0,
        "spark_records_per_core_s": 100_000.0,
        "failover_median_s": 60.0,
    }
    scenario = capacity.Scenario(
        window_ids=1e9, partitions=10, window_days=1.0, duplicate_share=0.0, peak_factor=1.0,
        disk_headroom=1.0, node_memory_gib=1.0, node_memory_usable=1.0, node_cpus=64,
        spark_cores=10,
    )  # fmt: skip
    rows = {q: v for q, v, _ in capacity.plan(measured, scenario)}
    # 100M ids per partition, held up to 125M; 125M x 20 bytes = 2.5e9 bytes = 2.33 GiB
    assert rows["ids per partition (window)"] == "100,000,000"
    assert rows["disk per partition (volume size)"] == "2.3 GiB"
    # 125M x 2 bytes = 250 MB = 0.23 GiB: 4 partitions in 1 GiB, 3 nodes for 10
    assert rows["memory per partition (worker pod)"] == "0.23 GiB"
    assert rows["partitions per node"] == "4"
    assert rows["nodes"] == "3"
    # 100M ids at 100k ids/s: 1,000 s
    assert rows["recovery after a lost volume"] == "0.3 h"
    # 1e9 ids / 86,400 s = 11,574 records/s; 1,157 per partition
    assert rows["input per partition at peak"] == "1,157 records/s"
    # 1e9 records / (100k x 10 cores) = 1,000 s
    assert rows["reshard: Spark scan of the window's output"] == "0.3 h on 10 cores"


def test_operator_plan_figures_worked_by_hand() -> None:
    measured = {
        "operator_rss_mib_100": 110.0,  # 100 MiB + 0.1 MiB per partition
        "operator_rss_mib_1000": 200.0,
        "operator_cpu_100": 0.02,  # 1% + 0.01% per partition
        "operator_cpu_1000": 0.11,
        "operator_requests_per_s_1000": 5.0,
    }
    scenario = capacity.Scenario(
        partitions=2000, operator_memory_limit_mib=400.0, operator_cpu_budget=0.5
    )
    rows = {q: (v, h) for q, v, h in capacity.operator_plan(measured, scenario)}
    assert rows["operator memory (RSS)"][0] == "300 MiB"  # 100 + 0.1 x 2,000
    assert rows["operator CPU, steady"][0] == "21.0% of a core"  # 1% + 0.01% x 2,000
    assert rows["API requests, steady"][0] == "10.00/s"
    # memory: (400 - 100) / 0.1 = 3,000; CPU: (0.5 - 0.01) / 0.0001 = 4,900
    assert rows["partitions per operator replica"][0] == "3,000"
    assert "memory binds" in rows["partitions per operator replica"][1]
