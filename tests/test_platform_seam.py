"""The platform seam: one ``PlatformProfile`` per platform (pure facts), a typed
``KubernetesPlatformHandle`` between the platform modules and the Kubernetes edge, and no
platform-name checks left in the components.

The edge is declared here from a handle built in the test, under Pulumi's mocks, with no AWS
edge at all: every value that differs by platform must come from the handle.
"""

from __future__ import annotations

import json
import re
from dataclasses import astuple
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pytest

from components import program
from components.context import DeploymentContext
from components.core.config import read_stack_config
from components.core.naming import MIRROR_PUBLISH_SERVICE_ACCOUNT, WEIGHT_SYNC_SERVICE_ACCOUNT
from components.core.node_storage import node_dirs
from components.core.platforms import PLATFORM_PROFILES, platform_profile
from components.core.targets import PLATFORMS
from components.plan_engine import PlanRun, run_program
from tests.conftest import B300_PROD_FSX, FIXED_NOW, STACKS, TEST_SECRETS, plan_for

REPO_ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = REPO_ROOT / "components"
# The only modules that may compare platform names: the check that the platform is one the
# target offers (a value check on data) and the profile registry. Everything else, the config
# checks included, asks profile fields (``spec.profile`` / ``platform_profile(raw.platform)``).
ALLOWED = {COMPONENTS / "core" / "config" / "target.py", COMPONENTS / "core" / "platforms.py"}
PLATFORM_CHECK = re.compile(
    r"""platform\s*(==|!=)|platform\s+(not\s+)?in\b|platform\.startswith|\bis_aws\b|\buses_kubernetes\b"""
    r"""|(==|!=)\s*["'](aws-ec2|aws-eks|kubernetes)["']"""
)


# -- the profile registry ----------------------------------------------------------------------


def test_every_allowed_platform_has_a_profile_and_a_declare_function():
    assert set(PLATFORM_PROFILES) == set(PLATFORMS)
    assert set(program.PLATFORM_DECLARERS) == set(PLATFORMS)
    for name in PLATFORMS:
        assert platform_profile(name).name == name


def test_an_unknown_platform_names_the_known_ones():
    with pytest.raises(KeyError, match="unknown platform 'gcp-gke'.*aws-ec2, aws-eks, kubernetes"):
        platform_profile("gcp-gke")


def test_profile_facts_hang_together():
    for profile in PLATFORM_PROFILES.values():
        # A stack that creates its cluster labels its GPU nodes and mounts their NVMe itself.
        assert profile.creates_cluster == profile.labels_gpu_nodes == (profile.nvme_host_path is not None)
        # Things that exist only on a cluster the stack makes in AWS.
        for fact in (profile.efa_to_pods, profile.fsx_available, profile.cluster_autoscaler):
            assert not fact or (profile.creates_cluster and profile.provisions_aws)
        # Exactly one way to serve: systemd on an instance, or Kubernetes.
        assert profile.serves_under_systemd != profile.runs_kubernetes
        assert (profile.service_exposure == "kubernetes-service") == profile.runs_kubernetes


# -- no platform checks outside the registry ---------------------------------------------------


