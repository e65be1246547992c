"""scripts/ops/preflight.py under moto, with botocore's Stubber answering the APIs moto lacks
(Service Quotas for EC2, capacity reservations and blocks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from components.core.config.stack_file import CONFIG_OVERLAY_ENV
from components.core.errors import ConfigError
from components.core.load import load_stack
from components.core.targets import ec2_vcpu_quota
from components.core.weights import MANIFEST_NAME, MARKER_NAME, mirror_key_prefix
from scripts.ops import preflight
from scripts.ops.preflight import AwsClients, run_checks
from tests.conftest import FIXED_NOW, STACKS, TEST_REVISION, without_overlay_notice

REPO_ROOT = Path(__file__).resolve().parents[1]
QUOTA_CODE = ec2_vcpu_quota("p6-b300.48xlarge")[0]


@pytest.fixture(autouse=True)
def _aws_env(fake_aws_env):
    """Every preflight test runs with test credentials (tests/conftest.py)."""


@pytest.fixture
def moto():
    with mock_aws():
        yield


def by_name(checks):
    return {c.name: c for c in checks}


def quota_client(region: str, value: float | None):
    """A Service Quotas client answering GetServiceQuota for the P quota with ``value``
    (None: access denied)."""
    client = boto3.client("service-quotas", region_name=region)
    stub = Stubber(client)
    params = {"ServiceCode": "ec2", "QuotaCode": QUOTA_CODE}
    if value is None:
        stub.add_client_error("get_service_quota", "AccessDeniedException", "not allowed", 400, expected_params=params)
    else:
        stub.add_response(
            "get_service_quota",
            {
                "Quota": {
                    "ServiceCode": "ec2",
                    "QuotaCode": QUOTA_CODE,
                    "QuotaName": "Running On-Demand P instances",
                    "Value": value,
                }
            },
            params,
        )
    stub.activate()
    return client


def reservation_client(region: str, rid: str, **fields):
    """An EC2 client answering DescribeCapacityReservations for ``rid`` (fields=None: not found)."""
    client = boto3.client("ec2", region_name=region)
    stub = Stubber(client)
    params = {"CapacityReservationIds": [rid]}
    if fields.get("missing"):
        stub.add_client_error(
            "describe_capacity_reservations",
            "InvalidCapacityReservationId.NotFound",
            "no such reservation",
            400,
            expected_params=params,
        )
    else:
        reservation = {"CapacityReservationId": rid, "InstancePlatform": "Linux/UNIX", "EndDateType": "limited"}
        reservation.update(fields)
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": [reservation]}, params)
    stub.activate()
    return client


def run(stack: str, *, region=None, overrides=None, **kwargs):
    spec = load_stack(stack, now=FIXED_NOW)
    region = region or spec.region
    clients = AwsClients(region, overrides=overrides or {}) if spec.profile.provisions_aws else None
    return by_name(run_checks(spec, region=region, now=FIXED_NOW, clients=clients, **kwargs))


def test_b300_us_east_1_passes_offering_and_facts(moto):
    checks = run("b300", overrides={"service-quotas": quota_client("us-east-1", 384)})
    assert checks["instance-facts"].status == "pass", checks["instance-facts"].reason
    assert "275,040 MiB" in checks["instance-facts"].reason and "16 EFA" in checks["instance-facts"].reason
    assert checks["offered-in-region"].status == "pass"
    assert "us-east-1a" in checks["offered-in-region"].reason and "us-east-1c" in checks["offered-in-region"].reason
    assert checks["offered-in-az"].status == "pass"
    assert checks["vcpu-quota"].status == "pass"
    assert "384" in checks["vcpu-quota"].reason and "192 = 192 needed" in checks["vcpu-quota"].reason
    assert checks["capacity-reservation"].status == "skip"
    assert checks["fsx"].status == checks["eks"].status == "skip"


def test_eu_west_1_offers_none(moto):
    checks = run("b300", region="eu-west-1", overrides={"service-quotas": quota_client("eu-west-1", 384)})
    assert checks["offered-in-region"].status == "fail"
    assert "not offered in eu-west-1" in checks["offered-in-region"].reason
    # The stack's AZ belongs to another region: not judged twice.
    assert checks["offered-in-az"].status == "skip"


def test_az_that_does_not_offer_the_type_fails(moto, tmp_path):
    spec = load_stack("b300", now=FIXED_NOW)
    checks = by_name(preflight.check_offerings(spec, AwsClients("us-east-1"), "us-east-1b", True))
    assert checks["offered-in-region"].status == "pass"
    assert checks["offered-in-az"].status == "fail"
    assert "us-east-1b does not offer" in checks["offered-in-az"].reason


def test_quota_short_fails_and_denied_is_unknown(moto):
    short = run(
        "b300-prod",
        overrides={
            "service-quotas": quota_client("us-east-1", 192),
            "ec2:DescribeCapacityReservations": reservation_client("us-east-1", "cr-0fedcba9876543210", missing=True),
        },
    )
    assert short["vcpu-quota"].status == "fail"
    assert "2 node(s) x 192 = 384 needed" in short["vcpu-quota"].reason
    denied = run("b300", overrides={"service-quotas": quota_client("us-east-1", None)})
    assert denied["vcpu-quota"].status == "unknown"
    assert "AccessDeniedException" in denied["vcpu-quota"].reason


def test_moto_without_service_quotas_is_unknown_not_a_crash(moto):
    checks = run("b300")
    assert checks["vcpu-quota"].status == "unknown"


def test_odcr_active_in_its_az_passes(moto):
    rid = "cr-0fedcba9876543210"
    ec2 = reservation_client(
        "us-east-1", rid, State="active", ReservationType="default", InstanceType="p6-b300.48xlarge",
        AvailabilityZone="us-east-1c", TotalInstanceCount=2, AvailableInstanceCount=2,
    )
    checks = run(
        "b300-prod", overrides={"service-quotas": quota_client("us-east-1", 384), "ec2:DescribeCapacityReservations": ec2}
    )
    assert checks["capacity-reservation"].status == "pass", checks["capacity-reservation"].reason
    assert checks["capacity-end"].status == "pass"  # no end date
    assert checks["fsx"].status == "skip" and checks["eks"].status == "pass"  # b300-prod creates no file system


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"State": "expired"}, "state expired"),
        ({"AvailabilityZone": "us-east-1a"}, "AZ us-east-1a"),
        ({"TotalInstanceCount": 1}, "1 instance(s) for 2 node(s)"),
        ({"InstanceType": "p5.48xlarge"}, "instance type p5.48xlarge"),
        ({"missing": True}, "does not exist"),
    ],
)
def test_odcr_problems_fail(moto, fields, expected):
    rid = "cr-0fedcba9876543210"
    base = {"State": "active", "ReservationType": "default", "InstanceType": "p6-b300.48xlarge",
            "AvailabilityZone": "us-east-1c", "TotalInstanceCount": 2}
    base.update(fields)
    ec2 = reservation_client("us-east-1", rid, **base)
    checks = run(
        "b300-prod", overrides={"service-quotas": quota_client("us-east-1", 384), "ec2:DescribeCapacityReservations": ec2}
    )
    assert checks["capacity-reservation"].status == "fail"
    assert expected in checks["capacity-reservation"].reason


def _block(end_offset_hours: float, state: str = "scheduled"):
    return dict(
        State=state, ReservationType="capacity-block", InstanceType="p6e-gb300.36xlarge", AvailabilityZone="us-east-1a",
        TotalInstanceCount=2, StartDate=FIXED_NOW + timedelta(hours=2), EndDate=FIXED_NOW + timedelta(hours=end_offset_hours),
    )


def test_gb300_unknown_type_and_capacity_block_outlasting_the_ttl(moto):
    rid = "cr-0fedcba9876543210"
    ec2 = reservation_client("us-east-1", rid, **_block(24 * 7))
    checks = run("gb300", overrides={"service-quotas": quota_client("us-east-1", 288), "ec2:DescribeCapacityReservations": ec2})
    for name in ("instance-facts", "offered-in-region", "offered-in-az"):
        assert checks[name].status == "unknown", checks[name]
        assert "unknown to the EC2 catalog" in checks[name].reason
    assert checks["capacity-reservation"].status == "warn"  # scheduled: says when it starts
    assert "capacity block" in checks["capacity-reservation"].reason and "starts" in checks["capacity-reservation"].reason
    assert checks["capacity-end"].status == "pass"
    assert "trialTtlHours 48" in checks["capacity-end"].reason  # the TTL, said in the reason


def test_capacity_block_ending_before_the_trial_expires_fails(moto):
    rid = "cr-0fedcba9876543210"
    ec2 = reservation_client("us-east-1", rid, **_block(24, state="active"))
    checks = run("gb300", overrides={"service-quotas": quota_client("us-east-1", 288), "ec2:DescribeCapacityReservations": ec2})
    assert checks["capacity-end"].status == "fail"
    assert (
        "before the stack expires" in checks["capacity-end"].reason
        and "now + trialTtlHours 48 h" in checks["capacity-end"].reason
    )


def test_capacity_block_quota_shortfall_is_a_warning(moto):
    ec2 = reservation_client("us-east-1", "cr-0fedcba9876543210", **_block(24 * 7, state="active"))
    checks = run("gb300", overrides={"service-quotas": quota_client("us-east-1", 0), "ec2:DescribeCapacityReservations": ec2})
    assert checks["vcpu-quota"].status == "warn"


def _publish_mirror(spec, bucket: str, *, drop: str | None = None, marker: bool = True):
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    prefix = mirror_key_prefix(spec)
    files = [{"path": f"model-{i:05d}.safetensors", "size_bytes": 10 + i, "sha256": f"{i:064x}"} for i in range(3)]
    for f in files:
        if f["path"] != drop:
            s3.put_object(Bucket=bucket, Key=f"{prefix}/{f['path']}", Body=b"x" * f["size_bytes"])
    s3.put_object(
        Bucket=bucket, Key=f"{prefix}/{MANIFEST_NAME}", Body=json.dumps({"revision": spec.revision, "files": files}).encode()
    )
    if marker:
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{MARKER_NAME}", Body=b"{}")


def test_mirror_complete_incomplete_and_missing(moto):
    spec = load_stack("b300", now=FIXED_NOW)
    clients = AwsClients("us-east-1")
    assert preflight.check_mirror(spec, clients, None).status == "skip"  # pulumi names it
    assert preflight.check_mirror(spec, clients, "no-such-mirror").status == "fail"
    _publish_mirror(spec, "mirror-ok")
    ok = preflight.check_mirror(spec, clients, "mirror-ok")
    assert ok.status == "warn" and "3 files" in ok.reason and "lists 112 files" in ok.reason
    _publish_mirror(spec, "mirror-partial", drop="model-00001.safetensors")
    partial = preflight.check_mirror(spec, clients, "mirror-partial")
    assert partial.status == "fail" and "1 missing" in partial.reason
    _publish_mirror(spec, "mirror-unfinished", marker=False)
    assert "did not finish" in preflight.check_mirror(spec, clients, "mirror-unfinished").reason
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="mirror-empty")
    empty = preflight.check_mirror(spec, clients, "mirror-empty")
    assert empty.status == "warn" and "manifest.json is missing" in empty.reason


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_runs_without_crashing(moto, stack):
    checks = run(stack)
    assert all(c.status in ("pass", "warn", "fail", "unknown", "skip") and c.reason for c in checks.values())
    spec = load_stack(stack, now=FIXED_NOW)
    if not spec.profile.provisions_aws:
        assert checks["offered-in-region"].status == "skip" and "not applicable" in checks["offered-in-region"].reason
    else:
        assert checks["offered-in-region"].status in ("pass", "unknown")


@pytest.fixture
def fake_api():
    """A fake Kubernetes API server on 127.0.0.1 answering GET /api/v1/nodes.

    Yields (server URL, nodes document the test may edit, list of (path, Authorization) seen).
    Answers 401 to a request without an Authorization header, as an API server with anonymous
    auth off does.
    """
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    nodes = {"kind": "NodeList", "apiVersion": "v1", "metadata": {},
             "items": [{"metadata": {"name": "mi355x-0"}, "status": {"allocatable": {"amd.com/gpu": "8"}}},
                       {"metadata": {"name": "cpu-0"}, "status": {"allocatable": {"cpu": "16"}}}]}
    seen = []

    class Api(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append((self.path.split("?")[0], self.headers.get("Authorization")))
            ok = self.path.split("?")[0] == "/api/v1/nodes" and self.headers.get("Authorization")
            body = json.dumps(nodes if ok else {"kind": "Status", "code": 401}).encode()
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", nodes, seen
    finally:
        server.shutdown()
        server.server_close()


def _kubeconfig(path: Path, server: str, user: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        f"users: [{{name: u, user: {user}}}]\n"
        "contexts: [{name: test, context: {cluster: c, user: u}}]\n"
    )
    return path


def test_kubernetes_cluster_check_only_when_asked(tmp_path, fake_api):
    url, nodes, seen = fake_api
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", url, "{token: t0ken}")
    off = run("mi355x")
    assert off["cluster"].status == "skip" and "--check-cluster" in off["cluster"].reason
    assert not seen
    on = run("mi355x", check_cluster_enabled=True, kubeconfig=kubeconfig)
    assert on["cluster"].status == "pass" and on["cluster"].reason == "API server answers: 2 node(s)"
    assert on["gpu-nodes"].status == "pass" and "1 node(s) advertise 8x amd.com/gpu" in on["gpu-nodes"].reason
    assert seen == [("/api/v1/nodes", "Bearer t0ken")]
    nodes["items"] = nodes["items"][1:]
    assert run("mi355x", check_cluster_enabled=True, kubeconfig=kubeconfig)["gpu-nodes"].status == "fail"


def test_kubernetes_cluster_check_runs_exec_plugin(tmp_path, fake_api):
    """An exec user (the shape of `aws eks get-token`) is run and its token reaches the server."""
    url, _, seen = fake_api
    plugin = tmp_path / "get-token.py"
    plugin.write_text(
        "import json, os, sys\n"
        "assert os.environ['KUBERNETES_EXEC_INFO']\n"
        "json.dump({'apiVersion': 'client.authentication.k8s.io/v1beta1', 'kind': 'ExecCredential',\n"
        "           'status': {'token': 'exec-' + sys.argv[1]}}, sys.stdout)\n"
    )
    user = (f"{{exec: {{apiVersion: client.authentication.k8s.io/v1beta1, command: '{sys.executable}', "
            f"args: ['{plugin}', 'k0ken'], interactiveMode: Never}}}}")
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", url, user)
    on = run("mi355x", check_cluster_enabled=True, kubeconfig=kubeconfig)
    assert seen == [("/api/v1/nodes", "Bearer exec-k0ken")]
    assert on["cluster"].status == "pass" and on["gpu-nodes"].status == "pass"

    # A plugin that fails: no token, the server says 401, the check is unknown with the plugin's word.
    plugin.write_text("import sys\nsys.stderr.write('no SSO session')\nsys.exit(3)\n")
    failed = run("mi355x", check_cluster_enabled=True, kubeconfig=kubeconfig)
    assert failed["cluster"].status == "unknown" and "answered HTTP 401" in failed["cluster"].reason
    assert "exec plugin" in failed["cluster"].reason and "\n" not in failed["cluster"].reason
    assert failed["gpu-nodes"].status == "unknown"


def test_kubernetes_cluster_unreachable_or_misnamed(tmp_path):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}", "{token: t}")
    down = run("mi355x", check_cluster_enabled=True, kubeconfig=kubeconfig)
    assert down["cluster"].status == "unknown" and "does not answer" in down["cluster"].reason
    assert "\n" not in down["cluster"].reason and down["gpu-nodes"].status == "unknown"
    with pytest.raises(preflight.UsageError, match=r"--context: 'nope' is not a context in"):
        run("mi355x", check_cluster_enabled=True, kubeconfig=kubeconfig, context="nope")


def _cli(*args, env=None, runtime: str | None = "none"):
    """Run the command; the vLLM parser check is skipped (a path that is not there) unless ``env``
    names a parser, and so is the engine image's (``--runtime none``) unless ``runtime`` is None
    (select one as a user's run does) or names one: these tests are about AWS, importing vLLM takes
    seconds, and a container runtime on this machine would pull an image."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    full_env["KIMI_VLLM_PYTHON"] = str(REPO_ROOT / "no-vllm-parser-here")
    full_env.update(env or {})
    flags = ["--runtime", runtime] if runtime and "--help" not in args else []
    return without_overlay_notice(subprocess.run([sys.executable, "scripts/ops/preflight.py", *args, *flags],
                                                 cwd=REPO_ROOT, env=full_env, capture_output=True, text=True, timeout=120))


def _engine_image(out) -> dict:
    return {c["name"]: c for c in json.loads(out.stdout)["checks"]}["engine-image"]


def test_engine_image_with_podman_on_path_and_a_docker_without_its_daemon(tmp_path):
    """A user's run (no --runtime): docker is skipped, the stack's image is verified with podman."""
    from tests import fake_runtime

    fake_runtime.install(tmp_path, "docker", "without_daemon")
    podman = fake_runtime.install(tmp_path, "podman", "answers")
    out = _cli("--stack", "mi355x", "--json", env={"PATH": str(tmp_path)}, runtime=None)
    check = _engine_image(out)
    assert check["status"] == "fail" and "cannot be pulled" in check["reason"] and "reading manifest" in check["reason"]
    assert check["reason"].endswith("(runtime podman; skipped docker: Cannot connect to the Docker daemon at unix:///var/run/do...)")
    assert podman.is_file()
    pulls = [c for c in fake_runtime.calls(tmp_path) if c[1] == "pull"]
    assert len(pulls) == 1 and pulls[0][0] == "podman" and pulls[0][2].startswith("docker.io/vllm/vllm-openai-rocm:")
    forced = _cli("--stack", "mi355x", "--json", env={"PATH": str(tmp_path)}, runtime="docker")
    assert forced.returncode == 2 and forced.stdout == "" and forced.stderr.count("\n") == 1
    assert forced.stderr.startswith("error: --runtime: no container runtime (docker) answers (docker: Cannot connect")


def test_engine_image_without_a_runtime_on_path_is_skip_naming_each(tmp_path):
    out = _cli("--stack", "mi355x", "--json", env={"PATH": str(tmp_path)}, runtime=None)
    check = _engine_image(out)
    assert check == {"name": "engine-image", "status": "skip", "reason": "no container runtime answers (docker: not on "
                     "PATH; podman: not on PATH): run `kimi-deploy engine verify --image IMAGE` where one does"}
    none = _engine_image(_cli("--stack", "mi355x", "--json"))
    assert none["status"] == "skip" and none["reason"].startswith("not run (--runtime none)")


def test_cli_against_moto_server_honors_aws_endpoint_url():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        env = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}
        ok = _cli("--stack", "b300", "--json", env=env)
        assert ok.returncode == 0, ok.stderr
        report = json.loads(ok.stdout)
        statuses = {c["name"]: c["status"] for c in report["checks"]}
        assert statuses["offered-in-region"] == "pass" and statuses["vcpu-quota"] == "unknown"
        bad = _cli("--stack", "b300", "--region", "eu-west-1", env=env)
        assert bad.returncode == 1
        assert "not offered in eu-west-1" in bad.stdout and "Traceback" not in bad.stderr
    finally:
        server.stop()


