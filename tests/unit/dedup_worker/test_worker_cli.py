"""The worker's command line: flags, environment variables and clear configuration errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from dedup_contract.exit_codes import EXIT_CONFIG, EXIT_KAFKA
from dedup_worker.cli import arguments, build_parser, config_from_args, main
from dedup_worker.config import transactional_id

BASE = [
    "--bootstrap-servers", "127.0.0.1:9092",
    "--input-topic", "events",
    "--output-topic", "events-deduped",
    "--partition", "3",
    "--pipeline", "events",
    "--store-path", "/tmp/store",
    "--window-duration", "2h",
]  # fmt: skip


def test_flags_build_a_config() -> None:
    cfg = config_from_args(
        build_parser().parse_args(
            [*BASE, "--window-max-keys", "1000", "--kafka-config", "a=1, b = 2"]
        )
    )
    assert cfg.partition == 3
    assert cfg.store_path == Path("/tmp/store")
    assert cfg.window.duration_ms == 2 * 3600 * 1000
    assert cfg.window.max_keys == 1000
    assert cfg.group == "dedup-events"
    assert cfg.kafka_settings == {"a": "1", "b": "2"}
    assert cfg.transactional_id == transactional_id("default", "events", 3)


def test_environment_supplies_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEDUP_PARTITION", "7")
    monkeypatch.setenv("DEDUP_ID_SOURCE", "header")
    monkeypatch.setenv("DEDUP_ID_FIELD", "x-id")
    argv = [a for a in BASE]
    i = argv.index("--partition")
    del argv[i : i + 2]
    cfg = config_from_args(build_parser().parse_args(argv))
    assert cfg.partition == 7
    assert cfg.id_spec.source == "header" and cfg.id_spec.field == "x-id"


def test_missing_settings_are_named_with_their_variables(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--input-topic", "a"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "--bootstrap-servers (DEDUP_BOOTSTRAP_SERVERS)" in err
    assert "--store-path" in err


def test_same_input_and_output_topic_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*BASE]
    argv[argv.index("events-deduped")] = "events"
    assert main(argv) == EXIT_CONFIG
    assert "must differ" in capsys.readouterr().err


def test_window_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    argv = BASE[:-2]
    assert main(argv) == EXIT_CONFIG
    assert "set a window" in capsys.readouterr().err


def test_bad_number_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--batch-size", "lots"]) == EXIT_CONFIG
    assert "--batch-size must be a whole number" in capsys.readouterr().err


def test_lookup_threads_reach_the_store_and_are_checked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args([*BASE, "--lookup-threads", "1"])
    assert config_from_args(args).store.lookup_threads == 1
    assert main([*BASE, "--lookup-threads", "0"]) == EXIT_CONFIG
    assert "lookup threads must be 1..64, not 0" in capsys.readouterr().err


def test_arguments_reproduce_the_config() -> None:
    cfg = config_from_args(
        build_parser().parse_args(
            [
                *BASE,
                "--window-max-keys",
                "1000",
                "--dead-letter-topic",
                "dlq",
                "--namespace",
                "ns",
                "--id-source",
                "header",
                "--id-field",
                "x-id",
                "--block-cache-mb",
                "128",
                "--lookup-threads",
                "3",
                "--metrics-port",
                "9500",
                "--kafka-config",
                "a=1,b=2",
                "--metrics-address",
                "127.0.0.3",
                "--lease-name",
                "events-p3",
                "--epoch",
                "4",
                "--lease-duration",
                "1m",
                "--lease-acquire-timeout",
                "90s",
                "--kubeconfig",
                "/etc/kube/config",
                "--owned-topic",
                "ns.events-owned",
                "--workers",
                "8",
                "--ownership-switch",
                "true",
            ]
        )
    )
    assert cfg.lease is not None and cfg.lease.duration_s == 60
    assert cfg.owned_topic == "ns.events-owned" and cfg.workers == 8 and cfg.ownership_switch
    assert cfg.metrics_address == "127.0.0.3"
    assert config_from_args(build_parser().parse_args(arguments(cfg))) == cfg
    standalone = config_from_args(build_parser().parse_args(BASE))
    assert standalone.lease is None and standalone.owned_topic is None
    assert config_from_args(build_parser().parse_args(arguments(standalone))) == standalone


def test_lease_flags_build_the_lease_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEDUP_LEASE_NAME", "events-p3")
    monkeypatch.setenv("DEDUP_EPOCH", "2")
    monkeypatch.setenv("DEDUP_LEASE_DURATION", "5s")
    lease = config_from_args(build_parser().parse_args(BASE)).lease
    assert lease is not None
    assert lease.holder_identity == "events-p3-e2"  # the pod's name, by default
    assert (lease.epoch, lease.duration_s, lease.acquire_timeout) == (2, 5, 10)
    assert lease.kubeconfig is None  # in-cluster


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--lease-name", "p3"], "--lease-name needs --epoch"),
        (["--lease-name", "p3", "--epoch", "0"], "--epoch must be >= 1"),
        (["--lease-name", "p3", "--epoch", "1", "--lease-duration", "1500ms"], "whole seconds"),
        (["--lease-name", "p3", "--epoch", "1", "--lease-duration", "soon"], "not a duration"),
    ],
)
def test_bad_lease_settings_are_named(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*BASE, *extra]) == EXIT_CONFIG
    assert message in capsys.readouterr().err


def test_lease_without_api_server_config_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    argv = [*BASE, "--metrics-port", "0", "--lease-name", "p3", "--epoch", "1"]
    assert main(argv) == EXIT_CONFIG
    assert "set --kubeconfig" in capsys.readouterr().err
    assert main([*argv, "--kubeconfig", str(tmp_path / "none")]) == EXIT_CONFIG
    assert "no such file" in capsys.readouterr().err


def test_in_cluster_without_a_service_account_token_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    argv = [*BASE, "--metrics-port", "0", "--lease-name", "p3", "--epoch", "1"]
    assert main(argv) == EXIT_CONFIG
    assert "cannot configure the API client" in capsys.readouterr().err


def test_kafka_failure_is_one_line_and_exit_6(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `init_transactions` raises when no broker answers (seen with a closed port,
    after its 60 s wait): one ERROR line and exit code 6, no traceback. The worker is a
    stand-in here only to skip that minute-long wait."""
    from confluent_kafka import KafkaError, KafkaException

    import dedup_worker.cli as cli

    class NoBroker:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def run(self) -> None:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Timed out waiting"))

    monkeypatch.setattr(cli, "DedupWorker", NoBroker)
    assert main([*BASE, "--metrics-port", "0", "--log-format", "text"]) == EXIT_KAFKA == 6
    err = capsys.readouterr().err
    assert "kafka failed: Timed out waiting (bootstrap servers 127.0.0.1:9092)" in err
    assert "Traceback" not in err
