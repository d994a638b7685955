"""Networking pods on real nodes can use (issue 28, second stage; docs/development.md,
"Real nodes": the address choice and why, and what stays on the host).

- The address pods reach the host at, `claim_host_address()` (`dedupapiN`,
  `10.200.N.1/32`, from the nodes' subnet pool), is in `dedup_local.host`, which the
  control plane claims it from.
- `HostProxy`: the host's one kube-proxy (iptables mode) for one control plane's real
  nodes, so a pod reaches the API server at the service IP with its projected token. Two
  kube-proxies on one host write the same KUBE-* chains, whatever their service CIDRs, so
  a machine-wide lock makes it one at a time: a second run waits for the first to stop.
  It leaves host sysctls alone; `stop()` runs `kube-proxy --cleanup` and checks that no
  KUBE-* chain is left. It refuses to start (or clean up) beside KUBE-* chains, nftables
  tables or IPVS services that no HostProxy made.

    with ControlPlane(kubelets=True) as cp, RealNode(cp) as node, HostProxy(cp, node):
        KafkaBroker(host=cp.host)  # reachable from the node's pods
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import yaml

from .control_plane import KUBERNETES_SERVICE_IP, kube_binaries
from .host import (
    SYSTEM_PATH,
    LoggedProcess,
    RealNodeError,
    log_tail,
    may_die_with_parent,
    nodes_dir,
    process_identity,
    run_command,
    spawn_logged,
    system_tool,
)
from .lifecycle import Started
from .paths import free_port

if TYPE_CHECKING:
    from .control_plane import ControlPlane
    from .real_node import RealNode

# Chains a kubelet makes (makeIPTablesUtilChains; ours do not): not a sign of another
# kube-proxy. kube-proxy makes KUBE-FIREWALL too (with jumps from INPUT and OUTPUT), and
# its --cleanup leaves it as the kubelet's: `HostProxy` removes it if it was not there.
KUBELET_CHAINS = frozenset({"KUBE-FIREWALL", "KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"})
SAVE = {"ip4": "iptables-save", "ip6": "ip6tables-save"}
TABLES = {"ip4": "iptables", "ip6": "ip6tables"}
KLOG_ERROR = re.compile(r"^[EF]\d{4} ", re.MULTILINE)


# --------------------------------------------------------------------- host state
def iptables_kube_chains() -> list[str]:
    """Every KUBE-* chain in the host's iptables (IPv4 and IPv6, every table), as
    "ip4 nat KUBE-SERVICES"."""
    found = []
    for family, save in SAVE.items():
        result = subprocess.run(
            [system_tool(save)], capture_output=True, text=True, timeout=60, check=False
        )
        table = "?"
        for line in result.stdout.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":KUBE-"):
                found.append(f"{family} {table} {line[1:].split()[0]}")
    return found


def kube_chains() -> list[str]:
    """The KUBE-* chains only a kube-proxy makes (a kubelet's are left out)."""
    return [c for c in iptables_kube_chains() if c.split()[2] not in KUBELET_CHAINS]


def _remove_firewall_chain(family: str) -> None:
    """kube-proxy's empty copy of the kubelet's KUBE-FIREWALL and its jumps (it makes
    them at start whatever its settings, and --cleanup leaves them): `-X` refuses a
    chain that holds rules, so one that someone filled since is left."""
    iptables = system_tool(TABLES[family])
    for parent in ("INPUT", "OUTPUT"):
        for _ in range(10):  # one jump each, unless made more than once
            rule = [iptables, "-t", "filter", "-D", parent, "-j", "KUBE-FIREWALL"]
            if subprocess.run(rule, capture_output=True, timeout=60).returncode != 0:
                break
    subprocess.run(
        [iptables, "-t", "filter", "-X", "KUBE-FIREWALL"], capture_output=True, timeout=60
    )


def _foreign_state() -> list[str]:
    """What kube-proxy would touch on start (nftables `kube-proxy` tables) or on
    --cleanup (IPVS services, the kube-ipvs0 device) that this project never makes."""
    found = []
    result = subprocess.run(
        [system_tool("nft"), "list", "tables"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found += [line for line in result.stdout.splitlines() if line.endswith(" kube-proxy")]
    with contextlib.suppress(OSError):
        services = Path("/proc/net/ip_vs").read_text().splitlines()[3:]
        found += [f"IPVS service {line.strip()}" for line in services if line.strip()]
    if Path("/sys/class/net/kube-ipvs0").exists():
        found.append("the kube-ipvs0 device")
    return found


# --------------------------------------------------------------------- kube-proxy
class HostProxy(Started):
    """The host's kube-proxy for one control plane's real nodes (module docstring).

    Args:
        control_plane: a started `ControlPlane(kubelets=True)`.
        node: a Ready node of it, whose name kube-proxy runs under (it reads the node's
            IP from its Node at start, and would exit if that changed).
        lock_timeout: seconds to wait for another run's kube-proxy on this host to stop.
        start_timeout: seconds until the service IP's rules are in place.
    """

    def __init__(
        self,
        control_plane: ControlPlane,
        node: RealNode,
        *,
        lock_timeout: float = 900.0,
        start_timeout: float = 60.0,
    ) -> None:
        self.control_plane = control_plane
        self.node = node
        self.lock_timeout = lock_timeout
        self.start_timeout = start_timeout
        self._lock: IO[str] | None = None
        self._proc: LoggedProcess | None = None
        self._healthz_port = 0
        self._atexit_registered = False
        self.chains_after_stop: list[str] = []
        self.start_seconds = 0.0

    @property
    def directory(self) -> Path:
        return self.control_plane.data_dir / "kube-proxy"

    @property
    def log_path(self) -> Path:
        return self.control_plane.log_path("kube-proxy")

    @property
    def cleanup_log_path(self) -> Path:
        return self.control_plane.log_path("kube-proxy-cleanup")

    def log_errors(self) -> list[str]:
        """The error (E) and fatal (F) lines of kube-proxy's logs, its --cleanup's too."""
        lines = []
        for path in (self.log_path, self.cleanup_log_path):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")
                lines += [line for line in text.splitlines() if KLOG_ERROR.match(line)]
        return lines

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.alive()

    def start(self) -> HostProxy:
        """Take the host's kube-proxy lock (waiting for another run's to stop), clean up
        after a run that died holding it, start kube-proxy; returns once the service
        IP of the API server has its rules."""
        if self._lock is not None:
            return self
        binaries = kube_binaries()
        binaries.require("kube-proxy")
        for name in ("iptables", "iptables-save", "iptables-restore", "ip6tables-save", "nft"):
            system_tool(name)
        t0 = time.monotonic()
        self._take_lock()
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            self._clean_or_refuse()
            owner = {
                "owner": process_identity(os.getpid()),
                "server": self.control_plane.server,
                "kubelet_chains_before": [
                    c for c in iptables_kube_chains() if c.split()[2] in KUBELET_CHAINS
                ],
            }
            self._owner_record().write_text(json.dumps(owner))
            self._write_config()
            self._spawn()
            self._wait_rules()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Stop kube-proxy, remove its rules (`kube-proxy --cleanup`), record what KUBE-*
        chains are left (`chains_after_stop`, normally none), release the lock."""
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False
        if self._lock is None:
            return
        try:
            if self._proc is not None:
                self._proc.terminate(grace=10.0)
                self._proc = None
            self._cleanup()
            before = set(self._record().get("kubelet_chains_before", []))
            self.chains_after_stop = [c for c in iptables_kube_chains() if c not in before]
            if not self.chains_after_stop:
                self._owner_record().unlink(missing_ok=True)
        finally:
            self._lock.close()
            self._lock = None

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _owner_record() -> Path:
        return nodes_dir() / "kube-proxy.owner"

    def _take_lock(self) -> None:
        path = nodes_dir() / ".kube-proxy.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = path.open("a")
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    lock.close()
                    holder = self._owner_record()
                    who = holder.read_text() if holder.exists() else "unknown"
                    raise RealNodeError(
                        f"another run's kube-proxy held this host for {self.lock_timeout:.0f}s"
                        f" ({who})"
                    ) from None
                time.sleep(1.0)
        self._lock = lock

    def _clean_or_refuse(self) -> None:
        """Under the lock: a record left by a run that died holding it means its rules
        are still there: clean them up. KUBE-* chains without one are someone else's."""
        foreign = _foreign_state()
        if foreign:
            raise RealNodeError(
                "not starting kube-proxy beside state it would remove and that no "
                f"HostProxy made: {foreign}"
            )
        if self._owner_record().exists():
            self._cleanup()
            self._owner_record().unlink()
        chains = kube_chains()
        if chains:
            raise RealNodeError(
                "iptables holds KUBE-* chains that no HostProxy made (another kube-proxy "
                f"on this host?); leaving them and not starting: {chains[:8]}"
            )

    def _record(self) -> dict[str, Any]:
        try:
            record = json.loads(self._owner_record().read_text())
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def _cleanup(self) -> None:
        """`kube-proxy --cleanup`, then its KUBE-FIREWALL where none was before it."""
        if _foreign_state():
            return  # --cleanup would remove those too: leave the rules for a person
        self.cleanup_log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.cleanup_log_path.open("ab") as log:
            subprocess.run(
                [str(kube_binaries().path("kube-proxy")), "--cleanup", "--v=1"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PATH": SYSTEM_PATH}, timeout=120, check=False,
            )  # fmt: skip
        before = set(self._record().get("kubelet_chains_before", []))
        for family in TABLES:
            if f"{family} filter KUBE-FIREWALL" not in before:
                _remove_firewall_chain(family)

    def _write_config(self) -> None:
        cp = self.control_plane
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        key, crt = cp.issue_certificate(d / "client", common_name="system:kube-proxy")
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "local", "cluster": {"server": cp.server, "certificate-authority": str(cp.ca_path)}}
            ],
            "users": [{"name": "kube-proxy", "user": {"client-certificate": str(crt), "client-key": str(key)}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "kube-proxy"}}],
            "current-context": "local",
        }  # fmt: skip
        (d / "kubeconfig").write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
        (d / "kubeconfig").chmod(0o600)
        self._healthz_port = free_port()
        config: dict[str, Any] = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "hostnameOverride": self.node.name,
            "clientConnection": {"kubeconfig": str(d / "kubeconfig")},
            "healthzBindAddress": f"127.0.0.1:{self._healthz_port}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "bindAddressHardFail": True,
            # Host sysctls untouched: no conntrack table size or timeouts, and no
            # route_localnet (node ports on localhost off), no OOM score of its own.
            "oomScoreAdj": 0,
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
            # Node ports only on the node's own address; no cluster CIDR: pods' traffic
            # to a service is not masqueraded (its endpoints are on this host).
            "nodePortAddresses": ["primary"],
        }
        (d / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def _spawn(self) -> None:
        argv = [
            str(kube_binaries().path("kube-proxy")),
            f"--config={self.directory / 'config.yaml'}",
            "--v=1",
        ]
        env = {**os.environ, "PATH": SYSTEM_PATH}
        self._proc = spawn_logged(
            "kube-proxy", argv, self.log_path, self.directory, may_die_with_parent(), env
        )

    def _wait_rules(self) -> None:
        """Until kube-proxy is healthy (its first sync done) and the nat table sends the
        `kubernetes` service's IP somewhere."""
        proc = self._proc
        assert proc is not None
        url = f"http://127.0.0.1:{self._healthz_port}/healthz"
        deadline = time.monotonic() + self.start_timeout
        while True:
            if not proc.alive():
                raise RealNodeError(
                    f"kube-proxy exited while starting (exit code {proc.popen.poll()}); "
                    f"last lines of {self.log_path}:\n{log_tail(self.log_path)}"
                )
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen(url, timeout=2) as resp:
                    healthy = resp.status == 200
                rules = run_command(
                    [system_tool("iptables"), "-t", "nat", "-S", "KUBE-SERVICES"], check=False
                )
                if healthy and "default/kubernetes:https cluster IP" in rules:
                    return
            if time.monotonic() > deadline:
                raise RealNodeError(
                    f"kube-proxy made no rules for the API server's service within "
                    f"{self.start_timeout:.0f}s; last lines of {self.log_path}:\n"
                    f"{log_tail(self.log_path)}"
                )
            time.sleep(0.2)


class PodsCutOffTheApi:
    """The pods of one real node lose the API server, as on a real network partition:
    `RealNode.partition` only stops the kubelet, and its pods would still reach the API
    server through the host's kube-proxy rules. `cut()` inserts a DROP rule for the
    service IP (10.0.0.1) and for the API server's host address and port in each ready
    pod sandbox's own network namespace (`nsenter` into its pause process), nothing on
    the host; Kafka (same host address, another port) stays reachable, as a partition
    between a node and the control plane leaves the brokers alone. `restore()` deletes
    the rules of the sandboxes still there (a pod gone with its node takes its own)."""

    def __init__(self, node: RealNode, api_host: str, api_port: int) -> None:
        self.node = node
        self.rules = [
            ["-d", f"{KUBERNETES_SERVICE_IP}/32", "-j", "DROP"],
            ["-d", f"{api_host}/32", "-p", "tcp", "--dport", str(api_port), "-j", "DROP"],
        ]
        self.pids: list[int] = []

    def _iptables(self, pid: int, op: str, rule: list[str], check: bool = True) -> None:
        cmd = ["nsenter", f"--net=/proc/{pid}/ns/net", system_tool("iptables"), "-w", op, "OUTPUT"]
        result = subprocess.run(
            [*cmd, *rule], capture_output=True, text=True, timeout=30, check=False
        )
        if check and result.returncode != 0:
            raise RealNodeError(
                f"node {self.node.name}: iptables {op} in the sandbox of pid {pid}: "
                f"{result.stderr.strip()}"
            )

    def cut(self) -> list[str]:
        """Cut every ready sandbox of the node; returns their namespace/name."""
        cut = []
        sandboxes = json.loads(self.node.crictl("pods", "--state", "ready", "-o", "json"))
        for sandbox in sandboxes.get("items") or []:
            info = json.loads(self.node.crictl("inspectp", sandbox["id"]))
            pid = int(info["info"]["pid"])
            for rule in self.rules:
                self._iptables(pid, "-I", rule)
            self.pids.append(pid)
            meta = sandbox["metadata"]
            cut.append(f"{meta['namespace']}/{meta['name']}")
        return cut

    def restore(self) -> None:
        for pid in self.pids:
            if Path(f"/proc/{pid}").exists():
                for rule in self.rules:
                    self._iptables(pid, "-D", rule, check=False)
        self.pids.clear()