def test_cli_usage_errors_exit_2_without_traceback():
    missing = _cli("--stack", "nope")
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: --stack: 'nope'") and "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    assert _cli("--bogus").returncode == 2
    helptext = _cli("--help")
    assert helptext.returncode == 0
    for flag in ("--stack", "--region", "--json", "--mirror-bucket", "--check-cluster", "--kubeconfig", "--context", "--runtime"):
        assert flag in helptext.stdout



# --- new-user trial defects: no credentials, unreachable endpoint, local moto ---------------------


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    """No credentials anywhere boto3 looks (environment, files, instance metadata)."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return {"HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.mark.parametrize("stack", [s for s in STACKS if load_stack(s, now=FIXED_NOW).profile.provisions_aws])
def test_a_check_that_does_not_apply_is_skip_with_or_without_credentials(moto, stack, no_credentials):
    spec = load_stack(stack, now=FIXED_NOW)
    without = by_name(run_checks(spec, now=FIXED_NOW, clients=AwsClients(spec.region)))
    # `deployable` judges the config alone (no API): it runs without credentials.
    assert {c.status for n, c in without.items() if n != "deployable"} <= {"skip", "unknown"}
    assert without["instance-facts"].status == "unknown" and "no AWS credentials" in without["instance-facts"].reason
    import boto3

    with_creds = by_name(run_checks(spec, now=FIXED_NOW, clients=AwsClients(spec.region, session=boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing"))))
    for name, check in with_creds.items():
        if check.status == "skip" or without[name].status == "skip":
            assert without[name] == check, name


def test_no_credentials_is_exit_2_with_one_line_and_the_per_check_unknowns(no_credentials):
    out = _cli("--stack", "b300", "--json", env=no_credentials)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: no AWS credentials: set AWS_PROFILE or AWS_ACCESS_KEY_ID")
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    report = json.loads(out.stdout)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert report["ok"] is False and report["error"].startswith("no AWS credentials")
    assert statuses["instance-facts"] == "unknown" and statuses["capacity-reservation"] == "skip" and statuses["fsx"] == "skip"
    table = _cli("--stack", "b300", env=no_credentials)
    assert table.returncode == 2 and "result: ok" not in table.stdout and "NOT CHECKED" in table.stdout


def test_local_endpoint_alone_works_with_dummy_credentials(no_credentials):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        out = _cli("--stack", "b300", "--json", env={**no_credentials, "AWS_ENDPOINT_URL": f"http://{host}:{port}"})
    finally:
        server.stop()
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert {c["name"]: c["status"] for c in report["checks"]}["offered-in-region"] == "pass"
    assert any("dummy credentials" in n for n in report["notes"]) and "dummy credentials" in out.stderr


def test_unreachable_endpoint_is_unknown_and_exit_2():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}
    for stack in STACKS:
        spec = load_stack(stack, now=FIXED_NOW)
        if not spec.profile.provisions_aws:
            continue
        out = _cli("--stack", stack, "--json", env=env)
        assert out.returncode == 2, (stack, out.stdout + out.stderr)
        assert out.stderr.strip().splitlines()[-1].startswith("error: cannot reach the AWS endpoint")
        report = json.loads(out.stdout)
        statuses = {c["name"]: c["status"] for c in report["checks"]}
        assert "fail" not in statuses.values(), (stack, report["checks"])  # connectivity is not a failed check
        for name in ("fsx", "eks"):
            assert statuses[name] in ("unknown", "skip") and "has no endpoint" not in str(report["checks"])


def test_usage_errors_are_one_line_without_abbreviations():
    for argv, needle in (
        (["--stack", "b300", "--mirror", "b"], "unrecognized arguments: --mirror"),
        (["--region", "us-east-1"], "--stack"),
    ):
        out = _cli(*argv)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr, out.stderr


def _stack_with_extra_args(tmp_path: Path, stack: str, extra_args: list[str]):
    import yaml

    data = yaml.safe_load((REPO_ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())
    vllm = dict(data["config"].get("kimi-deploy:vllm") or {})
    vllm["extraArgs"] = extra_args
    data["config"]["kimi-deploy:vllm"] = vllm
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(data))
    return load_stack(stack, stacks_dir=tmp_path, now=FIXED_NOW)


def test_vllm_argv_is_skipped_without_the_parser_and_says_how_to_get_it():
    check = preflight.check_vllm_argv(load_stack("mi355x", now=FIXED_NOW), None)
    assert check.status == "skip" and "make vllm-parser" in check.reason


def test_vllm_argv_runs_the_stacks_command_through_the_real_parser(tmp_path):
    """vllm.extraArgs reaches vLLM's own parser: a flag vLLM does not have fails the check with
    vLLM's error, a real one passes; the gb300 leader/worker pair is checked role by role."""
    from tests.vllm_contract import require_vllm_python

    python = require_vllm_python()
    good = preflight.check_vllm_argv(_stack_with_extra_args(tmp_path, "mi355x", ["--max-num-seqs", "64"]), python)
    assert good.status in ("pass", "warn"), good.reason
    assert "server command" in good.reason
    # What the recorded parser table refuses is refused earlier, at load, in one line (vllm_options.py).
    with pytest.raises(ConfigError, match="did you mean --max-num-seqs"):
        _stack_with_extra_args(tmp_path, "mi355x", ["--max-num-seqz", "64"])
    with pytest.raises(ConfigError, match=r"max_num_seqs\) must be a whole number"):
        _stack_with_extra_args(tmp_path, "b300", ["--max-num-seqs", "many"])
    # A field value of a JSON option (the table holds its keys, not their types) reaches the real parser.
    bad = preflight.check_vllm_argv(_stack_with_extra_args(tmp_path, "mi355x", ["--compilation-config", '{"mode": 9}']),
                                    python)
    assert bad.status == "fail" and "CompilationConfig" in bad.reason and "server command" in bad.reason
    multi = preflight.check_vllm_argv(load_stack("gb300", now=FIXED_NOW), python)
    assert multi.status in ("pass", "warn") and "leader, worker" in multi.reason, multi.reason