def platform_checks(root: Path = COMPONENTS) -> list[str]:
    """``path:line: text`` of every platform-name comparison in ``root`` outside ``ALLOWED``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path in ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if PLATFORM_CHECK.search(code):
                found.append(f"{path.relative_to(root.parent)}:{number}: {line.strip()}")
    return found


def test_no_platform_name_checks_remain_in_components():
    assert platform_checks() == []


@pytest.mark.parametrize(
    "line",
    [
        'if spec.platform == "aws-eks":',
        "if spec.is_aws:",
        "on = spec.uses_kubernetes",
        'if raw.platform in ("aws-eks", "kubernetes"):',
        'x = spec.platform.startswith("aws-")',
        'if name != "kubernetes":',
    ],
)
def test_the_scan_catches_each_kind_of_check(tmp_path, line):
    (tmp_path / "mod.py").write_text(f"def f(spec, raw, name):\n    {line}\n    return spec.platform_profile\n")
    assert platform_checks(tmp_path) == [f"{tmp_path.name}/mod.py:2: {line}"]


# -- the profile against what each stack's plan declares -----------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_each_stack_declares_what_its_profile_says(stack):
    run = plan_for(stack)
    profile = platform_profile(run.context.spec.platform)
    types = {r.type for r in run.resources}
    assert any(t.startswith("aws:") for t in types) == profile.provisions_aws
    assert ("aws:eks/cluster:Cluster" in types) == profile.creates_cluster
    assert ("kimi-deploy:k8s:Workloads" in types) == profile.runs_kubernetes
    assert ("aws:ec2/instance:Instance" in types) == profile.serves_under_systemd
    assert ("privateEndpoint" in run.outputs) == (profile.service_exposure == "instance-private-endpoint")
    assert ("serviceUrl" in run.outputs) == (profile.service_exposure == "kubernetes-service")
    releases = {r.name for r in run.resources if r.type == "kubernetes:helm.sh/v3:Release"}
    if "addon-cluster-autoscaler" in releases:
        assert profile.cluster_autoscaler


# -- the Kubernetes edge from a handle built here, without an AWS result ------------------------

HANDLE_BUCKET = "handle-test-bucket"
HANDLE_FSX_ID = "fs-0handle0test00001"
HANDLE_NVME = "/mnt/handle-test-nvme"
HANDLE_SELECTOR = {"pool.example.com/gpu": "b300", "kubernetes.io/arch": "amd64"}
HANDLE_TOLERATIONS = ({"key": "example.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)
HANDLE_CIDRS = ("10.99.0.0/16",)


def run_edge_only(monkeypatch, stack: str = "b300-prod", overrides: dict | None = None, **handle_changes: Any) -> PlanRun:
    """Run ``stack``'s program with ``program.declare`` replaced by: build a handle here, call
    ``declare_workloads(ctx, handle)``. No AWS component is declared."""
    from components.k8s import declare_workloads
    from components.platform import FsxVolumeSource, GpuPlacement, KubernetesPlatformHandle, ServiceAccess

    def declare(ctx: DeploymentContext) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "profile": platform_profile(ctx.spec.platform),
            "provider": k8s.Provider("test-cluster"),
            "placement": GpuPlacement(HANDLE_SELECTOR, HANDLE_TOLERATIONS, HANDLE_NVME),
            "service_access": ServiceAccess("internal-nlb", HANDLE_CIDRS),
            "mirror_bucket": pulumi.Output.from_input(HANDLE_BUCKET),
            "fsx": FsxVolumeSource(HANDLE_FSX_ID, "fs-test.fsx.example", "abcdefgh", 2400),
        }
        fields.update(handle_changes)
        return declare_workloads(ctx, KubernetesPlatformHandle(**fields)).outputs

    monkeypatch.setattr(program, "declare", declare)
    return run_program({**read_stack_config(stack), **(overrides or {})}, stack=stack, secrets=TEST_SECRETS, now=FIXED_NOW,
                       allow_blockers=True)


def pod_specs(run: PlanRun) -> list[dict[str, Any]]:
    """Pod specs of the vLLM workload and the sync Jobs."""
    out = []
    for res in run.resources:
        inputs = json.loads(json.dumps(dict(res.inputs)))
        kind = inputs.get("kind")
        if kind == "LeaderWorkerSet":
            tpl = inputs["spec"]["leaderWorkerTemplate"]
            out += [tpl["leaderTemplate"]["spec"], tpl["workerTemplate"]["spec"]]
        elif kind in ("Deployment", "Job"):
            out.append(inputs["spec"]["template"]["spec"])
    return out


def test_the_edge_is_declared_from_a_handle_alone(monkeypatch):
    run = run_edge_only(monkeypatch)
    types = {r.type for r in run.resources}
    assert not [t for t in types if t.startswith("aws:") or t.startswith("kimi-deploy:aws:")]
    assert "kimi-deploy:k8s:Workloads" in types
    pods = pod_specs(run)
    assert len(pods) >= 2
    for pod in pods:
        assert pod["nodeSelector"] == HANDLE_SELECTOR
        assert pod["tolerations"] == [dict(t) for t in HANDLE_TOLERATIONS]
        host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        assert host_paths <= set(astuple(node_dirs(HANDLE_NVME)))
    assert any(node_dirs(HANDLE_NVME).weights == v["hostPath"]["path"] for pod in pods for v in pod["volumes"] if "hostPath" in v)
    pv = next(r for r in run.resources if r.type == "kubernetes:core/v1:PersistentVolume")
    assert pv.inputs["spec"]["csi"]["volumeHandle"] == HANDLE_FSX_ID
    assert pv.inputs["spec"]["capacity"]["storage"] == "2400Gi"
    policy = next(r for r in run.resources if r.type == "kubernetes:networking.k8s.io/v1:NetworkPolicy")
    peers = [p["ipBlock"]["cidr"] for rule in policy.inputs["spec"]["ingress"] for p in rule.get("from", []) if "ipBlock" in p]
    assert peers == list(HANDLE_CIDRS)
    assert HANDLE_BUCKET in json.dumps([dict(r.inputs) for r in run.resources])
    accounts = {r.inputs["metadata"]["name"] for r in run.resources if r.type == "kubernetes:core/v1:ServiceAccount"}
    assert MIRROR_PUBLISH_SERVICE_ACCOUNT in accounts
    release = next(r for r in run.resources if r.name == "addon-nvidia-device-plugin")
    terms = release.inputs["values"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = {e["key"]: e["values"] for e in terms["nodeSelectorTerms"][0]["matchExpressions"]}
    assert keys == {k: [v] for k, v in HANDLE_SELECTOR.items()}
    assert "loadBalancerHostname" in run.outputs  # the handle's service access says internal-nlb


def test_a_handle_without_the_fsx_the_storage_needs_is_refused(monkeypatch):
    with pytest.raises(Exception, match="storage.kind nvme-from-fsx: the platform handle has no fsx"):
        run_edge_only(monkeypatch, overrides=B300_PROD_FSX, fsx=None)


def test_a_handle_without_a_mirror_on_aws_is_refused(monkeypatch):
    with pytest.raises(Exception, match="mirror is enabled but the platform handle has no mirror_bucket"):
        run_edge_only(monkeypatch, mirror_bucket=None)


def test_a_handle_for_another_platform_is_refused(monkeypatch):
    with pytest.raises(Exception, match="handle is for platform kubernetes, the spec's is aws-eks"):
        run_edge_only(monkeypatch, profile=platform_profile("kubernetes"))


def test_a_pod_identity_role_for_an_account_the_edge_does_not_create_is_refused(monkeypatch):
    roles = {WEIGHT_SYNC_SERVICE_ACCOUNT: pulumi.Output.from_input("arn:aws:iam::1:role/a"),
             "not-created": pulumi.Output.from_input("arn:aws:iam::1:role/b")}
    with pytest.raises(Exception, match=r"service accounts the workloads do not create: \['not-created'\]"):
        run_edge_only(monkeypatch, pod_identity_roles=roles)


# -- the handles the platform modules build ------------------------------------------------------


def test_the_eks_handle_places_pods_on_the_node_groups_it_labels_and_taints():
    """The AWS edge's handle selects exactly the labels its GPU node group carries and tolerates
    its taint (components/aws/cluster.py), on the NVMe path nodeadm mounts."""
    from components.aws.cluster import gpu_node_labels
    from components.core.naming import GPU_TAINT_KEY, NVME_RAID0_HOST_PATH
    from components.k8s.common import gpu_placement

    spec = plan_for("b300-prod").context.spec
    placement = gpu_placement(spec)
    assert gpu_node_labels(spec).items() <= placement.node_selector.items()
    assert {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in [dict(t) for t in placement.tolerations]
    assert placement.nvme_host_path == NVME_RAID0_HOST_PATH


def test_the_existing_cluster_handle_uses_only_config():
    from components.core.naming import GPU_NODE_LABEL, GPU_TAINT_KEY
    from components.k8s.common import gpu_placement, service_access

    spec = plan_for("mi355x").context.spec
    k8s_cfg = spec.config.kubernetes
    placement = gpu_placement(spec)
    assert GPU_NODE_LABEL not in placement.node_selector
    assert GPU_TAINT_KEY not in {t["key"] for t in placement.tolerations}
    assert placement.nvme_host_path == k8s_cfg.nvme_host_path
    assert placement.node_selector.items() >= dict(k8s_cfg.node_selector).items()
    # network.allowedCidrs describe an AWS VPC's clients: not used on an existing cluster.
    assert service_access(spec).client_cidrs == tuple(dict.fromkeys(k8s_cfg.allowed_cidrs))
