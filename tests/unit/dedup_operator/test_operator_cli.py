"""The operator's command line: the passes' request rate (--api-qps, --api-burst) and
what a bad value gets (one line, the usage exit code, before the cluster is asked)."""

from __future__ import annotations

import pytest

from dedup_operator.cli import API_BURST, API_QPS, EXIT_USAGE, build_parser, main


def test_the_passes_request_rate_defaults_and_can_be_left_to_the_api_server() -> None:
    args = build_parser().parse_args([])
    assert (args.api_qps, args.api_burst) == (API_QPS, API_BURST) == (50.0, 100)
    assert build_parser().parse_args(["--api-qps", "0"]).api_qps == 0.0


@pytest.mark.parametrize("argv", [["--api-qps", "-1"], ["--api-burst", "0"]])
def test_a_bad_request_rate_is_refused_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--api-qps 0 or more" in err
