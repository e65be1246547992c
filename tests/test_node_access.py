"""Least access on the node and policies that say what they mean:

- no pod mounts a host path holding kubelet, containerd or log state (on EKS with nodeadm RAID0
  the array root holds them: components/core/node_storage.py, from the AMI's setup-local-disks);
  weights, staging and engine caches are dedicated directories, the weights read-write only in the
  weight writer;
- the NetworkPolicy's address blocks never admit an address of the cluster's own nodes and pods;
- every EKS node answers IMDS to one hop only (no pod reaches the node role);
- the EKS API endpoint is public only to named CIDRs, never to any address, private otherwise,
  and the plan says which.
"""

from __future__ import annotations

import ipaddress
from dataclasses import astuple
from typing import Any

import pytest

from components.aws.network import subnet_cidrs
from components.core.config import read_stack_config
from components.core.errors import ConfigError
from components.core.node_storage import RAID0_BIND_MOUNTS, exposed_node_state, node_dirs, node_state_paths
from tests.conftest import TEST_DEPLOYER_CIDR, plan_for
from tests.test_k8s_workloads import of_kind, one, pod_templates

# Storage kinds on top of each stack's own (b300-prod ships nvme-from-fsx; the others nvme).
STORAGE_VARIANTS = [
    ("b300-prod", None), ("b300-prod", "nvme"), ("b300-prod", "fsx"), ("gb300", None), ("mi355x", None),
    ("mi355x", "pvc"),
]
# Containers that write the weights (the weight sync; a Job for a shared claim).
WEIGHT_WRITERS = {"weight-sync"}


def _run(name: str, kind: str | None):
    if kind is None:
        return plan_for(name)
    storage = {**read_stack_config(name).get("kimi-deploy:storage", {}), "kind": kind}
    if kind == "pvc":
        storage.update(existingClaim="models", readGBps=2.0)
    return plan_for(name, overrides={"kimi-deploy:storage": storage})


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]


# -- host paths ------------------------------------------------------------------------------------


def test_the_array_root_itself_exposes_kubelet_containerd_and_pod_logs():
    """The facts the rule rests on (awslabs/amazon-eks-ami v20260724 setup-local-disks maybe_raid:
    <array>/<basename of each bind mount>), and what a hostPath of the array root (the volume these
    pods had) hands a pod."""
    root = "/mnt/k8s-disks/0"
    assert RAID0_BIND_MOUNTS == {
        "/var/lib/kubelet": "kubelet", "/var/lib/containerd": "containerd",
        "/var/lib/soci-snapshotter-grpc": "soci-snapshotter-grpc", "/var/log/pods": "pods",
    }
    assert {f"{root}/kubelet", f"{root}/containerd", f"{root}/pods"} <= set(node_state_paths(root))
    assert exposed_node_state(root, root) == "/mnt/k8s-disks/0/kubelet"
    assert exposed_node_state("/", root) is not None and exposed_node_state("/var/lib/kubelet/pods/x", root)
    for path in astuple(node_dirs(root)):
        assert exposed_node_state(path, root) is None


@pytest.mark.parametrize(("name", "kind"), STORAGE_VARIANTS)
def test_no_pod_mounts_node_state_and_each_host_path_is_a_dedicated_directory(name, kind):
    run = _run(name, kind)
    root = run.context.spec.profile.nvme_host_path or run.context.spec.config.kubernetes.nvme_host_path
    dedicated = set(astuple(node_dirs(root)))
    seen = set()
    for role, pod in pod_templates(run):
        for volume in pod["spec"].get("volumes", []):
            if "hostPath" not in volume:
                continue
            path = volume["hostPath"]["path"]
            assert exposed_node_state(path, root) is None, f"{name}/{role}: hostPath {path} exposes node state"
            assert path in dedicated, f"{name}/{role}: hostPath {path} is not one of kimi-deploy's directories"
            assert volume["hostPath"]["type"] == "DirectoryOrCreate"
            seen.add(path)
    if run.context.spec.config.storage.kind in ("nvme", "nvme-from-fsx"):
        assert node_dirs(root).weights in seen


@pytest.mark.parametrize(("name", "kind"), STORAGE_VARIANTS)
def test_only_the_weight_writer_mounts_the_weights_read_write(name, kind):
    run = _run(name, kind)
    for role, pod in pod_templates(run):
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        for container in _containers(pod):
            for mount in container.get("volumeMounts", []):
                volume = volumes[mount["name"]]
                host = (volume.get("hostPath") or {}).get("path", "")
                claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
                writes = not mount.get("readOnly")
                where = f"{name}/{role}/{container['name']}: {mount['mountPath']}"
                if host.endswith("/weights") or mount["name"] in ("weights", "fsx") or claim:
                    assert not writes or container["name"] in WEIGHT_WRITERS, f"{where} writes the weights"
                if host.endswith("/staging"):
                    assert "publish-mirror" in role, f"{where}: only the publish Job stages"
                if host.endswith("/engine-cache"):
                    assert container["name"] in ("engine-cache-restore", "engine-cache-save", "vllm"), where


