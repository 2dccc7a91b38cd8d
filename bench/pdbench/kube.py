"""A real kube-apiserver and etcd for the benches (`just kube-apiserver`
builds both into .tools/kube/bin), started as tests/e2e/kube_real.rs starts
them: on 127.0.0.1, no kubelet and no controllers, RBAC on, a static admin
token, ServiceAccount tokens signed by a key made here. A pod is an object
whose status is written as kubelet would write it. Objects go in with
`kubectl` as the admin."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from .common import REPO, Procs, free_port, http_get, wait_until

NS = "llm"
# The shipped ServiceAccount (deploy/envoy).
SA = "pd-router"
ADMIN_TOKEN = "bench-admin-token"


def kube_bins() -> tuple[Path, Path]:
    bin_dir = REPO / ".tools/kube/bin"
    return (Path(os.environ.get("KUBE_APISERVER_BIN", bin_dir / "kube-apiserver")),
            Path(os.environ.get("ETCD_BIN", bin_dir / "etcd")))


class Kube:
    """etcd and kube-apiserver, both in `procs` (stopped with the rest)."""

    def __init__(self, procs: Procs, core: str | None):
        self.procs = procs
        self.dir = procs.scratch / "kube"
        self.dir.mkdir(exist_ok=True)
        apiserver, etcd = kube_bins()
        for b in (apiserver, etcd):
            if not b.exists():
                raise RuntimeError(f"{b} not found (`just kube-apiserver` builds it)")
        etcd_port, peer_port, self.port = free_port(), free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        self.etcd = procs.start("etcd", [
            str(etcd), "--name", "bench", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"bench={peer}", "--unsafe-no-fsync", "--log-level", "warn"],
            core)
        wait_until("etcd", lambda: b'"health":"true"' in http_get(f"{self.etcd_url}/health", 2)[1],
                   30, self.etcd)
        self.apiserver = self._start_apiserver(apiserver, core)
        self.ca = self.dir / "certs/apiserver.crt"
        wait_until("kube-apiserver certificate", self.ca.exists, 90, self.apiserver)
        self.kubeconfig = self.dir / "kubeconfig"
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: bench\n  cluster: "
            f"{{server: \"https://127.0.0.1:{self.port}\", certificate-authority: \"{self.ca}\"}}\n"
            f"users:\n- name: admin\n  user: {{token: {ADMIN_TOKEN}}}\ncontexts:\n- name: bench\n"
            f"  context: {{cluster: bench, user: admin, namespace: {NS}}}\ncurrent-context: bench\n")
        wait_until("kube-apiserver /readyz",
                   lambda: self.try_kubectl(["get", "--raw", "/readyz"]).returncode == 0,
                   90, self.apiserver)

    def _start_apiserver(self, binary: Path, core: str | None) -> subprocess.Popen:
        sa_key = self.dir / "sa.key"
        subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout",
                        "-out", str(sa_key)], check=True, capture_output=True)
        tokens = self.dir / "tokens.csv"
        tokens.write_text(f'{ADMIN_TOKEN},bench-admin,bench-admin,"system:masters"\n')
        return self.procs.start("kube-apiserver", [
            str(binary), "--etcd-servers", self.etcd_url, "--bind-address", "127.0.0.1",
            "--advertise-address", "127.0.0.1", "--secure-port", str(self.port),
            # No --tls-cert-file: a self-signed pair naming 127.0.0.1 and
            # kubernetes.default.svc, CA and certificate in apiserver.crt.
            "--cert-dir", str(self.dir / "certs"), "--token-auth-file", str(tokens),
            "--service-account-key-file", str(sa_key),
            "--service-account-signing-key-file", str(sa_key),
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--authorization-mode", "RBAC", "--service-cluster-ip-range", "10.0.0.0/24",
            # No controller manager makes the namespaces' `default` account.
            "--disable-admission-plugins", "ServiceAccount",
            "--endpoint-reconciler-type", "none", "--enable-priority-and-fairness=false"],
            core)

    def try_kubectl(self, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), "--cache-dir",
                               str(self.dir / "kubectl-cache"), *args],
                              input=stdin, capture_output=True, text=True, timeout=120)

    def kubectl(self, args: list[str], stdin: str | None = None) -> str:
        out = self.try_kubectl(args, stdin)
        if out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()[-400:]}")
        return out.stdout

    def apply(self, manifest: str) -> None:
        self.kubectl(["apply", "-f", "-"], manifest)

    def token(self) -> str:
        """A TokenRequest token for the shipped ServiceAccount (one hour)."""
        return self.kubectl(["create", "token", SA, "--duration", "1h"]).strip()

    def add_pod(self, name: str, ip: str, labels: dict) -> None:
        """A pod bound to a node no one runs, then the status kubelet would
        write once it runs and is ready."""
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": NS, "labels": labels},
               "spec": {"nodeName": "bench-node",
                        "containers": [{"name": "engine", "image": "mock-engine"}]}}
        self.kubectl(["create", "-f", "-"], json.dumps(pod))
        status = {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                             "conditions": [{"type": "Ready", "status": "True"}]}}
        self.kubectl(["patch", "pod", name, "--subresource=status", "--type=merge", "-p",
                      json.dumps(status)])


def shipped_rbac() -> str:
    """deploy/envoy's Namespace, ServiceAccount, Role and RoleBinding: the
    identity the filter's discovery reads the API with."""
    out = subprocess.run(["kubectl", "kustomize", str(REPO / "deploy/envoy")],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    kinds = {f"kind: {k}" for k in ("Namespace", "ServiceAccount", "Role", "RoleBinding")}
    docs = [d for d in out.split("\n---\n") if any(line in kinds for line in d.splitlines())]
    if len(docs) != 4:
        raise RuntimeError(f"deploy/envoy: expected 4 identity objects, found {len(docs)}")
    return "\n---\n".join(docs)


def projected_token(volume: Path, token: str) -> None:
    """The token as kubelet projects it: `token` -> `..data/token`, `..data`
    a symlink to a timestamped directory."""
    volume.mkdir(parents=True, exist_ok=True)
    ts = volume / "..2026_01_01_00_00_00.1"
    ts.mkdir()
    (ts / "token").write_text(token)
    (volume / "..data").symlink_to(ts.name)
    (volume / "token").symlink_to("..data/token")

