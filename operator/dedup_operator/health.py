"""The operator's own probes, `/healthz` and `/readyz`, served from kopf's event loop.

- `/healthz` (liveness): 200 when the event loop that runs kopf's watches answers. The
  handler runs *in* that loop (an aiohttp server started next to `kopf.operator`), so a
  blocked or dead loop does not answer at all and the kubelet's probe times out; a
  process whose loop has stopped is restarted.
- `/readyz` (readiness): 200 once the process has connected to the API server (the
  preflight listed DedupPipelines) and kopf has started (login done, startup handlers
  run: leader election and the resync thread are going); 503 before. It stays 200
  afterwards: losing the API server for a while is not a reason to restart or to pull
  a replica, kopf's watches reconnect by themselves.

A standby replica (one that does not hold the Lease `dedup-operator-leader`) reports
Ready too, as the standby replicas of leader-elected Kubernetes controllers do: it runs
the same watches and is ready to act the moment it takes the Lease, so a rolling update
or a PodDisruptionBudget counts it as available. Which replica acts is in the Lease
(`kubectl get lease dedup-operator-leader -o yaml`), not in readiness.

When `--health-port` equals `--metrics-port` the same server also serves `/metrics`
(the process's Prometheus registry): one port for both, as the chart uses it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web

TEXT = "text/plain"


@dataclass
class Health:
    """What the probes report; `ready` is set by the CLI once kopf has started."""

    connected: bool = False  # the preflight reached the API server
    started: asyncio.Event = field(default_factory=asyncio.Event)  # kopf's ready flag

    @property
    def ready(self) -> bool:
        return self.connected and self.started.is_set()


def application(health: Health, with_metrics: bool = False) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n", content_type=TEXT)

    async def readyz(_: web.Request) -> web.Response:
        if health.ready:
            return web.Response(text="ready\n", content_type=TEXT)
        why = "starting" if health.connected else "not connected to the API server"
        return web.Response(status=503, text=f"{why}\n", content_type=TEXT)

    async def metrics(_: web.Request) -> web.Response:
        from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

        return web.Response(
            body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if with_metrics:
        app.router.add_get("/metrics", metrics)
    return app


async def serve(
    health: Health, port: int, address: str = "0.0.0.0", with_metrics: bool = False
) -> web.AppRunner:
    """Start serving in the running loop; stop with `await runner.cleanup()`."""
    runner = web.AppRunner(application(health, with_metrics), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, address, port).start()
    return runner
