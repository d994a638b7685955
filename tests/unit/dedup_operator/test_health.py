"""The operator's probe server on a real port (the whole operator: test_operator_health)."""

from __future__ import annotations

import asyncio

import aiohttp

from dedup_local.paths import free_port
from dedup_operator.health import Health, serve


async def _get(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


def test_ready_only_once_connected_and_started_and_live_throughout() -> None:
    async def scenario() -> None:
        health = Health()
        port = free_port()
        runner = await serve(health, port, "127.0.0.1")
        try:
            assert await _get(port, "/healthz") == (200, "ok\n")
            assert await _get(port, "/readyz") == (503, "not connected to the API server\n")
            health.connected = True
            assert await _get(port, "/readyz") == (503, "starting\n")
            health.started.set()  # kopf's ready flag
            assert await _get(port, "/readyz") == (200, "ready\n")
            assert (await _get(port, "/metrics"))[0] == 404  # its own port: no /metrics
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


def test_metrics_on_the_same_port_when_asked() -> None:
    async def scenario() -> None:
        import dedup_operator.operator_metrics  # noqa: F401  (registers the operator's metrics)

        port = free_port()
        runner = await serve(Health(connected=True), port, "127.0.0.1", with_metrics=True)
        try:
            status, text = await _get(port, "/metrics")
            assert status == 200 and "dedup_operator_reconcile_seconds" in text
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
