"""The Kubernetes workloads as declared in each stack's plan: probes against the sizing, flags
and env per vendor, secrets only through secretKeyRef, GPU resources, LeaderWorkerSet roles,
spec-hashed Job names, add-ons, storage, network policy; and the probe/marker scripts run for real."""

from __future__ import annotations

import base64
import http.server
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pulumi
import pytest

from components import program
from components.core import pod_security
from components.core.config import read_stack_config
from components.core.engine_cache import restored_at_start
from components.core.errors import ConfigError
from components.core.naming import GPU_TAINT_KEY, VLLM_SERVICE_ACCOUNT, WEIGHT_SYNC_SERVICE_ACCOUNT
from components.core.versions import HELM_CHARTS
from components.core.weights import SYNC_SCRIPT_PATH
from components.k8s import addons as k8s_addons
from components.k8s import vllm_service
from components.k8s.common import COMPUTE_DOMAIN_CLAIM, COMPUTE_DOMAIN_CLAIM_TEMPLATE, spec_hash
from components.k8s.engine_cache import GATED_PROBE_SCRIPT
from components.k8s.weight_sync import sync_program_artifact
from components.plan_engine import SECRET_MASK, run_program
from tests.conftest import B300_PROD_FSX, FIXED_NOW, STACKS, TEST_SECRETS, plan_for

# The engine caches' init containers after the weight copy (components/k8s/engine_cache.py).
ENGINE_CACHE_CONTAINERS = ("engine-cache-restore", "engine-cache-save")

K8S_STACKS = [s for s in STACKS if plan_for(s).context.spec.profile.runs_kubernetes]
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
SECRET_ENV_NAMES = {"VLLM_API_KEY", "HF_TOKEN", "MODELSCOPE_API_TOKEN"}
LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


# -- helpers shared with test_k8s_schemas.py ------------------------------------------------------


def k8s_objects(run) -> list:
    """Recorded Kubernetes objects (custom resources of the kubernetes provider, Helm releases excluded)."""
    return [r for r in run.resources if r.custom and r.type.startswith("kubernetes:") and r.type != HELM_RELEASE]


def manifest(res) -> dict[str, Any]:
    """A recorded object's inputs as a manifest (masked secret maps become a masked entry)."""
    doc = json.loads(json.dumps(dict(res.inputs)))
    if doc.get("kind") == "Secret" and doc.get("stringData") == SECRET_MASK:
        doc["stringData"] = {"masked": SECRET_MASK}
    return doc


def of_kind(run, kind: str) -> list[dict[str, Any]]:
    return [manifest(r) for r in k8s_objects(run) if r.inputs.get("kind") == kind]


def one(run, kind: str) -> dict[str, Any]:
    found = of_kind(run, kind)
    assert len(found) == 1, f"{kind}: {len(found)} declared"
    return found[0]


def pod_templates(run) -> Iterator[tuple[str, dict[str, Any]]]:
    """(role, pod template) of every vLLM pod template and Job pod template."""
    for kind in ("Deployment", "Job"):
        for obj in of_kind(run, kind):
            yield obj["metadata"]["name"], obj["spec"]["template"]
    for lws in of_kind(run, "LeaderWorkerSet"):
        tmpl = lws["spec"]["leaderWorkerTemplate"]
        yield "leader", tmpl["leaderTemplate"]
        yield "worker", tmpl["workerTemplate"]


