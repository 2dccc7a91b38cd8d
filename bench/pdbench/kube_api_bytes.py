"""API-server bytes per minute for pod discovery: list polling vs watches.

    .venv/bin/python bench/kube_api_bytes.py [--pods 2000] [--replicas 10]

Builds one realistic vLLM decode pod with the official Kubernetes models
(PyPI `kubernetes`): a Deployment's pod with 20 environment variables, a
model-cache PVC, /dev/shm, the projected ServiceAccount token volume, GPU
resources, probes, a NIXL side-channel port, container and init-container
statuses, five conditions and the managedFields that kube-controller-manager
and the kubelet write. It serialises it as the API server does (compact
JSON) and computes, per minute, for N pods behind R gateway replicas:

  list polling  R × (60 / mean interval) × size of a PodList of N pods
  watch         R × (60 / mean window) × a BOOKMARK event
                + R × churn × size of one event (a pod as a watch event)
                + one LIST per replica on each 410 (reported separately)

with pd-router's defaults: interval_ms 2000 plus a mean jitter of 5 %,
watch_seconds 2 plus a mean jitter of 100 ms; churn is the pod changes per
minute the selector sees (default 1 % of the pods, e.g. readiness flips and
a rolling restart). Bodies only: HTTP headers and TLS framing are left out,
which favours polling (a watch answer's headers are a larger share).
"""

import argparse
import datetime
import json

from kubernetes import client as k8s
from kubernetes.client import ApiClient

T = datetime.datetime(2026, 11, 30, 8, 15, 42, tzinfo=datetime.timezone.utc)


def fields(d):
    """managedFields' fieldsV1 for a nested dict of field names (as the API
    server writes it: `f:` keys, `.: {}` for maps)."""
    out = {}
    for k, v in d.items():
        out[k] = fields(v) if isinstance(v, dict) else {}
        if isinstance(v, dict) and v:
            out[k][".:"] = {}
    return {k.replace(".:", "."): v for k, v in out.items()}