def test_a_node_state_directory_is_refused_as_the_nvme_host_path():
    k8s = {**read_stack_config("mi355x")["kimi-deploy:kubernetes"], "nvmeHostPath": "/var/lib/kubelet/nvme"}
    with pytest.raises(ConfigError, match=r"kubernetes.nvmeHostPath: '/var/lib/kubelet/nvme' lies in the node's own "
                                          r"state at /var/lib/kubelet"):
        plan_for("mi355x", overrides={"kimi-deploy:kubernetes": k8s})


# -- NetworkPolicy address blocks ---------------------------------------------------------------------


def _admits(peer: dict[str, Any], address: str) -> bool:
    block = peer.get("ipBlock")
    if block is None:
        return False
    ip = ipaddress.ip_address(address)
    return ip in ipaddress.ip_network(block["cidr"]) and not any(ip in ipaddress.ip_network(e) for e in block.get("except", []))


def _node_subnets(run) -> list[str]:
    """The subnets an EKS stack's nodes (and with vpc-cni its pods) take addresses from."""
    cidrs = subnet_cidrs(run.context.spec.config.network.vpc_cidr)
    return [cidrs["private-gpu"], cidrs["private-second"]]


@pytest.mark.parametrize("name", ["b300-prod", "gb300"])
def test_network_policy_address_blocks_never_admit_a_pod_of_the_cluster(name):
    run = plan_for(name)
    policy = one(run, "NetworkPolicy")["spec"]
    peers = [p for rule in policy["ingress"] for p in rule.get("from", [])]
    blocks = [p for p in peers if "ipBlock" in p]
    assert blocks, f"{name}: no address block to check"
    for subnet in _node_subnets(run):
        net = ipaddress.ip_network(subnet)
        for address in (net[4], net[net.num_addresses // 2], net[-2]):  # pod and node addresses of the subnet
            assert not any(_admits(p, str(address)) for p in peers), f"{name}: {address} ({subnet}) admitted"
    # Clients elsewhere in the configured blocks still are.
    assert any(_admits(p, "10.200.0.10") for p in peers)


def test_a_client_block_inside_the_cluster_ranges_is_left_out():
    from components.k8s.vllm_service import client_ip_blocks

    blocks = client_ip_blocks(("10.0.0.0/8", "10.44.0.0/24", "192.168.0.0/16"), ("10.44.0.0/20", "10.44.16.0/20"))
    assert blocks == [
        {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.44.0.0/20", "10.44.16.0/20"]}},
        {"ipBlock": {"cidr": "192.168.0.0/16"}},
    ]


def test_existing_vpc_blocks_except_the_looked_up_subnets():
    net = {"vpcId": "vpc-0123456789abcdef0", "privateSubnetIds": ["subnet-0aaaaaaaaaaaaaaa0", "subnet-0bbbbbbbbbbbbbbb0"],
           "allowedCidrs": ["10.0.0.0/8"], "apiServerPublicCidrs": [TEST_DEPLOYER_CIDR]}
    run = plan_for("b300-prod", overrides={"kimi-deploy:network": net})
    assert "aws:ec2/getSubnet:getSubnet" in run.calls
    block = next(p["ipBlock"] for p in one(run, "NetworkPolicy")["spec"]["ingress"][0]["from"] if "ipBlock" in p)
    assert block["cidr"] == "10.0.0.0/8" and len(block["except"]) == 2
    assert all(ipaddress.ip_network(e).subnet_of(ipaddress.ip_network("10.0.0.0/8")) for e in block["except"])


def test_existing_cluster_blocks_except_its_pod_and_node_ranges():
    k8s = {**read_stack_config("mi355x")["kimi-deploy:kubernetes"], "allowedCidrs": ["10.0.0.0/8"]}
    with pytest.raises(ConfigError, match=r"kubernetes.clusterCidrs: \[\] is required with kubernetes.allowedCidrs"):
        plan_for("mi355x", overrides={"kimi-deploy:kubernetes": k8s})
    k8s["clusterCidrs"] = ["10.244.0.0/16", "10.0.16.0/20"]
    run = plan_for("mi355x", overrides={"kimi-deploy:kubernetes": k8s})
    peers = [p for rule in one(run, "NetworkPolicy")["spec"]["ingress"] for p in rule.get("from", [])]
    assert not _admits(next(p for p in peers if "ipBlock" in p), "10.244.3.7")
    assert _admits(next(p for p in peers if "ipBlock" in p), "10.1.2.3")


def test_cluster_cidrs_are_refused_where_the_stack_knows_its_subnets():
    k8s = {**read_stack_config("gb300")["kimi-deploy:kubernetes"], "clusterCidrs": ["10.244.0.0/16"]}
    with pytest.raises(ConfigError, match=r"kubernetes.clusterCidrs: \['10.244.0.0/16'\] is read only on kubernetes"):
        plan_for("gb300", overrides={"kimi-deploy:kubernetes": k8s})


# -- IMDS -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["b300-prod", "gb300"])
def test_every_eks_node_answers_imds_to_one_hop_only(name):
    run = plan_for(name)
    templates = run.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert {t.name for t in templates} >= {"eks-system-lt", "eks-gpu-lt"}
    for template in templates:
        options = template.inputs["metadataOptions"]
        assert options["httpTokens"] == "required", template.name
        assert options["httpPutResponseHopLimit"] == 1, f"{name}: {template.name} lets pods reach the node role"


# -- the EKS API endpoint --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("network", "public", "summary"),
    [
        ({"apiServerPublicCidrs": ["198.51.100.7/32"]}, True,
         "public endpoint, allowed from 198.51.100.7/32 (network.apiServerPublicCidrs)"),
        ({"apiServerPublicCidrs": ["1.2.3.4/32"], "apiServerPrivateCidrs": ["10.8.0.0/16"]}, True,
         "public endpoint, allowed from 1.2.3.4/32 (network.apiServerPublicCidrs); private endpoint from 10.8.0.0/16 on "
         "443 (network.apiServerPrivateCidrs)"),
        ({"apiServerAccess": "private", "vpcId": "vpc-0123456789abcdef0", "privateSubnetIds": ["subnet-0123456789abcdef0"],
          "apiServerPrivateCidrs": ["10.8.0.0/16"]}, False,
         "private endpoint only, from 10.8.0.0/16 on 443 of the cluster security group (network.apiServerPrivateCidrs), "
         "in vpc-0123456789abcdef0"),
    ],
)
def test_the_plan_says_how_the_kubernetes_provider_reaches_the_cluster(network, public, summary, tmp_path, monkeypatch):
    import yaml

    from components.core.config.stack_file import CONFIG_OVERLAY_ENV
    from scripts.ops.plan import build_plan_document, render_markdown, summary_rows
    from tests.conftest import TEST_ENGINE_TAG

    # The network as written here, not the tests' stand-in source (conftest.py).
    monkeypatch.setenv(CONFIG_OVERLAY_ENV, '{"kimi-deploy:vllm": {"imageTag": "' + TEST_ENGINE_TAG + '"}}')

    config = dict(read_stack_config("gb300"))
    net = {k: v for k, v in config["kimi-deploy:network"].items() if not k.startswith("apiServer")}
    config["kimi-deploy:network"] = {**net, **network}
    (tmp_path / "Pulumi.gb300.yaml").write_text(yaml.safe_dump({"config": config}))
    doc = build_plan_document("gb300", stacks_dir=tmp_path)
    api = doc["kubernetes_api"]
    assert api["summary"] == summary and api["endpoint_public_access"] is public
    assert api["public_access_cidrs"] == network.get("apiServerPublicCidrs", [])
    assert api["cluster_security_group_443_from"] == network.get("apiServerPrivateCidrs", [])
    # One line in the table; the full path (who can run up, preview, destroy, the sweeper) in --details.
    short = summary_rows(doc, details=False)
    assert ("Kubernetes API", summary) in short and not any(label == "API path" for label, _ in short)
    paths = [text for label, text in summary_rows(doc, details=True) if label == "API path"]
    assert paths == api["path"] and any("`pulumi destroy` and the sweeper" in p for p in paths)
    assert f"| Kubernetes API | {summary} |" in render_markdown(doc)
    vpc = next(r for r in doc["resources"] if r["name"] == "eks-cluster")["inputs"]["vpcConfig"]
    assert vpc["endpointPrivateAccess"] is True and vpc["endpointPublicAccess"] is public
    assert vpc.get("publicAccessCidrs", []) == network.get("apiServerPublicCidrs", [])
    assert "0.0.0.0/0" not in str(vpc)


def test_plans_off_eks_name_no_eks_endpoint():
    from scripts.ops.plan import build_plan_document

    assert build_plan_document("b300")["kubernetes_api"] is None  # aws-ec2: no Kubernetes object
    api = build_plan_document("mi355x")["kubernetes_api"]
    assert api["mode"] == "kubeconfig" and "kimi-deploy:kubeconfig" in api["summary"]
    assert of_kind(plan_for("mi355x"), "NetworkPolicy")
