"""A real Kubernetes control plane without containers: etcd + kube-apiserver, and
optionally kube-controller-manager and kube-scheduler, as local processes.

The binaries come from `scripts/setup-kube.sh` (`make setup-kube`), cached under
`$DEDUP_CACHE/kube-$KUBERNETES_VERSION/bin`. Everything a run needs (certificates,
service-account keys, a static token file, the kubeconfig, etcd's data, one log file per
component) lives in a fresh data directory that is removed again by `stop()`.

    with ControlPlane(with_controllers=True) as cp:
        core = kubernetes.client.CoreV1Api(cp.api_client())
        ...

Every process runs in its own process group; `stop()` (also called on a failed start,
on `with` exit, at interpreter exit and, on Linux, when the parent dies) terminates the
groups.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .host import HostAddress, LoggedProcess, claim_host_address, may_die_with_parent, spawn_logged
from .lifecycle import Started
from .paths import MissingArtifact, cache_dir, free_port, versions
from .patience import PatientDeadline

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

SETUP_HINT = "run: make setup-kube"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"
"""The `kubernetes` service's address: the first of the range, as the API server gives it."""
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMIN_USER = "dedup-admin"
# The audit policy of the local control planes: every request of a service account (the
# operator's, the workers', the audit's; tests read what each asked and was answered)
# at Metadata level, once it completed; nothing of anyone else.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
"""

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


class ControlPlaneError(RuntimeError):
    """A component failed to start or to become ready; the message has its log tail."""


class KubectlError(subprocess.CalledProcessError):
    """kubectl failed; str() includes what it printed on stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr}"


@dataclass(frozen=True)
class KubeBinaries:
    """Paths of the cached control-plane binaries."""

    bin_dir: Path

    def path(self, name: str) -> Path:
        return self.bin_dir / name

    @property
    def etcd(self) -> Path:
        return self.path("etcd")

    @property
    def kube_apiserver(self) -> Path:
        return self.path("kube-apiserver")

    @property
    def kube_controller_manager(self) -> Path:
        return self.path("kube-controller-manager")

    @property
    def kube_scheduler(self) -> Path:
        return self.path("kube-scheduler")

    @property
    def kubectl(self) -> Path:
        return self.path("kubectl")

    @property
    def helm(self) -> Path:
        return self.path("helm")

    def require(self, *names: str) -> None:
        """Raise MissingArtifact unless every named binary is present and executable."""
        missing = [n for n in names if not os.access(self.path(n), os.X_OK)]
        if missing:
            raise MissingArtifact(
                f"Kubernetes binaries missing in {self.bin_dir}: {', '.join(missing)}; {SETUP_HINT}"
            )


def kube_bin_dir() -> Path:
    """Where `scripts/setup-kube.sh` puts the binaries for the pinned Kubernetes version."""
    return cache_dir() / f"kube-{versions()['KUBERNETES_VERSION']}" / "bin"


def kube_binaries(bin_dir: Path | None = None) -> KubeBinaries:
    return KubeBinaries(bin_dir if bin_dir is not None else kube_bin_dir())


def _failure(proc: LoggedProcess, what: str) -> ControlPlaneError:
    return ControlPlaneError(proc.failure_message(what))