def realistic_pod(i):
    name = "qwen3-8b-decode-7c9f8d6b54-%05d" % i
    env = [k8s.V1EnvVar(name=n, value=v) for n, v in [
        ("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"), ("VLLM_LOGGING_LEVEL", "INFO"),
        ("HF_HOME", "/models/hf"), ("HF_HUB_OFFLINE", "1"), ("VLLM_USE_V1", "1"),
        ("UCX_TLS", "cuda_ipc,cuda_copy,tcp,rc"), ("UCX_NET_DEVICES", "mlx5_0:1"),
        ("NCCL_DEBUG", "WARN"), ("NCCL_IB_HCA", "mlx5"), ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
        ("OMP_NUM_THREADS", "8"), ("TORCH_CUDA_ARCH_LIST", "9.0"), ("VLLM_WORKER_MULTIPROC_METHOD", "spawn"),
        ("PYTHONUNBUFFERED", "1"), ("MODEL", "Qwen/Qwen3-8B"), ("SERVED_MODEL_NAME", "qwen3-8b"),
    ]] + [
        k8s.V1EnvVar(name="VLLM_NIXL_SIDE_CHANNEL_HOST",
                     value_from=k8s.V1EnvVarSource(field_ref=k8s.V1ObjectFieldSelector(field_path="status.podIP"))),
        k8s.V1EnvVar(name="POD_NAME",
                     value_from=k8s.V1EnvVarSource(field_ref=k8s.V1ObjectFieldSelector(field_path="metadata.name"))),
        k8s.V1EnvVar(name="POD_NAMESPACE",
                     value_from=k8s.V1EnvVarSource(field_ref=k8s.V1ObjectFieldSelector(field_path="metadata.namespace"))),
        k8s.V1EnvVar(name="HF_TOKEN", value_from=k8s.V1EnvVarSource(
            secret_key_ref=k8s.V1SecretKeySelector(name="hf-token", key="token", optional=True))),
    ]
    args = ["--model", "Qwen/Qwen3-8B", "--served-model-name", "qwen3-8b", "--port", "8000",
            "--tensor-parallel-size", "1", "--max-model-len", "32768", "--gpu-memory-utilization", "0.92",
            "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}', "--enable-prefix-caching"]
    probe = lambda path, delay: k8s.V1Probe(http_get=k8s.V1HTTPGetAction(path=path, port=8000, scheme="HTTP"),
                                           initial_delay_seconds=delay, period_seconds=10, timeout_seconds=5,
                                           success_threshold=1, failure_threshold=3)
    container = k8s.V1Container(
        name="vllm", image="vllm/vllm-openai:v0.11.0", image_pull_policy="IfNotPresent",
        command=["vllm", "serve"], args=args, env=env,
        ports=[k8s.V1ContainerPort(container_port=8000, name="http", protocol="TCP"),
               k8s.V1ContainerPort(container_port=5600, name="nixl", protocol="TCP")],
        resources=k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": "1", "memory": "64Gi"},
                                             requests={"nvidia.com/gpu": "1", "memory": "48Gi", "cpu": "8"}),
        readiness_probe=probe("/health", 30), liveness_probe=probe("/health", 600),
        startup_probe=probe("/health", 0),
        volume_mounts=[k8s.V1VolumeMount(name="models", mount_path="/models"),
                       k8s.V1VolumeMount(name="shm", mount_path="/dev/shm"),
                       k8s.V1VolumeMount(name="kube-api-access-x7k2p", mount_path="/var/run/secrets/kubernetes.io/serviceaccount", read_only=True)],
        termination_message_path="/dev/termination-log", termination_message_policy="File",
        security_context=k8s.V1SecurityContext(capabilities=k8s.V1Capabilities(add=["IPC_LOCK"])))
    init = k8s.V1Container(name="model-download", image="ghcr.io/llm-d/model-downloader:v0.3.0",
                           args=["--model", "Qwen/Qwen3-8B", "--dest", "/models/hf"],
                           volume_mounts=[k8s.V1VolumeMount(name="models", mount_path="/models")],
                           resources=k8s.V1ResourceRequirements(), image_pull_policy="IfNotPresent",
                           termination_message_path="/dev/termination-log", termination_message_policy="File")
    volumes = [
        k8s.V1Volume(name="models", persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(claim_name="model-cache")),
        k8s.V1Volume(name="shm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit="16Gi")),
        k8s.V1Volume(name="kube-api-access-x7k2p", projected=k8s.V1ProjectedVolumeSource(default_mode=420, sources=[
            k8s.V1VolumeProjection(service_account_token=k8s.V1ServiceAccountTokenProjection(expiration_seconds=3607, path="token")),
            k8s.V1VolumeProjection(config_map=k8s.V1ConfigMapProjection(name="kube-root-ca.crt", items=[k8s.V1KeyToPath(key="ca.crt", path="ca.crt")])),
            k8s.V1VolumeProjection(downward_api=k8s.V1DownwardAPIProjection(items=[k8s.V1DownwardAPIVolumeFile(
                path="namespace", field_ref=k8s.V1ObjectFieldSelector(api_version="v1", field_path="metadata.namespace"))])),
        ])),
    ]
    labels = {"app.kubernetes.io/name": "qwen3-8b", "app.kubernetes.io/component": "decode",
              "model.aibrix.ai/name": "qwen3-8b", "model.aibrix.ai/engine": "vllm", "model.aibrix.ai/port": "8000",
              "role-name": "decode", "roleset-name": "rs-%d" % (i % 50), "pod-template-hash": "7c9f8d6b54"}
    cond = lambda t: k8s.V1PodCondition(type=t, status="True", last_transition_time=T)
    ip = "10.%d.%d.%d" % (64 + i // 65536, (i // 256) % 256, i % 256)
    running = k8s.V1ContainerState(running=k8s.V1ContainerStateRunning(started_at=T))
    status = k8s.V1PodStatus(
        phase="Running", host_ip="172.20.4.%d" % (i % 250), host_ips=[k8s.V1HostIP(ip="172.20.4.%d" % (i % 250))],
        pod_ip=ip, pod_ips=[k8s.V1PodIP(ip=ip)], start_time=T, qos_class="Burstable",
        conditions=[cond(t) for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")],
        container_statuses=[k8s.V1ContainerStatus(
            name="vllm", image="docker.io/vllm/vllm-openai:v0.11.0", image_id="docker.io/vllm/vllm-openai@sha256:" + "4f" * 32,
            container_id="containerd://" + "%064x" % (i * 7919), ready=True, started=True, restart_count=0, state=running,
            volume_mounts=[k8s.V1VolumeMountStatus(name=m.name, mount_path=m.mount_path, read_only=m.read_only) for m in container.volume_mounts])],
        init_container_statuses=[k8s.V1ContainerStatus(
            name="model-download", image="ghcr.io/llm-d/model-downloader:v0.3.0", image_id="ghcr.io/llm-d/model-downloader@sha256:" + "9a" * 32,
            container_id="containerd://" + "%064x" % (i * 104729), ready=True, started=False, restart_count=0,
            state=k8s.V1ContainerState(terminated=k8s.V1ContainerStateTerminated(exit_code=0, reason="Completed", started_at=T, finished_at=T)))])
    spec = k8s.V1PodSpec(containers=[container], init_containers=[init], volumes=volumes, node_name="gpu-node-%03d" % (i % 250),
                         service_account_name="default", service_account="default", restart_policy="Always",
                         dns_policy="ClusterFirst", scheduler_name="default-scheduler", priority=0,
                         preemption_policy="PreemptLowerPriority", enable_service_links=True,
                         termination_grace_period_seconds=120, security_context=k8s.V1PodSecurityContext(),
                         tolerations=[k8s.V1Toleration(key=k, operator="Exists", effect=e, toleration_seconds=s) for k, e, s in [
                             ("nvidia.com/gpu", "NoSchedule", None), ("node.kubernetes.io/not-ready", "NoExecute", 300),
                             ("node.kubernetes.io/unreachable", "NoExecute", 300)]])
    manager = lambda who, op, f, sub=None: k8s.V1ManagedFieldsEntry(manager=who, operation=op, api_version="v1", time=T,
                                                                      fields_type="FieldsV1", fields_v1=f, subresource=sub)
    spec_dict = ApiClient().sanitize_for_serialization(spec)
    status_dict = ApiClient().sanitize_for_serialization(status)
    meta = k8s.V1ObjectMeta(
        name=name, generate_name="qwen3-8b-decode-7c9f8d6b54-", namespace="llm",
        uid="%08x-1d2e-4f3a-9b8c-%012x" % (i, i * 31), resource_version=str(48213977 + i), creation_timestamp=T,
        labels=labels, annotations={"kubectl.kubernetes.io/restartedAt": "2026-11-30T08:15:00Z"},
        owner_references=[k8s.V1OwnerReference(api_version="apps/v1", kind="ReplicaSet", name="qwen3-8b-decode-7c9f8d6b54",
                                               uid="5c1d7e2a-0b3f-4e8d-9a6c-2f4b8d1e7c30", controller=True, block_owner_deletion=True)],
        managed_fields=[
            manager("kube-controller-manager", "Update", {"f:metadata": fields({"f:generateName": 0, "f:labels": {"f:" + k: 0 for k in labels},
                                                                                  "f:ownerReferences": {}}),
                                                            "f:spec": fields({"f:" + k: ({"f:" + kk: 0 for kk in v} if isinstance(v, dict) else 0)
                                                                              for k, v in spec_dict.items()})}),
            manager("kubelet", "Update", {"f:status": fields({"f:" + k: ({"f:" + kk: 0 for kk in v} if isinstance(v, dict) else 0)
                                                              for k, v in status_dict.items()})}, "status"),
        ])
    return ApiClient().sanitize_for_serialization(k8s.V1Pod(api_version="v1", kind="Pod", metadata=meta, spec=spec, status=status))


def compact(obj):
    return len(json.dumps(obj, separators=(",", ":")).encode())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--replicas", type=int, default=10)
    ap.add_argument("--interval-ms", type=int, default=2000)
    ap.add_argument("--watch-seconds", type=int, default=2)
    ap.add_argument("--churn-per-min", type=float, default=None, help="pod changes a minute (default 1%% of the pods)")
    a = ap.parse_args()
    churn = a.churn_per_min if a.churn_per_min is not None else a.pods / 100
    pod = realistic_pod(1)
    item = dict(pod)
    item.pop("kind")
    item.pop("apiVersion")
    per_item = compact(item) + 1  # the comma between items
    list_bytes = compact({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "48215977"}, "items": []}) + per_item * a.pods
    event_bytes = compact({"type": "MODIFIED", "object": pod}) + 1  # the newline
    bookmark_bytes = compact({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                                             "metadata": {"resourceVersion": "48215977"}}}) + 1
    lists_per_min = 60_000 / (a.interval_ms * 1.05)
    watches_per_min = 60_000 / (a.watch_seconds * 1000 + 100)
    polling = a.replicas * lists_per_min * list_bytes
    watching = a.replicas * (watches_per_min * bookmark_bytes + churn * event_bytes)
    mb = lambda b: "%.1f MB" % (b / 1e6) if b >= 1e5 else "%.1f kB" % (b / 1e3)
    print("Kubernetes API bytes per minute, %d pods, %d replicas (bench/kube_api_bytes.py)" % (a.pods, a.replicas))
    print("  one pod (list item): %d bytes; a list of %d: %s" % (per_item, a.pods, mb(list_bytes)))
    print("  list polling (every %d ms + jitter): %s/min" % (a.interval_ms, mb(polling)))
    print("  watch (%d s windows + jitter, %.0f changes/min): %s/min" % (a.watch_seconds, churn, mb(watching)))
    print("  watch, each 410 answered by a list: + %s per replica" % mb(list_bytes))
    print("  ratio: %.0f x fewer bytes" % (polling / watching))


if __name__ == "__main__":
    main()
