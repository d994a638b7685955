"""How fast the local cluster reacts. `ClusterTimings()` holds the production defaults
(kubelet / kube-controller-manager / kube-apiserver); `ClusterTimings.fast()` the values
tests use so that a lost node is noticed in seconds instead of minutes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClusterTimings:
    # kube-controller-manager --node-monitor-grace-period (production 50s): a node whose
    # Lease has not been renewed for this long turns Ready=Unknown and gets tainted.
    node_monitor_grace_period_s: int = 50
    # kube-controller-manager --node-monitor-period (production 5s).
    node_monitor_period_s: int = 5
    # kube-controller-manager --node-startup-grace-period (production 60s).
    node_startup_grace_period_s: int = 60
    # kube-apiserver --default-not-ready-toleration-seconds /
    # --default-unreachable-toleration-seconds (production 300s each).
    not_ready_toleration_s: int = 300
    unreachable_toleration_s: int = 300
    # kubelet: nodeLeaseDurationSeconds (40s), renewed every quarter of it (10s).
    node_lease_duration_s: int = 40
    node_lease_renew_s: float = 10.0
    # kubelet nodeStatusUpdateFrequency (production 10s).
    node_status_update_s: float = 10.0
    # How often an agent looks at its pods and the attacher at its objects (a kubelet
    # watches; polling keeps the stand-in small). Not a Kubernetes setting.
    poll_s: float = 1.0
    # kubelet container restart back-off: 10s doubling up to 300s.
    restart_backoff_initial_s: float = 10.0
    restart_backoff_max_s: float = 300.0

    @classmethod
    def fast(cls) -> ClusterTimings:
        return cls(
            node_monitor_grace_period_s=8,
            node_monitor_period_s=1,
            node_startup_grace_period_s=10,
            not_ready_toleration_s=10,
            unreachable_toleration_s=10,
            node_lease_duration_s=8,
            node_lease_renew_s=1.0,
            node_status_update_s=2.0,
            poll_s=0.5,
            restart_backoff_initial_s=1.0,
            restart_backoff_max_s=10.0,
        )

    def control_plane_args(self) -> dict[str, list[str]]:
        """`ControlPlane(extra_args=...)` for these timings."""
        return {
            "kube-controller-manager": [
                f"--node-monitor-grace-period={self.node_monitor_grace_period_s}s",
                f"--node-monitor-period={self.node_monitor_period_s}s",
                f"--node-startup-grace-period={self.node_startup_grace_period_s}s",
            ],
            "kube-apiserver": [
                f"--default-not-ready-toleration-seconds={self.not_ready_toleration_s}",
                f"--default-unreachable-toleration-seconds={self.unreachable_toleration_s}",
            ],
        }

    def backoff(self, restarts: int) -> float:
        """Seconds to wait before restarting a container that already restarted `restarts` times."""
        return min(
            self.restart_backoff_initial_s * float(2 ** max(restarts, 0)),
            self.restart_backoff_max_s,
        )