def test_vllm_argv_parser_that_cannot_run_is_unknown(tmp_path):
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'No module named vllm' >&2\nexit 3\n")
    broken.chmod(0o755)
    check = preflight.check_vllm_argv(load_stack("mi355x", now=FIXED_NOW), broken)
    assert check.status == "unknown" and "make vllm-parser" in check.reason


def test_a_failed_offline_check_is_the_verdict_without_aws_credentials(tmp_path):
    """A vllm.extraArgs value only the real parser refuses fails vllm-argv offline: without AWS credentials the result is
    FAILED (exit 1) naming it, and the missing credentials are a note, not "NOT CHECKED" (exit 2)."""
    from tests.vllm_contract import require_vllm_python

    python = require_vllm_python()
    _stack_with_extra_args(tmp_path, "b300", ["--compilation-config", '{"mode": 9}'])
    stack_dir = REPO_ROOT / "stacks"
    name = "t-preflight-failed"
    target = stack_dir / f"Pulumi.{name}.yaml"
    target.write_text((tmp_path / "Pulumi.b300.yaml").read_text())
    try:
        out = _cli("--stack", name, "--json", env={"KIMI_VLLM_PYTHON": str(python), "AWS_CONFIG_FILE": "/dev/null",
                                                   "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"})
    finally:
        target.unlink()
    assert out.returncode == 1, out.stdout + out.stderr
    report = json.loads(out.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["vllm-argv"]["status"] == "fail" and "CompilationConfig" in checks["vllm-argv"]["reason"]
    assert report["result"].startswith("FAILED") and report["exit_code"] == 1
    assert "note: not checked on AWS:" in out.stderr and "error:" not in out.stderr


# --- the time the cloud really gives: a block's termination window, the time to ready -------------
# AWS terminates a capacity block's instances 30 min before the block's end; EventBridge warns at 40
# (EC2 user guide, capacity-blocks-monitor; EC2 Auto Scaling user guide, launch-template-capacity-blocks).


def _block_at(start_hours: float, end_hours: float, state: str = "active"):
    return dict(
        State=state, ReservationType="capacity-block", InstanceType="p6e-gb300.36xlarge", AvailabilityZone="us-east-1a",
        TotalInstanceCount=2, StartDate=FIXED_NOW + timedelta(hours=start_hours),
        EndDate=FIXED_NOW + timedelta(hours=end_hours),
    )


def _gb300_reservation(**block):
    ec2 = reservation_client("us-east-1", "cr-0fedcba9876543210", **block)
    return run("gb300", overrides={"service-quotas": quota_client("us-east-1", 288), "ec2:DescribeCapacityReservations": ec2})


def test_a_block_ending_just_after_the_expiry_fails_by_its_termination_window(moto):
    # gb300 is a 48 h trial; the block ends 20 min after the expiry, so its instances stop 10 min before it.
    checks = _gb300_reservation(**_block_at(-1, 48 + 20 / 60))
    end = checks["capacity-end"]
    assert end.status == "fail", end
    assert "runs instances until 2026-12-02T11:50:00Z (it ends 2026-12-02T12:20:00Z" in end.reason
    assert "30 min before the block's end" in end.reason and "before the stack expires" in end.reason


def test_a_block_inside_its_termination_window_is_already_over(moto):
    checks = _gb300_reservation(**_block_at(-24, 0.25))
    assert checks["capacity-end"].status == "fail"
    assert "its instances are being terminated now" in checks["capacity-end"].reason


def test_capacity_ready_warns_when_the_model_is_served_after_the_block_stops(moto):
    # Scheduled to start 47.5 h from now and end at 48.6 h: it outlasts the 48 h trial (usable until
    # 48.1 h), but the modelled first deploy needs about 1.1 h of GPU phases from the block's start.
    checks = _gb300_reservation(**_block_at(47.5, 48.6, state="scheduled"))
    assert checks["capacity-end"].status == "pass", checks["capacity-end"]
    ready = checks["capacity-ready"]
    assert ready.status == "warn", ready
    assert "modelled first deploy serves at 2026-12-02T12:" in ready.reason
    assert "terminated from 2026-12-02T12:06:00Z" in ready.reason
    assert "from the block's start 2026-12-02T11:30:00Z" in ready.reason


def test_capacity_ready_passes_with_time_left_and_skips_odcrs(moto):
    ready = _gb300_reservation(**_block_at(-1, 24 * 7))["capacity-ready"]
    assert ready.status == "pass" and "of serving before" in ready.reason
    fields = dict(State="active", InstanceType="p6-b300.48xlarge", AvailabilityZone="us-east-1c", TotalInstanceCount=2,
                  EndDate=FIXED_NOW + timedelta(days=30))
    ec2 = reservation_client("us-east-1", "cr-0fedcba9876543210", **fields)
    odcr = run("b300-prod", overrides={"service-quotas": quota_client("us-east-1", 384), "ec2:DescribeCapacityReservations": ec2})
    assert odcr["capacity-ready"].status == "skip" and "keep running as On-Demand" in odcr["capacity-ready"].reason
    assert "ends 2026-12-30T12:00:00Z" in odcr["capacity-end"].reason  # an ODCR: its own end, no window


def test_the_termination_window_is_one_constant_for_config_and_preflight(moto, monkeypatch):
    from components.core import capacity

    block = _block_at(-1, 48 + 20 / 60)
    assert _gb300_reservation(**block)["capacity-end"].status == "fail"
    monkeypatch.setattr(capacity, "CAPACITY_BLOCK_TERMINATION_SECONDS", 0)
    assert _gb300_reservation(**block)["capacity-end"].status == "pass"
    # The config check of compute.capacity.endsAt reads the same constant.
    from components.core.load import load_stack as load

    spec = load("gb300", now=FIXED_NOW)
    assert not any("terminated from" in w for w in spec.warnings)


# --- credentials that outlive `pulumi up`: botocore's providers, against moto on 127.0.0.1 ----------


@pytest.fixture
def sts_env(moto_server, monkeypatch, tmp_path):
    """Only what a test sets reaches botocore: moto's endpoint, no profile, no files, no IMDS."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE",
                "AWS_CREDENTIAL_EXPIRATION", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return tmp_path


def _credentials_check(stack: str, now=FIXED_NOW) -> preflight.Check:
    from components.core.time_to_ready import pulumi_up_seconds, stack_time_to_ready

    spec = load_stack(stack, now=FIXED_NOW)
    seconds, how = pulumi_up_seconds(spec, stack_time_to_ready(spec))
    return preflight.check_deploy_credentials(spec, AwsClients(spec.region), now, seconds, how)


def _session_token_env(monkeypatch, expiration: str | None = None):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ASIAQAAAAAAAAAAAAAAA")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token")
    if expiration:
        monkeypatch.setenv("AWS_CREDENTIAL_EXPIRATION", expiration)


def test_an_environment_session_token_fails_where_pulumi_up_runs_for_hours(sts_env, monkeypatch):
    _session_token_env(monkeypatch)
    eks = _credentials_check("gb300")  # the first EKS `pulumi up` waits for the sync and vLLM: about 5 h
    assert eks.status == "fail", eks
    assert "(env): a session token no SDK can renew, expiry unknown" in eks.reason
    assert "AWS_PROFILE with role_arn + source_profile, or sso_session" in eks.reason  # the fix, named
    ec2 = _credentials_check("b300")  # `pulumi up` returns once the instance runs: minutes
    assert ec2.status == "warn", ec2
    assert "returns once the instance runs" in ec2.reason


def test_a_known_expiry_is_compared_with_the_modelled_pulumi_up(sts_env, monkeypatch):
    from datetime import UTC, datetime

    from components.core.config import format_utc

    now = datetime.now(UTC).replace(microsecond=0)  # botocore itself refuses credentials expired by the real clock
    _session_token_env(monkeypatch, format_utc(now + timedelta(hours=1)))
    early = _credentials_check("gb300", now)
    assert early.status == "fail", early
    assert f"expiring {format_utc(now + timedelta(hours=1))}, before `pulumi up` would end" in early.reason
    _session_token_env(monkeypatch, format_utc(now + timedelta(hours=12)))
    late = _credentials_check("gb300", now)
    assert late.status == "warn" and f"valid until {format_utc(now + timedelta(hours=12))}" in late.reason


def test_a_role_profile_botocore_renews_passes(sts_env, monkeypatch):
    (sts_env / "config").write_text(
        "[profile deploy]\nrole_arn = arn:aws:iam::123456789012:role/deployer\nsource_profile = base\n"
        "[profile base]\naws_access_key_id = AKIAQAAAAAAAAAAAAAAA\naws_secret_access_key = secret\n"
    )
    monkeypatch.setenv("AWS_PROFILE", "deploy")
    check = _credentials_check("gb300")
    assert check.status == "pass", check
    # moto's STS answered AssumeRole and GetCallerIdentity: the identity is the assumed role.
    assert "assumed-role/deployer/" in check.reason and "(assume-role): botocore renews" in check.reason


def test_long_term_keys_pass_and_other_platforms_skip(sts_env, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAQAAAAAAAAAAAAAAA")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    check = _credentials_check("gb300")
    assert check.status == "pass" and "(env): long-term access keys, no expiry" in check.reason
    assert _credentials_check("mi355x").status == "skip"


# --- SSO and credential_process: renewed only while the session behind them lasts -------------------
# botocore's own SSO provider reads the token file of a temporary HOME and asks a stand-in of the SSO
# portal on 127.0.0.1 (AWS_ENDPOINT_URL_SSO) for role credentials; STS is moto's.


@contextmanager
def sso_portal():
    """The IAM Identity Center portal's GetRoleCredentials on 127.0.0.1: any token gets an hour."""
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = json.dumps({"roleCredentials": {
                "accessKeyId": "ASIAQAAAAAAAAAAAAAAA", "secretAccessKey": "secret", "sessionToken": "token",
                "expiration": int((time.time() + 3600) * 1000)}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


START_URL = "https://example.awsapps.com/start"
SSO_SESSION_CONFIG = (
    "[profile dev]\nsso_session = corp\nsso_account_id = 123456789012\nsso_role_name = Deployer\nregion = us-east-1\n"
    f"[sso-session corp]\nsso_start_url = {START_URL}\nsso_region = us-east-1\nsso_registration_scopes = sso:account:access\n"
)
LEGACY_CONFIG = (
    f"[profile dev]\nsso_start_url = {START_URL}\nsso_region = us-east-1\nsso_account_id = 123456789012\n"
    "sso_role_name = Deployer\nregion = us-east-1\n"
)


def write_sso_home(home: Path, config: str, *, key: str, expires_in: timedelta, refresh: bool) -> Path:
    """``home``/.aws/config and the cached token ``aws sso login`` writes (botocore's cache key:
    sha1 of the session name, else of the start URL)."""
    import hashlib
    from datetime import UTC, datetime

    from components.core.config import format_utc

    now = datetime.now(UTC).replace(microsecond=0)
    (home / ".aws" / "sso" / "cache").mkdir(parents=True, exist_ok=True)
    (home / ".aws" / "config").write_text(config)
    token = {"startUrl": START_URL, "region": "us-east-1", "accessToken": "sso-access-token",
             "expiresAt": format_utc(now + expires_in)}
    if refresh:
        token.update(refreshToken="sso-refresh-token", clientId="client", clientSecret="secret",
                     registrationExpiresAt=format_utc(now + timedelta(days=80)))
    path = home / ".aws" / "sso" / "cache" / f"{hashlib.sha1(key.encode()).hexdigest()}.json"
    path.write_text(json.dumps(token))
    return path


def _sso_preflight(home: Path, moto_server, portal: str, profile: str = "dev") -> dict:
    env = {"HOME": str(home), "AWS_CONFIG_FILE": str(home / ".aws" / "config"), "AWS_PROFILE": profile,
           "AWS_SHARED_CREDENTIALS_FILE": str(home / "none"), "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_ENDPOINT_URL": moto_server.endpoint, "AWS_ENDPOINT_URL_SSO": portal}
    out = _cli("--stack", "gb300", "--only", "deploy-credentials", "--json", env=env)
    assert "Traceback" not in out.stderr, out.stderr
    [check] = json.loads(out.stdout)["checks"]
    return check


@pytest.mark.parametrize(("config", "key", "expires_in", "refresh", "status", "fragments"), [
    # An sso_session token that expires during the ~5 h first EKS `pulumi up`: its refresh token may renew it.
    (SSO_SESSION_CONFIG, "corp", timedelta(hours=1), True, "warn",
     ("(sso): the SSO token expires", "its refresh token renews it while the IAM Identity Center session lasts",
      "`aws sso login --sso-session corp` just before `pulumi up`")),
    # A legacy profile: nothing renews its token, `pulumi up` would lose its credentials half-way.
    (LEGACY_CONFIG, START_URL, timedelta(hours=1), False, "fail",
     ("(sso): the SSO token expires", "no refresh token renews it (a legacy profile without sso_session)",
      "`aws sso login --profile dev` right before `pulumi up`")),
    (LEGACY_CONFIG, START_URL, timedelta(hours=12), False, "pass",
     ("(sso): the SSO token is valid until", "after the modelled `pulumi up` ends")),
])
def test_sso_credentials_pass_only_while_the_sso_token_outlives_pulumi_up(
    tmp_path, moto_server, config, key, expires_in, refresh, status, fragments
):
    write_sso_home(tmp_path, config, key=key, expires_in=expires_in, refresh=refresh)
    with sso_portal() as portal:
        check = _sso_preflight(tmp_path, moto_server, portal)
    assert check["status"] == status, check
    for fragment in fragments:
        assert fragment in check["reason"], check


def test_credential_process_is_followed_to_the_sso_profile_it_exports(tmp_path, moto_server):
    """`credential_process = aws configure export-credentials --profile dev --format process` (the AWS
    way to hand SSO to tools): a stand-in process answers the same JSON, renewable by Expiration."""
    from datetime import UTC, datetime

    from components.core.config import format_utc

    process = tmp_path / "export_credentials.py"
    expiry = format_utc(datetime.now(UTC) + timedelta(hours=1))
    process.write_text("import json\nprint(json.dumps({'Version': 1, 'AccessKeyId': 'ASIAQAAAAAAAAAAAAAAA', "
                       f"'SecretAccessKey': 'secret', 'SessionToken': 'token', 'Expiration': '{expiry}'}}))\n")
    command = f"{sys.executable} {process} configure export-credentials --profile dev --format process"
    write_sso_home(tmp_path, LEGACY_CONFIG + f"[profile ci]\ncredential_process = {command}\n", key=START_URL,
                   expires_in=timedelta(hours=1), refresh=False)
    with sso_portal() as portal:
        followed = _sso_preflight(tmp_path, moto_server, portal, profile="ci")
        assert followed["status"] == "fail", followed
        assert "(custom-process): credential_process over profile dev: the SSO token" in followed["reason"]
        (tmp_path / ".aws" / "config").write_text(f"[profile ci]\ncredential_process = {sys.executable} {process}\n")
        opaque = _sso_preflight(tmp_path, moto_server, portal, profile="ci")
    assert opaque["status"] == "warn" and "not visible here" in opaque["reason"], opaque


def test_an_ended_sso_session_fails_with_the_login_command(tmp_path, moto_server):
    write_sso_home(tmp_path, SSO_SESSION_CONFIG, key="corp", expires_in=timedelta(hours=-1), refresh=False)
    with sso_portal() as portal:
        check = _sso_preflight(tmp_path, moto_server, portal)
    assert check["status"] == "fail" and "the SSO session expired" in check["reason"], check
    assert "`aws sso login --sso-session corp`" in check["reason"]


def test_the_token_cache_is_read_as_botocore_reads_it(tmp_path, monkeypatch):
    from datetime import UTC, datetime

    monkeypatch.setenv("HOME", str(tmp_path))
    now = datetime.now(UTC)
    path = write_sso_home(tmp_path, "", key="corp", expires_in=timedelta(hours=2), refresh=True)
    config = {"profiles": {"dev": {"sso_session": "corp"}, "other": {"region": "us-east-1"}},
              "sso_sessions": {"corp": {"sso_start_url": START_URL}}}
    token = preflight.sso_token_of("dev", config, now)
    assert token is not None and token.path == path and token.session_name == "corp"
    assert timedelta(hours=1, minutes=59) < token.expires_at - now <= timedelta(hours=2)
    assert token.refreshable_until is not None and token.refreshable_until > now + timedelta(days=79)
    assert preflight.sso_token_of("other", config, now) is None  # not an SSO profile
    path.write_text("{not json")
    assert preflight.sso_token_of("dev", config, now) is None  # unreadable: "not visible", never a crash


# --- blockers: what `pulumi up` refuses is a failure here, never "nothing failed" -------------------


def test_a_stack_pulumi_up_refuses_fails_preflight():
    # The shipped stacks name no engine build (the example commit replaced: it is a blocker of its own).
    shipped_engine = json.dumps({"stacks": {"mi355x": {"kimi-deploy:model": {"revision": TEST_REVISION}}}})
    out = _cli("--stack", "mi355x", "--json", env={CONFIG_OVERLAY_ENV: shipped_engine})
    assert out.returncode == 1, out.stdout + out.stderr
    report = json.loads(out.stdout)
    deployable = {c["name"]: c for c in report["checks"]}["deployable"]
    assert deployable["status"] == "fail" and "`pulumi up` refuses this stack: kimi-deploy:vllm.image" in deployable["reason"]
    assert report["result"].startswith("FAILED (1 failed")
    with_build = _cli("--stack", "mi355x", "--json")
    assert {c["name"]: c["status"] for c in json.loads(with_build.stdout)["checks"]}["deployable"] == "pass"


def test_only_offline_checks_need_no_aws_credentials(no_credentials):
    """--only deployable needs nothing of AWS: its pass is the verdict, not 'no AWS credentials'
    (new-user trial: exit 2 after the one check it ran had passed)."""
    out = _cli("--stack", "b300", "--json", "--only", "deployable", env=no_credentials)
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["error"] is None, out.stderr
    assert [c["name"] for c in doc["checks"] if c["status"] != "skip"] == ["deployable"]


@pytest.mark.parametrize("region,fragment", [("us-east-9", "is not an AWS region"), ("us-eats-1", "did you mean us-east-1")])
def test_a_region_aws_does_not_have_is_one_line_not_missing_credentials(region, fragment):
    """New-user trial: --region us-east-9 ended as 'no AWS credentials'."""
    out = _cli("--stack", "b300", "--region", region)
    assert out.returncode == 2 and out.stderr.startswith(f"error: --region: '{region}' ") and fragment in out.stderr
    assert out.stderr.count("\n") == 1 and "credentials" not in out.stderr


def test_nothing_checked_on_an_ec2_stack_does_not_suggest_the_kubernetes_only_option():
    """`--only vllm-argv` without the parser on an EC2 stack checked nothing and was told to pass
    --check-cluster (it contacts a Kubernetes cluster, which an EC2 stack has none of)."""
    ec2 = _cli("--stack", "b300", "--only", "vllm-argv")
    assert ec2.returncode == 2, ec2.stderr
    assert "--check-cluster" not in ec2.stderr, ec2.stderr
    assert "nothing could be checked (1 skipped); vllm-argv: vLLM parser not installed" in ec2.stderr, ec2.stderr
    k8s = _cli("--stack", "mi355x", "--only", "cluster")
    assert k8s.returncode == 2 and "pass --check-cluster to check the cluster" in k8s.stderr, k8s.stderr
