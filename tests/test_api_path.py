"""How `pulumi up`, preview, destroy and the sweeper reach an EKS stack's Kubernetes API (issue 28,
item 2): preflight's ``kubernetes-api`` check against servers on 127.0.0.1 (an endpoint that
answers or not, a checkip stand-in), the sweeper's destroy path, and the workflows that run them.

The config rules and the plan's "Kubernetes API" row are tested in tests/test_config.py and
tests/test_node_access.py; the cluster security group rules in tests/test_aws_resources.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest
import yaml
from botocore.stub import Stubber

from components.core.config.stack_file import CONFIG_OVERLAY_ENV
from components.core.load import load_stack
from components.core.naming import eks_cluster_name
from scripts.ops import preflight, sweep
from scripts.ops.preflight import AwsClients, check_kubernetes_api
from tests.conftest import FIXED_NOW, TEST_DEPLOYER_CIDR, TEST_ENGINE_TAG

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO_ROOT / ".github" / "workflows"
REGION = "us-east-1"


@pytest.fixture(autouse=True)
def _aws_env(fake_aws_env):
    """Test credentials: no real profile or endpoint can leak in (tests/conftest.py)."""


@contextmanager
def checkip(answer: str) -> Iterator[str]:
    """A checkip stand-in on 127.0.0.1 that answers ``answer`` (one line); yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = (answer + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def listening() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that accepts connections (an API endpoint that answers)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        yield sock.getsockname()[1]


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def eks_client(cluster: str, endpoint: str | None):
    """EKS answering DescribeCluster of ``cluster``: ACTIVE at ``endpoint``, or not found (None)."""
    client = boto3.client("eks", region_name=REGION)
    stub = Stubber(client)
    if endpoint is None:
        stub.add_client_error("describe_cluster", "ResourceNotFoundException", f"No cluster found for name: {cluster}.", 404,
                              expected_params={"name": cluster})
    else:
        stub.add_response("describe_cluster", {"cluster": {"name": cluster, "endpoint": endpoint, "status": "ACTIVE"}},
                          {"name": cluster})
    stub.activate()
    return client


def vpc_client(vpc_id: str, cidr: str):
    client = boto3.client("ec2", region_name=REGION)
    stub = Stubber(client)
    stub.add_response("describe_vpcs", {"Vpcs": [{"VpcId": vpc_id, "CidrBlock": cidr}]}, {"VpcIds": [vpc_id]})
    stub.activate()
    return client


def spec_with_network(stack: str = "gb300", **network):
    """``stack`` with its network's API keys replaced (the stand-in source of conftest.py dropped)."""
    from components.core.config import namespace_config, read_stack_config
    from components.core.load import parse_spec

    ns, _ = namespace_config(read_stack_config(stack))
    ns["network"] = {**{k: v for k, v in ns["network"].items() if not k.startswith("apiServer")}, **network}
    return parse_spec(ns, stack=stack, now=FIXED_NOW)


GB300_CLUSTER = eks_cluster_name("kimi-deploy", "gb300")


# -- an existing cluster: its endpoint answers on 443, or not ------------------------------------------


def test_an_existing_cluster_that_answers_passes():
    spec = load_stack("gb300", now=FIXED_NOW)
    with listening() as port:
        clients = AwsClients(REGION, overrides={"eks": eks_client(GB300_CLUSTER, f"https://127.0.0.1:{port}")})
        check = check_kubernetes_api(spec, clients, checkip_url=None)
    assert check.status == "pass", check
    assert check.reason.startswith(f"kimi-deploy-gb300: 127.0.0.1:{port} answers (at 127.0.0.1) from this machine")
    assert f"(public endpoint, allowed from {TEST_DEPLOYER_CIDR} (network.apiServerPublicCidrs))" in check.reason


def test_an_existing_cluster_that_does_not_answer_fails_naming_the_keys():
    spec = load_stack("gb300", now=FIXED_NOW)
    port = closed_port()
    clients = AwsClients(REGION, overrides={"eks": eks_client(GB300_CLUSTER, f"https://127.0.0.1:{port}")})
    check = check_kubernetes_api(spec, clients, checkip_url=None)
    assert check.status == "fail", check
    assert f"127.0.0.1:{port} (at 127.0.0.1)" in check.reason and "cluster unreachable" in check.reason
    assert "network.apiServerPublicCidrs (this machine's egress address, /32)" in check.reason


# -- before the cluster exists: this machine's address against the stack's sources --------------------


@pytest.mark.parametrize(("answer", "status", "fragment"), [
    ("1.2.3.4", "pass", f"before creation: this machine's egress address 1.2.3.4 is in {TEST_DEPLOYER_CIDR}"),
    ("5.6.7.8", "fail", "egress address 5.6.7.8 is not in network.apiServerPublicCidrs (1.2.3.4/32): `pulumi up` from here "
                        "would create the cluster and GPU nodes, then fail \"cluster unreachable\"; add 5.6.7.8/32"),
    ("<html>rate limited</html>", "unknown", "answered '<html>rate limited</html>', not an address"),
    ("2001:db8::7", "unknown", "answered the IPv6 address 2001:db8::7"),
])
def test_before_creation_the_egress_address_must_be_a_public_source(answer, status, fragment):
    spec = load_stack("gb300", now=FIXED_NOW)
    clients = AwsClients(REGION, overrides={"eks": eks_client(GB300_CLUSTER, None)})
    with checkip(answer) as url:
        check = check_kubernetes_api(spec, clients, checkip_url=url)
    assert check.status == status and fragment in check.reason, check


def test_no_egress_look_up_is_unknown_never_a_crash():
    spec = load_stack("gb300", now=FIXED_NOW)
    for url in (None, f"http://127.0.0.1:{closed_port()}/"):
        clients = AwsClients(REGION, overrides={"eks": eks_client(GB300_CLUSTER, None)})
        check = check_kubernetes_api(spec, clients, checkip_url=url)
        assert check.status == "unknown" and "1.2.3.4/32" in check.reason, check


def test_without_aws_credentials_the_egress_is_still_compared(monkeypatch, tmp_path):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    spec = load_stack("gb300", now=FIXED_NOW)
    with checkip("1.2.3.4") as url:
        check = check_kubernetes_api(spec, AwsClients(REGION), checkip_url=url)
    assert check.status == "pass", check
    assert check.reason.startswith("EKS cannot say whether kimi-deploy-gb300 exists (no AWS credentials); before creation")


VPC = "vpc-0123456789abcdef0"
PRIVATE = {"apiServerAccess": "private", "vpcId": VPC, "privateSubnetIds": ["subnet-0123456789abcdef0"]}


@pytest.mark.parametrize(("sources", "status", "fragment"), [
    ({"apiServerPrivateCidrs": ["127.0.0.0/8"]}, "pass",
     f"this machine sends from 127.0.0.1 toward {VPC}, in 127.0.0.0/8 (network.apiServerPrivateCidrs)"),
    ({"apiServerPrivateCidrs": ["10.8.0.0/16"]}, "fail",
     "not in network.apiServerPrivateCidrs (10.8.0.0/16): the cluster security group would not admit it on 443"),
    ({"apiServerPrivateCidrs": ["10.8.0.0/16"], "apiServerPrivateSecurityGroupIds": ["sg-0123456789abcdef0"]}, "unknown",
     "whether it is in sg-0123456789abcdef0 is not visible here"),
])
def test_before_creation_in_private_mode_the_address_toward_the_vpc_must_be_admitted(sources, status, fragment):
    """The VPC's range is 127.0.0.0/16 here, so the route this machine picks toward it (a UDP
    connect, nothing sent) is its loopback address: the real look-up, on 127.0.0.1 only."""
    spec = spec_with_network(**PRIVATE, **sources)
    clients = AwsClients(REGION, overrides={"eks": eks_client(GB300_CLUSTER, None),
                                            "ec2:DescribeVpcs": vpc_client(VPC, "127.0.0.0/16")})
    check = check_kubernetes_api(spec, clients, checkip_url=None)
    assert check.status == status and fragment in check.reason, check


def test_the_check_applies_to_eks_stacks_only():
    assert check_kubernetes_api(load_stack("b300", now=FIXED_NOW), AwsClients(REGION), None).status == "skip"
    mi355x = check_kubernetes_api(load_stack("mi355x", now=FIXED_NOW), AwsClients(REGION), None)
    assert mi355x.status == "skip" and "--check-cluster" in mi355x.reason


def test_only_runs_the_named_checks():
    spec = load_stack("gb300", now=FIXED_NOW)
    clients = AwsClients(REGION, overrides={"eks": eks_client(GB300_CLUSTER, None)})
    with checkip("1.2.3.4") as url:
        checks = preflight.run_checks(spec, now=FIXED_NOW, clients=clients, checkip_url=url, only={"kubernetes-api"})
    assert [(c.name, c.status) for c in checks] == [("kubernetes-api", "pass")]
    names = [c.name for c in preflight.run_checks(load_stack("mi355x", now=FIXED_NOW), now=FIXED_NOW)]
    assert names == list(preflight.CHECK_NAMES)  # every check listed, in order, without --only


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    full_env["KIMI_VLLM_PYTHON"] = str(REPO_ROOT / "no-vllm-parser-here")
    full_env.update(env)
    return subprocess.run([sys.executable, "scripts/ops/preflight.py", *args], cwd=REPO_ROOT, env=full_env,
                          capture_output=True, text=True, timeout=120)


def test_cli_only_kubernetes_api_as_the_preview_workflow_runs_it(moto_server):
    """`--only kubernetes-api --json` against a moto server (no cluster yet) and the checkip
    stand-in: what .github/workflows/preview.yml runs before `pulumi preview`."""
    env = {"AWS_ENDPOINT_URL": moto_server.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    only = ("--stack", "gb300", "--only", "kubernetes-api", "--json")
    with checkip("5.6.7.8") as url:
        out = _cli(*only, env={**env, "KIMI_DEPLOY_CHECKIP_URL": url})
        flag = _cli(*only, "--checkip-url", "", env={**env, "KIMI_DEPLOY_CHECKIP_URL": url})
    assert out.returncode == 1, out.stdout + out.stderr
    [check] = json.loads(out.stdout)["checks"]
    assert check["name"] == "kubernetes-api" and check["status"] == "fail" and "5.6.7.8 is not in" in check["reason"]
    assert [c["status"] for c in json.loads(flag.stdout)["checks"]] == ["unknown"]  # '' turns the look-up off
    bad = _cli("--stack", "gb300", "--only", "kubernetes-ap", env=env)
    assert bad.returncode == 2 and "kubernetes-ap is not a check (checks: deployable," in bad.stderr
    assert "Traceback" not in bad.stderr


def test_the_shipped_stack_fails_preflight_until_its_example_source_is_replaced(moto_server):
    env = {"AWS_ENDPOINT_URL": moto_server.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           CONFIG_OVERLAY_ENV: json.dumps({"kimi-deploy:vllm": {"imageTag": TEST_ENGINE_TAG}})}
    with checkip("1.2.3.4") as url:
        out = _cli("--stack", "b300-prod", "--only", "deployable,kubernetes-api", "--json",
                   env={**env, "KIMI_DEPLOY_CHECKIP_URL": url})
    checks = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert out.returncode == 1
    assert checks["deployable"]["status"] == "fail" and "'203.0.113.0/24' is the example value" in checks["deployable"]["reason"]
    assert checks["kubernetes-api"]["status"] == "fail" and "1.2.3.4 is not in" in checks["kubernetes-api"]["reason"]


# -- the sweeper's `pulumi destroy` follows the same path ------------------------------------------------


class RecordingDestroyer:
    def __init__(self):
        self.calls: list[tuple[str, bool, str]] = []

    def available(self) -> bool:
        return True

    def destroy(self, stack: str, *, delete_unreachable: bool = False, why: str = "") -> sweep.DestroyOutcome:
        self.calls.append((stack, delete_unreachable, why))
        return sweep.DestroyOutcome(stack, "destroyed")


@pytest.fixture
def expired_eks_stack():
    """moto: an expired gb300 cluster (tagged as the stack creates it) and nothing else."""
    from moto import mock_aws

    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        subnet = ec2.create_subnet(VpcId=ec2.create_vpc(CidrBlock="10.44.0.0/16")["Vpc"]["VpcId"],
                                   CidrBlock="10.44.0.0/20")["Subnet"]["SubnetId"]
        boto3.client("eks", region_name=REGION).create_cluster(
            name=GB300_CLUSTER, roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={"subnetIds": [subnet]},
            tags={sweep.TAG_STACK: "gb300", sweep.TAG_EXPIRES: "2026-11-01T00:00:00Z"},
        )
        yield


@pytest.mark.parametrize("answers", [True, False])
def test_the_sweeper_destroys_through_the_api_when_it_answers_else_drops_the_objects(expired_eks_stack, answers):
    probed: list[str] = []

    def probe(endpoint: str) -> tuple[bool, str]:
        probed.append(endpoint)
        return (True, "answers") if answers else (False, "timed out")

    destroyer = RecordingDestroyer()
    clients = lambda service, region: boto3.client(service, region_name=region)  # noqa: E731
    sweep.Sweeper(clients, [REGION], FIXED_NOW, destroy=True, destroyer=destroyer, wait_seconds=1, poll_seconds=0.01,
                  probe=probe).run()
    assert len(probed) == 1 and probed[0].startswith("https://") and probed[0].endswith(".us-east-1.eks.amazonaws.com/")
    assert destroyer.calls == [("gb300", False, "")] if answers else [("gb300", True, "timed out")]


def test_an_unreachable_destroy_says_so_and_sets_the_provider_switch(monkeypatch, tmp_path):
    """AutomationDestroyer hands PULUMI_K8S_DELETE_UNREACHABLE to the Pulumi CLI it runs (the
    workspace's env_vars), and the outcome says why."""
    from pulumi import automation as auto

    seen = {}

    class Stack:
        def export_stack(self):
            return auto.Deployment(version=3, deployment={"resources": []})

        def destroy(self, **kwargs):
            return None

    def select_stack(stack_name, work_dir, opts):
        seen.update(stack=stack_name, env=dict(opts.env_vars or {}))
        return Stack()

    monkeypatch.setattr(auto, "select_stack", select_stack)
    outcome = sweep.AutomationDestroyer(tmp_path).destroy("gb300", delete_unreachable=True, why="timed out")
    assert seen == {"stack": "gb300", "env": {"PULUMI_K8S_DELETE_UNREACHABLE": "true"}}
    assert outcome.status == "destroyed" and "did not answer from here (timed out)" in outcome.reason
    sweep.AutomationDestroyer(tmp_path).destroy("gb300")
    assert seen["env"] == {}


def test_the_probe_never_leaves_the_machine_for_a_local_aws_stand_in(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:5999")
    ok, why = sweep.api_endpoint_probe("https://abc.gr7.us-east-1.eks.amazonaws.com")
    assert not ok and "local stand-in" in why
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    with listening() as port:
        assert sweep.api_endpoint_probe(f"https://127.0.0.1:{port}")[0]
    assert not sweep.api_endpoint_probe(f"https://127.0.0.1:{closed_port()}")[0]


# -- the workflows run where the API answers ---------------------------------------------------------------


def test_preview_checks_the_path_before_pulumi_preview_on_a_runner_the_stack_admits():
    wf = yaml.safe_load((WORKFLOWS / "preview.yml").read_text())
    job = wf["jobs"]["preview"]
    assert "vars.PULUMI_RUNNER_LABELS" in job["runs-on"]
    steps = job["steps"]
    check = next(i for i, s in enumerate(steps) if "--only kubernetes-api --json" in s.get("run", ""))
    preview = next(i for i, s in enumerate(steps) if s.get("uses", "").startswith("pulumi/actions@"))
    assert check < preview and steps[check]["if"] == "env.HAS_CREDENTIALS == 'true'"
    assert 'check["status"] == "fail"' in steps[check]["run"] and "sys.exit(1)" in steps[check]["run"]


def test_the_sweeper_runs_on_the_same_runner():
    wf = yaml.safe_load((WORKFLOWS / "sweep.yml").read_text())
    assert "vars.PULUMI_RUNNER_LABELS" in wf["jobs"]["sweep"]["runs-on"]
    assert "PULUMI_K8S_DELETE_UNREACHABLE" in (WORKFLOWS / "sweep.yml").read_text()


@pytest.mark.parametrize(("phase", "source", "status"), [
    ("stage", "198.51.100.0/24", "fail"),  # a stage creates the cluster and the publish Job too
    ("stage", "1.2.3.4/32", "pass"),
    ("serve", "198.51.100.0/24", "fail"),
])
def test_deployable_fails_a_documentation_source_in_every_phase(phase, source, status):
    from components.core.config import namespace_config, read_stack_config
    from components.core.load import parse_spec

    ns, _ = namespace_config(read_stack_config("gb300"))
    ns["network"] = {**ns["network"], "apiServerPublicCidrs": [source]}
    ns["phase"] = phase
    check = preflight.check_deployable(parse_spec(ns, stack="gb300", now=FIXED_NOW))
    assert check.status == status, check
    if status == "fail":
        assert "`pulumi up` refuses this stack: kimi-deploy:network.apiServerPublicCidrs: '198.51.100.0/24'" in check.reason
