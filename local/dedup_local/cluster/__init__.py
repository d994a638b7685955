"""The local cluster: a real Kubernetes control plane whose nodes run pods as local
processes (see cluster.py); the stand-in for kubelet + a CSI driver."""

from .cluster import LocalCluster
from .timings import ClusterTimings

__all__ = ["ClusterTimings", "LocalCluster"]