def vllm_pods(run) -> dict[str, dict[str, Any]]:
    """role name -> pod template of the vLLM workload."""
    deployments = of_kind(run, "Deployment")
    if deployments:
        return {"server": deployments[0]["spec"]["template"]}
    tmpl = one(run, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    return {"leader": tmpl["leaderTemplate"], "worker": tmpl["workerTemplate"]}


def vllm_container(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "vllm")


def walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from walk(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from walk(v, f"{path}[{i}]")
    else:
        yield path, value


def run_with_timeouts(stack: str, overrides: dict | None = None) -> tuple[Any, dict[str, Any]]:
    """Run ``stack`` with a stack transformation recording every resource's custom timeouts."""
    run, options, _ = run_with_options(stack, overrides)
    return run, {name: o.custom_timeouts for name, o in options.items() if o is not None and o.custom_timeouts is not None}


def run_with_options(stack: str, overrides: dict | None = None) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Run ``stack`` recording every resource's options and object: ``(run, name -> ResourceOptions,
    name -> pulumi.Resource)``."""
    captured: dict[str, Any] = {}
    resources: dict[str, Any] = {}
    original = program.declare

    def declare(ctx):
        def capture(args):
            captured[args.name] = args.opts
            resources[args.name] = args.resource
            return None

        pulumi.runtime.register_stack_transformation(capture)
        return original(ctx)

    config = dict(read_stack_config(stack))
    config.update(overrides or {})
    program.declare = declare
    try:
        run = run_program(config, stack=stack, secrets=TEST_SECRETS, now=FIXED_NOW)
    finally:
        program.declare = original
    return run, captured, resources


def seconds(text: str) -> int:
    assert text.endswith("s"), text
    return int(text[:-1])


def with_k8s(stack: str, **changes: Any) -> dict:
    """An override of ``kimi-deploy:kubernetes`` for ``stack`` with ``changes`` applied."""
    current = dict(read_stack_config(stack).get("kimi-deploy:kubernetes") or {})
    current.update(changes)
    return {"kimi-deploy:kubernetes": current}


# -- the workload set ----------------------------------------------------------------------------


EXPECTED_WORKLOAD = {
    # Jobs: publish-mirror only; the node-local copy is an init container of the vLLM pods.
    "b300-prod": {
        "Deployment": 1,
        "Job": 1,
        "PersistentVolume": 0,
        "PersistentVolumeClaim": 0,
        "LeaderWorkerSet": 0,
        "ComputeDomain": 0,
    },
    "gb300": {"Deployment": 0, "Job": 1, "PersistentVolume": 0, "LeaderWorkerSet": 1, "ComputeDomain": 1},
    "mi355x": {"Deployment": 1, "Job": 0, "PersistentVolume": 0, "LeaderWorkerSet": 0, "ComputeDomain": 0},
}


@pytest.mark.parametrize("name", sorted(EXPECTED_WORKLOAD))
def test_kubernetes_stacks_declare_the_complete_workload_set(name):
    run = plan_for(name)
    # Objects of the workload namespace (and cluster-scoped ones); the Grafana dashboard
    # ConfigMap lives in the Grafana namespace (test_observability.py).
    workload_ns = run.context.spec.config.kubernetes.namespace
    kinds = [
        r.inputs.get("kind")
        for r in k8s_objects(run)
        if (r.inputs.get("metadata") or {}).get("namespace", workload_ns) == workload_ns
    ]
    for kind in ("Namespace", "Service", "PodDisruptionBudget", "NetworkPolicy"):
        assert kinds.count(kind) == 1, f"{name}: {kind} x{kinds.count(kind)}"
    # The weight-sync program, the API guard, and the engine-cache program where the pods restore the caches.
    assert kinds.count("ConfigMap") == 2 + restored_at_start(run.context.spec), f"{name}: ConfigMap x{kinds.count('ConfigMap')}"
    assert kinds.count("Secret") >= 1 and kinds.count("ServiceAccount") >= 2
    for kind, count in EXPECTED_WORKLOAD[name].items():
        assert kinds.count(kind) == count, f"{name}: {kind} x{kinds.count(kind)}, expected {count}"
    assert run.outputs["serviceUrl"] == "http://kimi-vllm-api.kimi.svc.cluster.local:8000/v1"
    assert len(run.outputs["weightSyncJobs"]) == EXPECTED_WORKLOAD[name]["Job"]
    assert all(n.startswith("kimi-weights-") for n in run.outputs["weightSyncJobs"])


def test_ec2_stack_declares_no_kubernetes_objects():
    run = plan_for("b300")
    assert not [r for r in run.resources if r.type.startswith("kubernetes:")]
    assert "kubernetesNamespace" not in run.outputs


# -- probes and timeouts against the sizing ------------------------------------------------------


@pytest.mark.parametrize("name", K8S_STACKS)
def test_startup_probe_budget_covers_the_startup_budget(name):
    run = plan_for(name)
    budget = run.context.sizing.startup_budget_seconds
    for role, pod in vllm_pods(run).items():
        c = vllm_container(pod)
        if role == "worker":
            assert "startupProbe" not in c and "ports" not in c  # headless: no HTTP server
            continue
        probe = c["startupProbe"]
        assert probe["httpGet"]["path"] == "/health"
        assert probe["failureThreshold"] * probe["periodSeconds"] >= budget
        assert probe.get("initialDelaySeconds", 0) == 0
        # The engine-ready timeout inside vLLM equals the same budget.
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert int(env["VLLM_ENGINE_READY_TIMEOUT_S"]) == budget


@pytest.mark.parametrize("name", K8S_STACKS)
def test_liveness_only_after_startup_and_readiness_proves_the_model(name):
    run = plan_for(name)
    served = run.context.vllm.served_model_names[0]
    for role, pod in vllm_pods(run).items():
        c = vllm_container(pod)
        if role == "worker":
            continue
        live = c["livenessProbe"]
        assert live["httpGet"]["path"] == "/health" and "startupProbe" in c
        assert live["periodSeconds"] * live["failureThreshold"] >= 60
        ready = c["readinessProbe"]["exec"]["command"]
        if ready[2] == GATED_PROBE_SCRIPT:  # with engine caches: the save's gate first (tests/test_engine_cache.py)
            ready = ready[4:]
        assert ready[:2] == ["python3", "-c"] and "/v1/models" in ready[2] and "VLLM_API_KEY" in ready[2]
        assert ready[3:] == [str(run.context.vllm.port), served]
        key_env = next(e for e in c["env"] if e["name"] == "VLLM_API_KEY")
        assert key_env["valueFrom"]["secretKeyRef"]["name"] == "kimi-vllm-api-key"


@pytest.mark.parametrize("name", K8S_STACKS)
def test_pulumi_timeouts_and_progress_deadline_cover_the_startup_budget(name):
    run, timeouts = run_with_timeouts(name)
    budget = run.context.sizing.startup_budget_seconds
    workload = "vllm-leaderworkerset" if of_kind(run, "LeaderWorkerSet") else "vllm-deployment"
    assert seconds(timeouts[workload].create) >= budget
    assert seconds(timeouts[workload].update) >= budget * run.context.spec.replicas
    for dep in of_kind(run, "Deployment"):
        assert dep["spec"]["progressDeadlineSeconds"] >= budget
        assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    for lws in of_kind(run, "LeaderWorkerSet"):
        assert lws["metadata"]["annotations"]["pulumi.com/waitFor"] == "condition=Available"
        # Same no-surge rollout as the Deployment: no spare GPU node for a surge group.
        assert lws["spec"]["rolloutStrategy"] == {
            "type": "RollingUpdate", "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}}
    for job_name, t in timeouts.items():
        if job_name.startswith("weight-sync-"):
            job = run.named(job_name).inputs["spec"]
            assert seconds(t.create) == job["activeDeadlineSeconds"] >= 1800


@pytest.mark.parametrize("name", K8S_STACKS)
def test_service_awaits_after_the_workload_with_its_timeouts(name):
    """Pulumi's Service await waits for ready endpoints (10 min by default): the Service must be
    created after the workload is ready and wait at least as long as the workload may."""
    run, options, resources = run_with_options(name)
    workload = "vllm-leaderworkerset" if of_kind(run, "LeaderWorkerSet") else "vllm-deployment"
    svc_opts, wl_opts = options["vllm-service"], options[workload]
    assert any(d is resources[workload] for d in (svc_opts.depends_on or [])), "Service does not depend on the workload"
    svc = one(run, "Service")
    assert "pulumi.com/skipAwait" not in svc["metadata"].get("annotations", {})
    budget = run.context.sizing.startup_budget_seconds
    extra = vllm_service.LOAD_BALANCER_BUDGET_SECONDS if svc["spec"]["type"] == "LoadBalancer" else 0
    assert seconds(svc_opts.custom_timeouts.create) == seconds(wl_opts.custom_timeouts.create) + extra >= budget + extra
    assert seconds(svc_opts.custom_timeouts.update) == seconds(wl_opts.custom_timeouts.update) + extra


def test_load_balancer_service_timeouts_cover_nlb_provisioning():
    run, options, _ = run_with_options("gb300", overrides=with_k8s("gb300", serviceType="internal-nlb"))
    assert one(run, "Service")["spec"]["type"] == "LoadBalancer"
    create = seconds(options["vllm-service"].custom_timeouts.create)
    assert create == seconds(options["vllm-leaderworkerset"].custom_timeouts.create) + vllm_service.LOAD_BALANCER_BUDGET_SECONDS


def test_update_timeout_grows_with_replicas():
    run, timeouts = run_with_timeouts("b300-prod")
    assert run.context.spec.replicas == 2
    assert seconds(timeouts["vllm-deployment"].update) == 2 * seconds(timeouts["vllm-deployment"].create)


# -- vendors: parsers, flags, env, GPU resources ----------------------------------------------------


@pytest.mark.parametrize("name", K8S_STACKS)
def test_commands_are_the_core_builder_argv(name):
    run = plan_for(name)
    command = run.context.vllm
    pods = vllm_pods(run)
    assert set(pods) == {r.name for r in command.roles}
    for role in command.roles:
        c = vllm_container(pods[role.name])
        assert c["command"] == list(role.argv)
        assert c["image"] == command.image
        argv = " ".join(c["command"])
        assert "--tool-call-parser kimi_k3" in argv and "--reasoning-parser kimi_k3" in argv
        assert "--tensor-parallel-size 8" in argv and "--api-key" not in argv
        family = run.context.spec.target.image_family
        assert ("--load-format fastsafetensors" in argv) == (family == "cuda")
        assert ("--load-format auto" in argv) == (family == "rocm")


@pytest.mark.parametrize("name, resource, count, efa", [
    ("b300-prod", "nvidia.com/gpu", "8", None),
    ("gb300", "nvidia.com/gpu", "4", None),  # EFA is opt-in (compute.efa): tests/test_serve_transport.py
    ("mi355x", "amd.com/gpu", "8", None),
])
def test_gpu_resource_names_and_counts(name, resource, count, efa):
    run = plan_for(name)
    for _role, pod in vllm_pods(run).items():
        res = vllm_container(pod)["resources"]
        assert res["limits"][resource] == count and res["requests"][resource] == count
        gpu_keys = {k for k in res["limits"] if k.endswith("/gpu")}
        assert gpu_keys == {resource}
        assert res["limits"].get("vpc.amazonaws.com/efa") == efa
        # no CPU limit (components/core/pod_security.py says why); memory below the node's
        assert "cpu" not in res["limits"]
        assert res["limits"]["memory"] == f"{pod_security.vllm_memory_limit_gib(run.context.spec)}Gi"
        assert int(res["limits"]["memory"][:-2]) < run.context.spec.instance.memory_gib
        shm = next(v for v in pod["spec"]["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"]["medium"] == "Memory"
        assert {"name": "dshm", "mountPath": "/dev/shm"} in vllm_container(pod)["volumeMounts"]


def test_compute_domain_claim_only_on_gb300():
    run = plan_for("gb300")
    cd = one(run, "ComputeDomain")
    assert cd["apiVersion"] == "resource.nvidia.com/v1beta1"
    assert cd["spec"]["channel"]["resourceClaimTemplate"]["name"] == COMPUTE_DOMAIN_CLAIM_TEMPLATE
    # Deprecated field; 0 is the CRD's recommendation with IMEX daemons addressed by DNS names.
    assert cd["spec"]["numNodes"] == 0
    for pod in vllm_pods(run).values():
        assert pod["spec"]["resourceClaims"] == [
            {"name": COMPUTE_DOMAIN_CLAIM, "resourceClaimTemplateName": COMPUTE_DOMAIN_CLAIM_TEMPLATE}
        ]
        assert vllm_container(pod)["resources"]["claims"] == [{"name": COMPUTE_DOMAIN_CLAIM}]
        env = {e["name"]: e.get("value") for e in vllm_container(pod)["env"]}
        assert env["NCCL_MNNVL_ENABLE"] == "1"
    for other in ("b300-prod", "mi355x"):
        assert not of_kind(plan_for(other), "ComputeDomain")
        for pod in vllm_pods(plan_for(other)).values():
            assert "resourceClaims" not in pod["spec"] and "claims" not in vllm_container(pod)["resources"]


def test_rocm_stack_carries_no_nvidia_specifics():
    run = plan_for("mi355x")
    assert run.context.vllm.image.startswith("vllm/vllm-openai-rocm:")
    for res in k8s_objects(run) + run.of_type(HELM_RELEASE):
        for path, value in walk(dict(res.inputs)):
            if isinstance(value, str) and res.inputs.get("kind") != "ConfigMap":
                assert "nvidia" not in value.lower(), f"{res.name}{path}: {value}"
                assert not value.startswith("NCCL_"), f"{res.name}{path}"
            assert "nvidia" not in path.lower(), f"{res.name}{path}"
    env = {e["name"]: e.get("value") for e in vllm_container(vllm_pods(run)["server"])["env"]}
    assert env["VLLM_ROCM_USE_AITER"] == "1" and env["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"
    assert not any(k.startswith("NCCL_") for k in env)


# -- secrets ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", K8S_STACKS)
def test_secrets_reach_pods_only_through_secret_key_ref(name):
    run = plan_for(name)
    assert run.secret_leaks == []
    for _, pod in pod_templates(run):
        for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
            for env in c.get("env", []):
                if env["name"] in SECRET_ENV_NAMES:
                    assert set(env) == {"name", "valueFrom"}, f"{c['name']}: {env}"
                    assert set(env["valueFrom"]) == {"secretKeyRef"}
            assert "envFrom" not in c
    for secret in of_kind(run, "Secret"):
        assert secret["stringData"] == {"masked": SECRET_MASK}
    text = json.dumps([dict(r.inputs) for r in run.resources])
    for value in TEST_SECRETS.values():
        assert value not in text


def test_hub_token_reaches_only_the_jobs_that_read_the_hub():
    run = plan_for("gb300")
    publish = run.named("weight-sync-publish-mirror").inputs["spec"]["template"]["spec"]["containers"][0]
    assert any(e["name"] == "HF_TOKEN" for e in publish["env"])
    for pod in vllm_pods(run).values():
        copy = next(c for c in pod["spec"]["initContainers"] if c["name"] == "weight-sync")
        assert not any(e["name"] == "HF_TOKEN" for e in copy["env"])  # it reads the mirror
        assert not any(e["name"] == "HF_TOKEN" for e in vllm_container(pod)["env"])
        # The node copy runs in the pod: the pod has the sync account's mirror read access.
        assert pod["spec"]["serviceAccountName"] == WEIGHT_SYNC_SERVICE_ACCOUNT != VLLM_SERVICE_ACCOUNT


def test_generated_api_key_is_the_programs_random_password():
    run = plan_for("gb300", with_secrets=False)
    passwords = run.of_type("random:index/randomPassword:RandomPassword")
    assert [p.name for p in passwords] == ["vllm-api-key"]
    secret = next(s for s in of_kind(run, "Secret") if s["metadata"]["name"] == "kimi-vllm-api-key")
    assert secret["stringData"] == {"masked": SECRET_MASK}


# -- LeaderWorkerSet --------------------------------------------------------------------------------


def test_leaderworkerset_size_and_roles():
    run = plan_for("gb300")
    lws = one(run, "LeaderWorkerSet")
    spec = lws["spec"]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert spec["replicas"] == run.context.spec.replicas == 1
    tmpl = spec["leaderWorkerTemplate"]
    assert tmpl["size"] == run.context.spec.nodes_per_copy == 2
    assert tmpl["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = vllm_container(tmpl["leaderTemplate"]), vllm_container(tmpl["workerTemplate"])
    assert "$(LWS_LEADER_ADDRESS)" in leader["command"] and "$(LWS_LEADER_ADDRESS)" in worker["command"]
    assert "$(LWS_WORKER_INDEX)" in worker["command"] and "--headless" in worker["command"]
    assert leader["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert tmpl["leaderTemplate"]["metadata"]["labels"]["app.kubernetes.io/component"] == "leader"
    assert tmpl["workerTemplate"]["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    service = one(run, "Service")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "leader"


def test_leaderworkerset_replicas_follow_config():
    compute = dict(read_stack_config("gb300")["kimi-deploy:compute"], replicas=2)
    run = plan_for("gb300", overrides={"kimi-deploy:compute": compute})
    assert one(run, "LeaderWorkerSet")["spec"]["replicas"] == 2
    assert one(run, "ComputeDomain")["spec"]["numNodes"] == 0
    tmpl = one(run, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):  # every pod of every group copies onto its node
        assert [c["name"] for c in tmpl[role]["spec"]["initContainers"]] == ["weight-sync", *ENGINE_CACHE_CONTAINERS]


# -- weight-sync Jobs -------------------------------------------------------------------------------


def _job_name(run, step: str) -> str:
    return run.named(f"weight-sync-{step}").inputs["metadata"]["name"]


def test_job_whose_spec_changes_gets_a_new_name():
    base = plan_for("gb300")
    again = plan_for("gb300", overrides={})  # uncached: a second, independent run
    assert _job_name(again, "publish-mirror") == _job_name(base, "publish-mirror")
    vllm = dict(read_stack_config("gb300")["kimi-deploy:vllm"], imageTag="nightly-" + "2" * 40)
    changed = plan_for("gb300", overrides={"kimi-deploy:vllm": vllm})
    assert _job_name(changed, "publish-mirror") != _job_name(base, "publish-mirror")
    model = dict(read_stack_config("gb300")["kimi-deploy:model"], revision="0" * 40)
    moved = plan_for("gb300", overrides={"kimi-deploy:model": model})
    assert _job_name(moved, "publish-mirror") != _job_name(base, "publish-mirror")
    name = _job_name(base, "publish-mirror")
    assert name == "kimi-weights-publish-mirror-" + spec_hash(base.named("weight-sync-publish-mirror").inputs["spec"])


@pytest.mark.parametrize("name", K8S_STACKS)
def test_node_local_copy_is_an_init_container_of_every_vllm_pod(name):
    run = plan_for(name)
    assert not [r for r in run.resources if r.name == "weight-sync-node-copy"]  # no Job to re-run
    for role, pod in vllm_pods(run).items():
        inits = pod["spec"]["initContainers"]
        # Then the engine caches' restore and save sidecar where the pods restore them (test_engine_cache.py).
        cache = list(ENGINE_CACHE_CONTAINERS) if restored_at_start(run.context.spec) else []
        assert [c["name"] for c in inits] == ["weight-sync", *cache], role
        argv = inits[0]["command"]
        assert argv[:2] == ["python3", SYNC_SCRIPT_PATH] and argv[argv.index("--dest") + 1] == run.context.vllm.model_path
        weights = next(v for v in pod["spec"]["volumes"] if v["name"] == "weights")
        assert "hostPath" in weights  # the node's own NVMe
        mount = next(m for m in inits[0]["volumeMounts"] if m["name"] == "weights")
        assert mount["mountPath"] == "/models" and not mount.get("readOnly")
        assert next(m for m in vllm_container(pod)["volumeMounts"] if m["name"] == "weights")["readOnly"] is True


@pytest.mark.parametrize("name", K8S_STACKS)
def test_sync_program_is_mounted_from_a_configmap_of_the_zipapp(name):
    run = plan_for(name)
    (cm,) = [c for c in of_kind(run, "ConfigMap") if c["metadata"]["name"].startswith("kimi-weight-sync")]
    artifact = sync_program_artifact()
    assert cm["binaryData"] == {"weight_sync.pyz": base64.b64encode(artifact.data).decode()} and cm["immutable"] is True
    assert "data" not in cm
    assert cm["metadata"]["name"] == "kimi-weight-sync-" + artifact.sha256[:10]
    assert cm["metadata"]["annotations"]["kimi-deploy/sync-program-sha256"] == artifact.sha256
    assert cm["metadata"]["annotations"]["kimi-deploy/sync-program-bytes"] == str(len(artifact.data))
    for obj in of_kind(run, "Job"):
        pod = obj["spec"]["template"]["spec"]
        assert {"name": "sync-program", "configMap": {"name": cm["metadata"]["name"], "defaultMode": 0o444}} in pod["volumes"]
        assert pod["containers"][0]["image"] == run.context.vllm.image  # the pinned vLLM image, no extra image


def test_publish_job_uses_the_mirror_bucket_and_stages_on_nvme():
    run = plan_for("gb300")
    pod = run.named("weight-sync-publish-mirror").inputs["spec"]["template"]["spec"]
    argv = pod["containers"][0]["command"]
    dest = argv[argv.index("--dest") + 1]
    assert dest == run.outputs["mirrorUri"]  # the AWS edge's bucket, not the plan-time stand-in
    assert argv[-2:] == ["--staging-dir", "/models/.kimi-deploy-staging"]
    nvme = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/models/.kimi-deploy-staging"]
    assert len(nvme) == 1  # the node's NVMe holds the staged files, not the root disk
    host = {v["name"]: v for v in pod["volumes"]}[nvme[0]["name"]]
    # Its own staging directory, never the array (kubelet and containerd state) nor the weights.
    assert host["hostPath"] == {"path": "/mnt/k8s-disks/0/kimi-deploy/staging", "type": "DirectoryOrCreate"}
    assert not [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/models"]
    assert pod["serviceAccountName"] == "kimi-mirror-publish"
    copy = vllm_pods(run)["leader"]["spec"]["initContainers"][0]["command"]
    assert copy[copy.index("--source") + 1] == dest  # the node copy reads the mirror just published


def test_wait_for_weights_init_container():
    # A shared claim (pvc) is filled once by a Job; its pods wait until the copy is complete (marker,
    # manifest and every listed file: tests/test_weights_complete.py runs the gate).
    storage = {"kind": "pvc", "existingClaim": "kimi-weights", "readGBps": 4, "mirror": {"enabled": False}}
    run = plan_for("mi355x", overrides={"kimi-deploy:storage": storage})
    assert run.named("weight-sync-node-copy")
    for pod in vllm_pods(run).values():
        init = pod["spec"]["initContainers"][0]
        assert init["command"][:2] == ["python3", "-c"] and "weight_sync.ready import main" in init["command"][2]
        assert init["command"][3:5] == [SYNC_SCRIPT_PATH, run.context.vllm.model_path]
        assert int(init["command"][5]) >= 1800
        assert {"name": "sync-program", "mountPath": "/opt/kimi-deploy", "readOnly": True} in init["volumeMounts"]
        assert any(v["name"] == "sync-program" for v in pod["spec"]["volumes"])


class _ModelsHandler(http.server.BaseHTTPRequestHandler):
    key = "sk-probe"
    models = ["kimi-k3.1-pro"]

    def do_GET(self):  # noqa: N802
        if self.path != "/v1/models":
            self.send_response(404)
            self.end_headers()
            return
        if self.headers.get("Authorization") != f"Bearer {self.key}":
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({"object": "list", "data": [{"id": m} for m in self.models]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    "key, name, ok", [("sk-probe", "kimi-k3.1-pro", True), ("wrong", "kimi-k3.1-pro", False), ("sk-probe", "other", False)]
)
def test_readiness_script_against_an_authenticated_models_endpoint(key, name, ok):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ModelsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        proc = subprocess.run(
            [sys.executable, "-c", vllm_service.READINESS_SCRIPT, str(port), name],
            env={"VLLM_API_KEY": key, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60,
        )
    finally:
        server.shutdown()
    assert (proc.returncode == 0) == ok, proc.stderr


# -- add-ons ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, expected", [
    ("b300-prod", ["nvidia-device-plugin"]),
    ("gb300", ["nvidia-device-plugin", "nvidia-dra-driver", "lws"]),
    # the stack lists amd-gpu-operator as installed; KEDA and the AMD exporter for autoscaling/observability
    ("mi355x", ["keda", "amd-metrics-exporter"]),
])
def test_addons_are_pinned_helm_releases_of_what_the_target_needs(name, expected):
    run = plan_for(name)
    releases = {r.name.removeprefix("addon-"): r.inputs for r in run.of_type(HELM_RELEASE)}
    assert list(releases) == expected and run.outputs["kubernetesAddons"] == expected
    for addon, inputs in releases.items():
        chart = HELM_CHARTS[addon]
        assert inputs["chart"] == chart.chart and inputs["version"] == chart.version
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", chart.version)
        assert inputs["namespace"] == chart.namespace and inputs["createNamespace"] is True
        assert (inputs.get("repositoryOpts") or {}).get("repo") == chart.repository
        assert inputs["values"] == k8s_addons.addon_values(run.context.spec, addon)


def test_gpu_addons_tolerate_and_select_the_gpu_nodes():
    from tests.test_aws_resources import EFA_OVERRIDES

    run = plan_for("gb300", overrides=EFA_OVERRIDES)
    values = {r.name.removeprefix("addon-"): r.inputs["values"] for r in run.of_type(HELM_RELEASE)}
    taint = {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
    assert taint in values["nvidia-device-plugin"]["tolerations"]
    assert taint in values["efa-device-plugin"]["tolerations"]
    assert taint in values["nvidia-dra-driver"]["kubeletPlugin"]["tolerations"]
    assert values["efa-device-plugin"]["supportedInstanceLabels"]["values"] == ["p6e-gb300.36xlarge"]
    dra = values["nvidia-dra-driver"]
    assert dra["resources"] == {"gpus": {"enabled": False}, "computeDomains": {"enabled": True}}
    terms = values["nvidia-device-plugin"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    exprs = {e["key"]: e["values"] for e in terms[0]["matchExpressions"]}
    assert exprs["kimi-deploy/gpu-node"] == ["true"] and exprs["kubernetes.io/arch"] == ["arm64"]


def test_installed_addons_are_not_installed_again():
    run = plan_for("gb300", overrides=with_k8s("gb300", installedAddons=["lws", "nvidia-gpu-operator"]))
    names = [r.name.removeprefix("addon-") for r in run.of_type(HELM_RELEASE)]
    assert names == ["nvidia-dra-driver"]
    assert one(run, "LeaderWorkerSet")  # still declared: the controller is already there


def test_amd_device_plugin_when_no_amd_operator_is_installed():
    run = plan_for("mi355x", overrides=with_k8s("mi355x", installedAddons=["prometheus-operator"]))
    (release,) = [r for r in run.of_type(HELM_RELEASE) if r.name == "addon-amd-device-plugin"]
    assert release.name == "addon-amd-device-plugin" and release.inputs["chart"] == "amd-gpu"
    assert {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in release.inputs["values"]["tolerations"]


def test_unknown_installed_addon_is_a_config_error():
    with pytest.raises(ConfigError, match="kubernetes.installedAddons: 'gpu-operater' is not a known add-on"):
        plan_for("mi355x", overrides=with_k8s("mi355x", installedAddons=["gpu-operater"]))


# -- storage, service, policy, scraping, labels -----------------------------------------------------


def test_fsx_static_volume_and_claim():
    run = plan_for("b300-prod", overrides=B300_PROD_FSX)
    pv, pvc = one(run, "PersistentVolume"), one(run, "PersistentVolumeClaim")
    csi = pv["spec"]["csi"]
    assert csi["driver"] == "fsx.csi.aws.com" and csi["volumeHandle"] == run.outputs["fsxFileSystemId"]
    assert set(csi["volumeAttributes"]) == {"dnsname", "mountname"}
    assert pv["spec"]["accessModes"] == ["ReadWriteMany"] == pvc["spec"]["accessModes"]
    assert pv["spec"]["mountOptions"] == ["flock"] and pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"] and pv["spec"]["claimRef"]["name"] == pvc["metadata"]["name"]
    assert pv["spec"]["capacity"]["storage"] == f"{run.context.sizing.storage.fsx_capacity_gib}Gi"
    copy = vllm_pods(run)["server"]["spec"]["initContainers"][0]
    assert {"name": "fsx", "mountPath": "/fsx", "readOnly": True} in copy["volumeMounts"]
    # vLLM serves from the node's NVMe copy, not from FSx.
    server = vllm_pods(run)["server"]["spec"]
    weights = [v for v in server["volumes"] if v["name"] == "weights"][0]
    assert weights["hostPath"]["path"] == "/mnt/k8s-disks/0/kimi-deploy/weights"


def test_node_local_host_path_follows_platform():
    pod = vllm_pods(plan_for("mi355x"))["server"]["spec"]
    weights = next(v for v in pod["volumes"] if v["name"] == "weights")
    assert weights["hostPath"] == {"path": "/mnt/nvme/kimi-deploy/weights", "type": "DirectoryOrCreate"}
    assert pod["nodeSelector"]["amd.com/gpu.product-name"] == "AMD_Instinct_MI355X"
    assert {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_service_types():
    nlb = one(plan_for("b300-prod"), "Service")
    assert nlb["spec"]["type"] == "LoadBalancer" and nlb["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8"]
    assert nlb["metadata"]["annotations"]["service.beta.kubernetes.io/aws-load-balancer-internal"] == "true"
    assert "loadBalancerHostname" in plan_for("b300-prod").outputs
    for name in ("gb300", "mi355x"):
        svc = one(plan_for(name), "Service")
        assert svc["spec"]["type"] == "ClusterIP" and "loadBalancerSourceRanges" not in svc["spec"]
        assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]


@pytest.mark.parametrize("name", K8S_STACKS)
def test_network_policy_admits_only_configured_peers_to_the_api_port(name):
    run = plan_for(name)
    spec = run.context.spec
    policy = one(run, "NetworkPolicy")["spec"]
    api_rule = policy["ingress"][0]
    assert api_rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    namespaces = [p for p in api_rule["from"] if "namespaceSelector" in p]
    cidrs = [p["ipBlock"]["cidr"] for p in api_rule["from"] if "ipBlock" in p]
    allowed_ns = list(spec.config.kubernetes.allowed_namespaces)
    if allowed_ns:
        assert namespaces[0]["namespaceSelector"]["matchExpressions"][0]["values"] == allowed_ns
    else:
        assert not namespaces
    vpc_cidrs = spec.config.network.allowed_cidrs if spec.profile.provisions_aws else ()
    expected = list(dict.fromkeys(spec.config.kubernetes.allowed_cidrs + vpc_cidrs))
    assert cidrs == expected and "0.0.0.0/0" not in cidrs
    group_rules = [r for r in policy["ingress"] if "ports" not in r]
    assert len(group_rules) == (1 if spec.nodes_per_copy > 1 else 0)
    assert policy["policyTypes"] == ["Ingress"]


def test_pod_monitor_with_the_operator_annotations_only_for_a_prometheus_that_reads_them():
    run = plan_for("mi355x")  # the stack lists prometheus-operator as installed
    monitor = one(run, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["podMetricsEndpoints"][0] == {"port": "http", "path": "/metrics", "interval": "30s"}
    assert "annotations" not in vllm_pods(run)["server"]["metadata"]
    # no operator: the scaler must be pointed at a Prometheus that reads prometheus.io/* annotations
    observability = {**read_stack_config("mi355x")["kimi-deploy:observability"],
                     "prometheusUrl": "http://prometheus-server.monitoring.svc:80"}
    annotated = plan_for("mi355x", overrides={**with_k8s("mi355x", installedAddons=["amd-gpu-operator"]),
                                              "kimi-deploy:observability": observability})
    notes = vllm_pods(annotated)["server"]["metadata"]["annotations"]
    assert [notes[f"prometheus.io/{k}"] for k in ("scrape", "port", "path")] == ["true", "8000", "/metrics"]
    assert not of_kind(annotated, "PodMonitor") and not of_kind(annotated, "PrometheusRule")
    # no Prometheus at all (b300-prod as shipped): neither
    plain = plan_for("b300-prod")
    notes = vllm_pods(plain)["server"]["metadata"].get("annotations", {})
    assert not of_kind(plain, "PodMonitor") and not [k for k in notes if k.startswith("prometheus.io/")]


@pytest.mark.parametrize("name", K8S_STACKS)
def test_app_kubernetes_io_labels_and_valid_label_values(name):
    run = plan_for(name)
    for res in k8s_objects(run):
        meta = res.inputs["metadata"]
        for key in ("name", "instance", "component", "part-of", "managed-by", "version"):
            assert f"app.kubernetes.io/{key}" in meta["labels"], f"{res.name}: {key}"
        for value in meta["labels"].values():
            assert LABEL_VALUE_RE.match(value) and len(value) <= 63, f"{res.name}: {value!r}"
    for _, pod in pod_templates(run):
        for value in pod["metadata"]["labels"].values():
            assert LABEL_VALUE_RE.match(value), value
    workload = (of_kind(run, "Deployment") + of_kind(run, "LeaderWorkerSet"))[0]
    assert workload["metadata"]["annotations"].get("kimi-deploy/expires-at") == run.outputs.get("expiresAt")
    assert workload["metadata"]["annotations"]["kimi-deploy/stack"] == name


@pytest.mark.parametrize("name", K8S_STACKS)
def test_pod_disruption_budget_never_blocks_node_replacement(name):
    """One pod evicted at a time (replicas 2 in b300-prod; 1 in gb300 and mi355x): a budget of 0
    for a single copy would make every managed node-group update fail with PodEvictionFailure
    (the GPU node group cannot surge); not-ready pods (a recreated group) are always evictable."""
    run = plan_for(name)
    pdb = one(run, "PodDisruptionBudget")["spec"]
    assert pdb["maxUnavailable"] == 1
    assert pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert "minAvailable" not in pdb
    roles = ["leader", "worker"] if of_kind(run, "LeaderWorkerSet") else ["server"]
    assert pdb["selector"]["matchExpressions"][0]["values"] == roles