class ControlPlane(Started):
    """etcd + kube-apiserver (+ kube-controller-manager + kube-scheduler) on loopback.

    Args:
        with_controllers: also run kube-controller-manager (garbage collection, Jobs,
            service accounts, node lifecycle, ...) and kube-scheduler.
        data_dir: where to put certificates, etcd data and logs; a fresh temporary
            directory (removed by `stop()`) when omitted.
        bin_dir: the binaries; defaults to the cache of the pinned version.
        start_timeout: seconds each component may take to become ready.
        extra_args: extra command-line flags per component name (see COMPONENTS),
            e.g. {"kube-controller-manager": ["--node-monitor-grace-period=20s"]}.
        keep_data: keep `data_dir` after `stop()` (also: DEDUP_KUBE_KEEP_DATA=1).
        crds: CustomResourceDefinition files to install before the controllers start,
            so the garbage collector watches their kinds from the beginning (it only
            rediscovers API resources every 30s).
        kubelets: serve real kubelets (local/dedup_local/real_node.py): the Node
            authorizer and the NodeRestriction admission plugin beside RBAC (each node
            has its own credentials, `issue_certificate`), a client certificate the API
            server shows kubelets (CN kube-apiserver-kubelet-client, group
            system:masters), kubelets' serving certificates checked against the CA, and
            their InternalIP preferred over the node's name (which nothing resolves);
            and the API server bound to and advertised on a private address of the
            host that pods reach (`host`; `host.claim_host_address`), not
            127.0.0.1. Off by default: the other tests' control planes stay as they were.
    """

    def __init__(
        self,
        *,
        with_controllers: bool = True,
        data_dir: Path | None = None,
        bin_dir: Path | None = None,
        start_timeout: float = 60.0,
        extra_args: Mapping[str, Sequence[str]] | None = None,
        keep_data: bool | None = None,
        crds: Iterable[Path] = (),
        kubelets: bool = False,
    ) -> None:
        self.with_controllers = with_controllers
        self.kubelets = kubelets
        self.crds = [Path(p) for p in crds]
        self.binaries = kube_binaries(bin_dir)
        self.start_timeout = start_timeout
        self.extra_args: dict[str, list[str]] = {k: list(v) for k, v in (extra_args or {}).items()}
        unknown = set(self.extra_args) - set(COMPONENTS)
        if unknown:
            raise ValueError(f"extra_args for unknown components: {sorted(unknown)}")
        self._own_data_dir = data_dir is None
        self._data_dir = data_dir
        if keep_data is None:
            keep_data = os.environ.get("DEDUP_KUBE_KEEP_DATA", "") not in ("", "0")
        self.keep_data = keep_data
        self._processes: list[LoggedProcess] = []
        self._token = secrets.token_hex(16)
        self._apiserver_port = 0
        self._etcd_port = 0
        self._component_tokens: dict[str, str] = {}
        self._started = False
        self._atexit_registered = False
        self._die_with_parent = False
        self.start_seconds = 0.0
        self._host = "127.0.0.1"
        self._host_address: HostAddress | None = None

    # ------------------------------------------------------------------ properties
    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            raise RuntimeError("control plane not started")
        return self._data_dir

    @property
    def host(self) -> str:
        """The address the API server binds and advertises: 127.0.0.1, or with
        `kubelets` a private address of this host that pods on real nodes reach."""
        return self._host

    @property
    def apiserver_port(self) -> int:
        """The port the API server listens on (at `host`)."""
        if not self._apiserver_port:
            raise RuntimeError("control plane not started")
        return self._apiserver_port

    @property
    def server(self) -> str:
        """The apiserver URL, e.g. https://127.0.0.1:41234."""
        return f"https://{self._host}:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        if not self._etcd_port:
            raise RuntimeError("control plane not started")
        return f"http://127.0.0.1:{self._etcd_port}"

    @property
    def kubeconfig_path(self) -> Path:
        """A kubeconfig for an admin (group system:masters) with the cluster CA."""
        return self.data_dir / "kubeconfig"

    @property
    def ca_path(self) -> Path:
        return self.data_dir / "pki" / "ca.crt"

    @property
    def token(self) -> str:
        """The admin's bearer token."""
        return self._token

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def running(self) -> bool:
        return self._started and all(p.alive() for p in self._processes)

    def log_path(self, component: str) -> Path:
        return self.log_dir / f"{component}.log"

    # ------------------------------------------------------------------ clients
    def api_client(self) -> ApiClient:
        """A new kubernetes.client.ApiClient authenticated as the admin (from the admin's
        kubeconfig: this server, its CA, the admin's token), without a request limit."""
        from dedup_contract import kube_client

        return kube_client.api_client(self.kubeconfig_path, qps=None)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run the cached kubectl against this control plane; with `check`, a failure
        raises KubectlError, whose message includes kubectl's stderr."""
        self.binaries.require("kubectl")
        argv = [
            str(self.binaries.kubectl),
            f"--kubeconfig={self.kubeconfig_path}",
            f"--cache-dir={self.data_dir / 'kubectl-cache'}",
            *args,
        ]
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, check=False, timeout=timeout
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def install_crds(self, paths: Iterable[Path], timeout: float = 30.0) -> list[str]:
        """Server-side apply the CustomResourceDefinitions in the given YAML files
        (idempotent) and wait until each is established; returns their names."""
        from kubernetes import client

        docs = [
            doc
            for path in paths
            for doc in yaml.safe_load_all(Path(path).read_text())
            if doc and doc.get("kind") == "CustomResourceDefinition"
        ]
        names = [str(doc["metadata"]["name"]) for doc in docs]
        with self.api_client() as api:
            ext = client.ApiextensionsV1Api(api)
            for name, doc in zip(names, docs, strict=True):
                ext.patch_custom_resource_definition(
                    name,
                    doc,
                    field_manager="dedup-local",
                    force=True,
                    _content_type="application/apply-patch+yaml",
                )
            patience = PatientDeadline(timeout)  # a busy machine waits longer
            for name in names:
                while True:
                    status = ext.read_custom_resource_definition(name).status
                    conditions = {
                        c.type: c.status for c in (status.conditions if status else None) or []
                    }
                    if conditions.get("Established") == "True":
                        break
                    if patience.expired():
                        raise ControlPlaneError(
                            f"CRD {name} not established after {patience.describe()}: {conditions}"
                        )
                    time.sleep(0.05)
        return names

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ControlPlane:
        if self._started:
            return self
        needed = ["etcd", "kube-apiserver"]
        if self.with_controllers:
            needed += ["kube-controller-manager", "kube-scheduler"]
        self.binaries.require(*needed)
        t0 = time.monotonic()
        self._die_with_parent = may_die_with_parent()
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix="dedup-kube-"))
        self._data_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            self._claim_host_address()
            self._write_pki()
            self._write_auth()
            self._start_with_port_retry(self._start_etcd)
            self._start_with_port_retry(self._start_apiserver)
            self._write_kubeconfigs()
            if self.crds:
                self.install_crds(self.crds)
            if self.with_controllers:
                self._start_controller_manager()
                self._start_scheduler()
                self._wait_controllers_working()
        except BaseException:
            self._stop_processes()
            self._release_host_address()
            raise
        self._started = True
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Terminate every process this control plane started; remove its data dir."""
        self._stop_processes()
        self._release_host_address()
        self._started = False
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False
        if self._own_data_dir and self._data_dir is not None and not self.keep_data:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None
            self._apiserver_port = self._etcd_port = 0

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver alone (SIGTERM; SIGKILL after 10 s), keeping etcd, the
        controllers and the data: a control-plane outage for tests. `start_apiserver()`
        brings it back on the same port."""
        proc = next((p for p in self._processes if p.name == "kube-apiserver"), None)
        if proc is None:
            raise ControlPlaneError("kube-apiserver is not running")
        self._processes.remove(proc)
        proc.terminate(grace=10.0)

    def start_apiserver(self) -> None:
        """Start kube-apiserver again after `stop_apiserver()`: same port, same etcd;
        returns once it answers /readyz."""
        if any(p.name == "kube-apiserver" for p in self._processes):
            return
        self._start_apiserver(self._apiserver_port)
        # back in start order (after etcd), so that stop() still ends it before etcd
        etcd = next(i for i, p in enumerate(self._processes) if p.name == "etcd")
        self._processes.insert(etcd + 1, self._processes.pop())

    def _claim_host_address(self) -> None:
        """With `kubelets`: the private address pods reach (see `host`)."""
        if self.kubelets and self._host_address is None:
            self._host_address = claim_host_address()
            self._host = self._host_address.address

    def _release_host_address(self) -> None:
        if self._host_address is not None:
            self._host_address.release()
            self._host_address = None

    def _stop_processes(self) -> None:
        while self._processes:
            proc = self._processes.pop()  # reverse start order: controllers, apiserver, etcd
            proc.terminate(grace=10.0)

    # ------------------------------------------------------------------ files
    def _openssl(self, *args: str) -> None:
        try:
            subprocess.run(
                ["openssl", *args],
                cwd=self.data_dir / "pki",
                check=True,
                capture_output=True,
                text=True,
            )
        except FileNotFoundError as exc:
            raise MissingArtifact(
                "openssl not found on PATH (needed for the apiserver certificates)"
            ) from exc
        except subprocess.CalledProcessError as exc:
            raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{exc.stderr}") from exc

    def _write_pki(self) -> None:
        """A CA, the apiserver's serving certificate and the service-account key pair."""
        pki = self.data_dir / "pki"
        pki.mkdir(exist_ok=True)
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        self._openssl(
            "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
            "-subj", "/CN=dedup-local-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        )  # fmt: skip
        sans = [
            "IP:127.0.0.1",
            *([f"IP:{self._host}"] if self._host != "127.0.0.1" else []),
            f"IP:{KUBERNETES_SERVICE_IP}",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ]
        (pki / "apiserver.ext").write_text(
            f"subjectAltName={','.join(sans)}\n"
            "extendedKeyUsage=serverAuth\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
        )
        self._openssl(
            "req", "-new", *ec, "-keyout", "apiserver.key", "-out", "apiserver.csr",
            "-subj", "/CN=kube-apiserver",
        )  # fmt: skip
        self._openssl(
            "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "apiserver.crt", "-days", "3650",
            "-extfile", "apiserver.ext",
        )  # fmt: skip
        self._openssl(
            "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "sa.key"
        )
        self._openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        if self.kubelets:
            self.issue_certificate(
                pki / "apiserver-kubelet-client",
                common_name="kube-apiserver-kubelet-client",
                organizations=["system:masters"],
            )
        for key in pki.glob("*.key"):
            key.chmod(0o600)

    def issue_certificate(
        self,
        prefix: Path,
        *,
        common_name: str,
        organizations: Sequence[str] = (),
        client: bool = True,
        server_names: Sequence[str] = (),
    ) -> tuple[Path, Path]:
        """A key and a certificate signed by this control plane's CA, written to
        `prefix`.key and `prefix`.crt (returned in that order): for clients (the subject's
        CN is the user name, each O a group) and, with `server_names` ("IP:...",
        "DNS:..."), for serving too."""
        prefix.parent.mkdir(parents=True, exist_ok=True)
        key, csr, crt, ext = (prefix.with_suffix(s) for s in (".key", ".csr", ".crt", ".ext"))
        subject = "".join(f"/O={org}" for org in organizations) + f"/CN={common_name}"
        usages = (["clientAuth"] if client else []) + (["serverAuth"] if server_names else [])
        if not usages:
            raise ValueError("a certificate for neither clients nor servers")
        lines = [
            f"extendedKeyUsage={','.join(usages)}",
            "keyUsage=critical,digitalSignature,keyEncipherment",
        ]
        if server_names:
            lines.append(f"subjectAltName={','.join(server_names)}")
        ext.write_text("\n".join(lines) + "\n")
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        self._openssl("req", "-new", *ec, "-keyout", str(key), "-out", str(csr), "-subj", subject)
        self._openssl(
            "x509", "-req", "-in", str(csr), "-CA", "ca.crt", "-CAkey", "ca.key",
            "-set_serial", str(secrets.randbits(63)), "-out", str(crt), "-days", "3650",
            "-extfile", str(ext),
        )  # fmt: skip
        key.chmod(0o600)
        csr.unlink()
        ext.unlink()
        return key, crt

    def _write_auth(self) -> None:
        # token,user,uid,"group1,group2"; every identity here is a cluster admin.
        users = [
            (self._token, ADMIN_USER),
            (secrets.token_hex(16), "system:kube-controller-manager"),
            (secrets.token_hex(16), "system:kube-scheduler"),
        ]
        self._component_tokens = {user: token for token, user in users}
        lines = [f'{tok},{user},{user},"system:masters"' for tok, user in users]
        path = self.data_dir / "tokens.csv"
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)

    def _kubeconfig(self, user: str, token: str) -> dict[str, Any]:
        ca = base64.b64encode(self.ca_path.read_bytes()).decode()
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "dedup-local",
                    "cluster": {"server": self.server, "certificate-authority-data": ca},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {"name": "dedup-local", "context": {"cluster": "dedup-local", "user": user}}
            ],
            "current-context": "dedup-local",
        }

    def _write_kubeconfigs(self) -> None:
        self._write_yaml(self.kubeconfig_path, self._kubeconfig(ADMIN_USER, self._token))
        for user, token in self._component_tokens.items():
            if user != ADMIN_USER:
                name = user.removeprefix("system:")
                self._write_yaml(
                    self.data_dir / f"{name}.kubeconfig", self._kubeconfig(user, token)
                )

    @staticmethod
    def _write_yaml(path: Path, data: dict[str, Any]) -> None:
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        path.chmod(0o600)

    # ------------------------------------------------------------------ processes
    def _spawn(self, name: str, argv: list[str]) -> LoggedProcess:
        proc = spawn_logged(name, argv, self.log_path(name), self.data_dir, self._die_with_parent)
        self._processes.append(proc)
        return proc

    def _start_with_port_retry(self, start: Callable[[], None], attempts: int = 3) -> None:
        """Ports come from free_port(), so another process may grab one first: retry."""
        for attempt in range(attempts):
            try:
                start()
                return
            except ControlPlaneError as exc:
                if attempt == attempts - 1 or "address already in use" not in str(exc):
                    raise
                self._processes.pop().terminate(grace=5.0)

    def _wait(self, proc: LoggedProcess, ready: Callable[[], bool], what: str) -> None:
        # start_timeout on an idle machine; a busy one waits longer (dedup_local.patience)
        patience = PatientDeadline(self.start_timeout)
        delay = 0.02
        while True:
            if not proc.alive():
                raise _failure(proc, "exited while starting")
            if ready():
                return
            if patience.expired():
                raise _failure(proc, f"did not become {what} within {patience.describe()}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def _start_etcd(self) -> None:
        self._etcd_port = free_port()
        peer_port = free_port()
        peer = f"http://127.0.0.1:{peer_port}"
        data = self.data_dir / "etcd"
        argv = [
            str(self.binaries.etcd),
            "--name=dedup",
            f"--data-dir={data}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=dedup={peer}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync",  # test data only; much faster on slow disks
            # A single member elects itself after one election timeout (default 1s).
            "--heartbeat-interval=20",
            "--election-timeout=200",
            "--log-level=warn",
            *self.extra_args.get("etcd", []),
        ]
        proc = self._spawn("etcd", argv)
        url = f"{self.etcd_url}/health"

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    return bool(json.load(resp).get("health") == "true")
            except (OSError, ValueError):
                return False

        self._wait(proc, healthy, "healthy")

    @property
    def audit_log_path(self) -> Path:
        """The API server's audit log (JSON lines): every request of a service account
        at Metadata level (who, verb, resource, namespace, name, response code)."""
        return self.data_dir / "audit.log"

    def _audit_args(self) -> list[str]:
        policy = self.data_dir / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log_path}",
            "--audit-log-format=json",
            "--audit-log-maxsize=1024",  # MB: one file for a test session
            "--audit-log-maxbackup=1",
        ]

    def audit_events(self, user: str | None = None) -> list[dict[str, Any]]:
        """The audit log's events (ResponseStarted for watches, ResponseComplete), of
        `user` when given, e.g. "system:serviceaccount:<namespace>:<name>"."""
        events = []
        try:
            text = self.audit_log_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        for line in text.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line being written
            if user is not None and (event.get("user") or {}).get("username") != user:
                continue
            events.append(event)
        return events

    def _start_apiserver(self, port: int = 0) -> None:
        self._apiserver_port = port or free_port()
        pki = self.data_dir / "pki"
        argv = [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self._host}",
            f"--advertise-address={self._host}",
            f"--secure-port={self._apiserver_port}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={self.data_dir / 'tokens.csv'}",
            # The Node authorizer for real kubelets' own credentials (see `kubelets`).
            f"--authorization-mode={'Node,RBAC' if self.kubelets else 'RBAC'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--allow-privileged=true",
            "--profiling=false",
            *self._audit_args(),
            *self._kubelet_args(),
            *self.extra_args.get("kube-apiserver", []),
        ]
        proc = self._spawn("kube-apiserver", argv)
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        request = urllib.request.Request(
            f"{self.server}/readyz", headers={"Authorization": f"Bearer {self._token}"}
        )

        def ready() -> bool:
            try:
                with urllib.request.urlopen(request, timeout=2, context=ctx) as resp:
                    return bool(resp.status == 200)
            except (OSError, urllib.error.HTTPError):
                return False

        self._wait(proc, ready, "ready (/readyz)")

    def _kubelet_args(self) -> list[str]:
        """The API server's flags for real kubelets (see `kubelets`)."""
        if not self.kubelets:
            return []
        pki = self.data_dir / "pki"
        return [
            "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={pki / 'ca.crt'}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
        ]

    def _start_controller_manager(self) -> None:
        pki = self.data_dir / "pki"
        argv = [
            str(self.binaries.kube_controller_manager),
            f"--kubeconfig={self.data_dir / 'kube-controller-manager.kubeconfig'}",
            "--secure-port=0",
            "--leader-elect=false",
            "--controllers=*",
            "--use-service-account-credentials=false",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            # Default is /usr/libexec/kubernetes/...; it would be created on the host.
            f"--flex-volume-plugin-dir={self.data_dir / 'flexvolume'}",
            *self.extra_args.get("kube-controller-manager", []),
        ]
        self._spawn("kube-controller-manager", argv)

    def _start_scheduler(self) -> None:
        argv = [
            str(self.binaries.kube_scheduler),
            f"--kubeconfig={self.data_dir / 'kube-scheduler.kubeconfig'}",
            "--secure-port=0",
            "--leader-elect=false",
            *self.extra_args.get("kube-scheduler", []),
        ]
        self._spawn("kube-scheduler", argv)

    def _wait_controllers_working(self) -> None:
        """The service-account controller has made `default/default`: controllers run."""
        kcm = next(p for p in self._processes if p.name == "kube-controller-manager")
        ctx = ssl.create_default_context(cafile=str(self.ca_path))
        request = urllib.request.Request(
            f"{self.server}/api/v1/namespaces/default/serviceaccounts/default",
            headers={"Authorization": f"Bearer {self._token}"},
        )

        def has_default_sa() -> bool:
            try:
                with urllib.request.urlopen(request, timeout=2, context=ctx) as resp:
                    return bool(resp.status == 200)
            except (OSError, urllib.error.HTTPError):
                return False

        self._wait(kcm, has_default_sa, "working (no default ServiceAccount)")
        for proc in self._processes:
            if not proc.alive():
                raise _failure(proc, "exited while starting")


def main() -> None:
    """`python -m dedup_local.control_plane`: start a control plane and print how to reach it."""
    with ControlPlane(with_controllers=True, keep_data=False) as cp:
        print(f"control plane ready in {cp.start_seconds:.1f}s: {cp.server}", flush=True)
        print(f"export KUBECONFIG={cp.kubeconfig_path}", flush=True)
        print("Ctrl-C stops it.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
