"""The sweeper under moto: what is found, what is deleted, in which order, and what is never touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import boto3
import pytest

from scripts.ops import sweep

REPO_ROOT = Path(__file__).resolve().parents[1]
REGION = "us-east-1"
NOW = datetime(2026, 12, 10, 0, 0, tzinfo=UTC)
PAST = "2026-12-01T00:00:00Z"
FUTURE = "2027-01-01T00:00:00Z"


def tags(stack: str, expires: str | None = None, **extra: str) -> dict[str, str]:
    out = {
        sweep.TAG_STACK: stack,
        sweep.TAG_PROJECT: "kimi-deploy",
        sweep.TAG_OWNER: "ml-platform",
        sweep.TAG_ENVIRONMENT: "trial",
    }
    if expires:
        out[sweep.TAG_EXPIRES] = expires
    out.update(extra)
    return out


def tag_list(d: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in d.items()]


def spec(resource_type: str, d: dict[str, str]) -> list[dict]:
    return [{"ResourceType": resource_type, "Tags": tag_list(d)}]


@pytest.fixture
def aws(moto_aws):
    """moto's AWS (tests/conftest.py) in this file's REGION."""
    assert REGION == "us-east-1"
    yield


class Recorder:
    """A client factory that records every mutating call (service, operation, first id)."""

    MUTATING = ("Delete", "Terminate", "Revoke", "Detach", "Cancel")

    def __init__(self, capacity: list[dict] | None = None, refuse: dict[str, str] | None = None):
        self.calls: list[tuple[str, str]] = []
        self.capacity = capacity or []
        self.refuse = refuse or {}  # operation name -> error code to raise
        self._clients: dict[tuple[str, str], object] = {}

    def __call__(self, service: str, region: str):
        key = (service, region)
        if key not in self._clients:
            client = boto3.client(service, region_name=region)
            client.meta.events.register("before-call", self._before)
            self._clients[key] = client
        return self._clients[key]

    def _before(self, model, params, **kwargs):
        op = model.name
        if op.startswith(self.MUTATING):
            self.calls.append((model.service_model.service_name, op))
        if op in self.refuse:
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": self.refuse[op], "Message": f"{op} refused by test"}}, op)
        if op == "DescribeCapacityReservations":
            # moto 5.2 does not implement capacity reservations: answer like EC2 would.
            from botocore.awsrequest import AWSResponse

            return (
                AWSResponse(None, 200, {}, None),
                {"CapacityReservations": self.capacity, "ResponseMetadata": {"HTTPStatusCode": 200}},
            )
        return None

    def ops(self) -> list[str]:
        return [op for _, op in self.calls]


def build_world() -> dict[str, str]:
    """An expired trial (b300), an active trial (gb300), a prod stack and a foreign resource."""
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ids: dict[str, str] = {"vpc": vpc, "subnet": subnet}

    ids["sg_expired"] = ec2.create_security_group(
        GroupName="b300-api", Description="api", VpcId=vpc, TagSpecifications=spec("security-group", tags("b300", PAST))
    )["GroupId"]
    ids["sg_active"] = ec2.create_security_group(
        GroupName="gb300-api", Description="api", VpcId=vpc, TagSpecifications=spec("security-group", tags("gb300", FUTURE))
    )["GroupId"]
    # The active group allows the expired one: that rule must be revoked before the delete.
    ec2.authorize_security_group_ingress(
        GroupId=ids["sg_active"],
        IpPermissions=[
            {"IpProtocol": "tcp", "FromPort": 8000, "ToPort": 8000, "UserIdGroupPairs": [{"GroupId": ids["sg_expired"]}]}
        ],
    )

    def instance(instance_type: str, instance_tags: dict, *groups: str) -> str:
        """One instance in the subnet with ``instance_tags`` (and security ``groups``); its id."""
        extra = {"SecurityGroupIds": list(groups)} if groups else {}
        return ec2.run_instances(
            ImageId=ami, MinCount=1, MaxCount=1, InstanceType=instance_type, SubnetId=subnet,
            TagSpecifications=spec("instance", instance_tags), **extra,
        )["Instances"][0]["InstanceId"]

    ids["i_expired"] = instance("p6-b300.48xlarge", tags("b300", PAST), ids["sg_expired"])
    ids["i_active"] = instance("p6-b300.48xlarge", tags("gb300", FUTURE))
    ids["i_prod"] = instance("p6-b300.48xlarge", {**tags("b300-prod"), sweep.TAG_ENVIRONMENT: "prod"})
    ids["i_foreign"] = instance("t3.micro", {"expires-at": PAST, "team": "other"})
    ids["i_retained"] = instance("t3.micro", tags("b300", PAST, **{sweep.TAG_RETAIN: "true"}))

    ids["eni_expired"] = ec2.create_network_interface(
        SubnetId=subnet, Groups=[ids["sg_expired"]], TagSpecifications=spec("network-interface", tags("b300", PAST))
    )["NetworkInterface"]["NetworkInterfaceId"]
    ids["vol_expired"] = ec2.create_volume(
        AvailabilityZone="us-east-1a", Size=100, Encrypted=True, TagSpecifications=spec("volume", tags("b300", PAST))
    )["VolumeId"]
    ids["vol_active"] = ec2.create_volume(
        AvailabilityZone="us-east-1a", Size=100, Encrypted=True, TagSpecifications=spec("volume", tags("gb300", FUTURE))
    )["VolumeId"]

    elb = boto3.client("elbv2", region_name=REGION)
    ids["lb_expired"] = elb.create_load_balancer(
        Name="b300-api", Subnets=[subnet], Type="network", Scheme="internal", Tags=tag_list(tags("b300", PAST))
    )["LoadBalancers"][0]["LoadBalancerArn"]

    fsx = boto3.client("fsx", region_name=REGION)
    lustre = {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 1000}
    ids["fs_expired"] = fsx.create_file_system(
        FileSystemType="LUSTRE",
        StorageCapacity=2400,
        SubnetIds=[subnet],
        LustreConfiguration=lustre,
        Tags=tag_list(tags("b300", PAST)),
    )["FileSystem"]["FileSystemId"]
    ids["fs_retained"] = fsx.create_file_system(
        FileSystemType="LUSTRE",
        StorageCapacity=2400,
        SubnetIds=[subnet],
        LustreConfiguration=lustre,
        Tags=tag_list(tags("b300", PAST, **{sweep.TAG_RETAIN: "true"})),
    )["FileSystem"]["FileSystemId"]

    eks = boto3.client("eks", region_name=REGION)
    role = "arn:aws:iam::123456789012:role/eks"
    eks.create_cluster(name="b300-eks", roleArn=role, resourcesVpcConfig={"subnetIds": [subnet]}, tags=tags("b300", PAST))
    # No expires-at of its own: inherits the cluster's.
    eks.create_nodegroup(
        clusterName="b300-eks",
        nodegroupName="gpu",
        nodeRole=role,
        subnets=[subnet],
        instanceTypes=["p6-b300.48xlarge"],
        tags={sweep.TAG_STACK: "b300"},
    )

    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="kimi-mirror-b300")
    s3.put_bucket_tagging(
        Bucket="kimi-mirror-b300",
        Tagging={"TagSet": tag_list(tags("b300", PAST, **{sweep.TAG_ROLE: sweep.ROLE_WEIGHTS_MIRROR, sweep.TAG_RETAIN: "true"}))},
    )
    s3.put_object(Bucket="kimi-mirror-b300", Key="models/kimi/.weights-complete.json", Body=b"{}")
    s3.create_bucket(Bucket="kimi-logs-b300")
    s3.put_bucket_tagging(Bucket="kimi-logs-b300", Tagging={"TagSet": tag_list(tags("b300", PAST))})
    return ids


def by_id(report: dict) -> dict[str, dict]:
    return {r["id"]: r for s in report["stacks"].values() for r in s["resources"]}


def instance_state(iid: str) -> str:
    ec2 = boto3.client("ec2", region_name=REGION)
    return ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]


def sweeper(rec: Recorder, *, destroy: bool, destroyer=None) -> sweep.Sweeper:
    # moto's cluster endpoints are made-up names: the API probe answers here, never through DNS
    # (the destroy path it decides is tested in tests/test_api_path.py).
    return sweep.Sweeper(rec, [REGION], NOW, destroy=destroy, destroyer=destroyer, wait_seconds=5, poll_seconds=0.01,
                         probe=lambda endpoint: (True, "answers"))


def test_dry_run_reports_expired_grouped_by_stack_and_deletes_nothing(aws):
    ids = build_world()
    rec = Recorder()
    report = sweeper(rec, destroy=False).run()

    assert rec.calls == []  # not a single mutating call
    assert instance_state(ids["i_expired"]) == "running"
    found = by_id(report)
    assert set(report["stacks"]) == {"b300", "gb300", "b300-prod"}
    assert report["stacks"]["b300"]["expired"] is True and report["stacks"]["gb300"]["expired"] is False
    for key in ("i_expired", "sg_expired", "eni_expired", "vol_expired", "lb_expired", "fs_expired"):
        assert found[ids[key]]["status"] == "would-delete", key
    assert found["b300-eks"]["status"] == "would-delete"
    assert found["b300-eks/gpu"]["status"] == "would-delete" and found["b300-eks/gpu"]["expires_at"] == PAST
    for key in ("i_active", "sg_active", "vol_active", "i_prod"):
        assert found[ids[key]]["status"] == "active", key
    assert ids["i_foreign"] not in found  # not ours: no kimi-deploy:stack tag
    assert found[ids["i_retained"]]["status"] == "kept"
    assert found[ids["fs_retained"]]["status"] == "kept"
    assert found["kimi-mirror-b300"]["status"] == "kept" and "retained" in found["kimi-mirror-b300"]["reason"]
    assert found["kimi-logs-b300"]["status"] == "kept"
    assert report["mode"] == "dry-run" and report["errors"] == []
    assert report["exit_code"] == 1  # expired resources exist (a check that fails)


def test_destroy_removes_expired_in_dependency_order_and_keeps_the_rest(aws):
    ids = build_world()
    rec = Recorder()
    report = sweeper(rec, destroy=True).run()

    found = by_id(report)
    assert report["summary"]["failed"] == 0, report
    assert report["exit_code"] == 0
    assert instance_state(ids["i_expired"]) == "terminated"
    for key in ("i_expired", "sg_expired", "eni_expired", "vol_expired", "lb_expired", "fs_expired"):
        assert found[ids[key]]["status"] == "deleted", key

    ec2 = boto3.client("ec2", region_name=REGION)
    groups = {g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]}
    assert ids["sg_expired"] not in groups and ids["sg_active"] in groups
    active = ec2.describe_security_groups(GroupIds=[ids["sg_active"]])["SecurityGroups"][0]
    assert not any(p.get("UserIdGroupPairs") for p in active["IpPermissions"])  # the reference was revoked
    volumes = {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}
    assert ids["vol_expired"] not in volumes and ids["vol_active"] in volumes
    for key in ("i_active", "i_prod", "i_foreign", "i_retained"):
        assert instance_state(ids[key]) == "running", key
    fsx = boto3.client("fsx", region_name=REGION)
    assert [f["FileSystemId"] for f in fsx.describe_file_systems()["FileSystems"]] == [ids["fs_retained"]]
    assert boto3.client("eks", region_name=REGION).list_clusters()["clusters"] == []
    s3 = boto3.client("s3", region_name=REGION)
    assert {b["Name"] for b in s3.list_buckets()["Buckets"]} == {"kimi-mirror-b300", "kimi-logs-b300"}
    assert s3.get_object(Bucket="kimi-mirror-b300", Key="models/kimi/.weights-complete.json")["Body"].read() == b"{}"

    ops = rec.ops()
    first = {op: ops.index(op) for op in reversed(ops)}
    assert first["DeleteNodegroup"] < first["DeleteCluster"]
    assert first["TerminateInstances"] < first["DeleteSecurityGroup"]
    assert first["DeleteLoadBalancer"] < first["DeleteNetworkInterface"] < first["DeleteSecurityGroup"]
    assert first["RevokeSecurityGroupIngress"] < first["DeleteSecurityGroup"]
    assert first["DeleteFileSystem"] < first["DeleteSecurityGroup"]
    assert first["TerminateInstances"] < first["DeleteVolume"]
    assert not any(op in ("DeleteBucket", "DeleteObject", "DeleteObjects") for op in ops)


def test_a_resource_that_refuses_deletion_fails_the_run(aws):
    ids = build_world()
    rec = Recorder(refuse={"TerminateInstances": "OperationNotPermitted"})
    report = sweeper(rec, destroy=True).run()
    found = by_id(report)
    assert found[ids["i_expired"]]["status"] == "failed"
    assert "OperationNotPermitted" in found[ids["i_expired"]]["reason"]
    assert report["exit_code"] == 1
    # The rest still went: one stuck instance does not stop the sweep.
    assert found[ids["fs_expired"]]["status"] == "deleted"


def test_cluster_with_a_retained_node_group_is_reported_not_forced(aws):
    """EKS refuses to delete a cluster that still has node groups: failure, exit 1."""
    build_world()
    eks = boto3.client("eks", region_name=REGION)
    eks.create_nodegroup(
        clusterName="b300-eks",
        nodegroupName="keep",
        nodeRole="arn:aws:iam::123456789012:role/eks",
        subnets=["subnet-1"],
        tags=tags("b300", PAST, **{sweep.TAG_RETAIN: "true"}),
    )
    report = sweeper(Recorder(), destroy=True).run()
    found = by_id(report)
    assert found["b300-eks/keep"]["status"] == "kept"
    assert found["b300-eks"]["status"] == "failed" and "nodegroup" in found["b300-eks"]["reason"].lower()
    assert report["exit_code"] == 1


def test_capacity_blocks_still_paid_are_reported_never_cancelled(aws):
    build_world()
    block = {
        "CapacityReservationId": "cr-0123456789abcdef0",
        "InstanceType": "p6e-gb300.36xlarge",
        "AvailabilityZone": "us-east-1a",
        "TotalInstanceCount": 2,
        "State": "active",
        "ReservationType": "capacity-block",
        "EndDate": datetime(2026, 12, 14, 11, 30, tzinfo=UTC),
        "Tags": tag_list(tags("gb300", PAST)),
    }
    ended = {**block, "CapacityReservationId": "cr-0fedcba9876543210", "State": "expired"}
    rec = Recorder(capacity=[block, ended])
    report = sweeper(rec, destroy=True).run()
    assert [r["id"] for r in report["still_paid"]] == ["cr-0123456789abcdef0"]
    paid = report["still_paid"][0]
    assert "capacity block" in paid["reason"] and "2026-12-14T11:30:00Z" in paid["reason"]
    assert not any("Capacity" in op for op in rec.ops())


def test_invalid_expiry_is_reported_not_swept(aws):
    ec2 = boto3.client("ec2", region_name=REGION)
    vol = ec2.create_volume(
        AvailabilityZone="us-east-1a", Size=10, TagSpecifications=spec("volume", tags("b300", "next tuesday"))
    )["VolumeId"]
    report = sweeper(Recorder(), destroy=True).run()
    found = by_id(report)
    assert found[vol]["status"] == "active" and "not an RFC 3339 time" in found[vol]["reason"]
    assert report["summary"]["invalid_expiry"] == 1
    assert vol in {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}


class FakeDestroyer:
    def __init__(self, available: bool):
        self._available = available
        self.stacks: list[str] = []

    def available(self) -> bool:
        return self._available

    def destroy(self, stack: str) -> sweep.DestroyOutcome:
        self.stacks.append(stack)
        return sweep.DestroyOutcome(stack, "destroyed")


def test_pulumi_destroy_runs_first_per_expired_stack_or_is_reported_skipped(aws):
    build_world()
    with_cli = FakeDestroyer(available=True)
    report = sweeper(Recorder(), destroy=True, destroyer=with_cli).run()
    assert with_cli.stacks == ["b300"]  # only the expired stack, once
    assert report["pulumi_destroy"] == [{"stack": "b300", "status": "destroyed", "reason": ""}]

    no_cli = FakeDestroyer(available=False)
    report = sweeper(Recorder(), destroy=False, destroyer=no_cli).run()
    assert no_cli.stacks == [] and report["pulumi_destroy"] == []  # dry run: never


def test_pulumi_destroy_without_cli_is_skipped_with_a_reason(aws, monkeypatch):
    build_world()
    monkeypatch.setattr(sweep.shutil, "which", lambda name: None)
    report = sweeper(Recorder(), destroy=True, destroyer=sweep.AutomationDestroyer()).run()
    assert report["pulumi_destroy"] == [
        {"stack": "b300", "status": "skipped", "reason": "pulumi CLI not found: deleting through the AWS APIs only"}
    ]
    assert report["exit_code"] == 0


def test_state_check_refuses_destroy_that_would_delete_a_retained_resource():
    deployment = {
        "resources": [
            {
                "urn": "urn:pulumi:b300::kimi-deploy::aws:s3/bucket:Bucket::mirror",
                "retainOnDelete": True,
                "outputs": {"tags": {sweep.TAG_ROLE: sweep.ROLE_WEIGHTS_MIRROR}},
            },
            {
                "urn": "urn:pulumi:b300::kimi-deploy::aws:fsx/lustreFileSystem:LustreFileSystem::fsx",
                "outputs": {"tags": {sweep.TAG_RETAIN: "true"}},
            },
            {
                "urn": "urn:pulumi:b300::kimi-deploy::aws:ec2/instance:Instance::gpu",
                "outputs": {"tags": {sweep.TAG_STACK: "b300"}},
            },
        ]
    }
    assert sweep.unsafe_retained_in_state(deployment) == [
        "urn:pulumi:b300::kimi-deploy::aws:fsx/lustreFileSystem:LustreFileSystem::fsx"
    ]


def test_cli_json_help_and_usage_errors(aws, capsys):
    build_world()
    rec = Recorder()
    code = sweep.main(["--region", REGION, "--now", "2026-12-10T00:00:00Z", "--json"], clients=rec)
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["mode"] == "dry-run" and out["summary"]["would_delete"] >= 7
    assert sweep.main(["--now", "yesterday"], clients=rec) == 2
    assert "not an ISO 8601 time" in capsys.readouterr().err
    code = sweep.main(["--region", REGION, "--now", "2026-11-01T00:00:00Z"], clients=rec)
    assert code == 0  # nothing expired yet at that time
    assert "kimi-deploy sweep" in capsys.readouterr().out


def test_help_explains_every_flag():
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "ops" / "sweep.py"), "--help"], capture_output=True, text=True, check=True
    )
    for flag in ("--region", "--now", "--destroy", "--json", "--no-pulumi", "--wait-seconds"):
        assert flag in proc.stdout
    assert "retain" in proc.stdout and "Exit 0" in proc.stdout


def test_honors_aws_endpoint_url(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:5999")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    client = sweep.default_client_factory("ec2", REGION)
    assert client.meta.endpoint_url == "http://127.0.0.1:5999"


def test_sweeps_a_moto_server_through_aws_endpoint_url(tmp_path):
    """End to end as CI runs it: a subprocess, a real HTTP endpoint, --destroy --json."""
    import socket

    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION,
        }
        env.pop("AWS_PROFILE", None)
        ec2 = boto3.client(
            "ec2",
            region_name=REGION,
            endpoint_url=env["AWS_ENDPOINT_URL"],
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        vol = ec2.create_volume(AvailabilityZone="us-east-1a", Size=10, TagSpecifications=spec("volume", tags("b300", PAST)))[
            "VolumeId"
        ]
        proc = subprocess.run(
            [
                sys.executable,
                str(REPO_ROOT / "scripts" / "ops" / "sweep.py"),
                "--region",
                REGION,
                "--now",
                "2026-12-10T00:00:00Z",
                "--destroy",
                "--no-pulumi",
                "--json",
                "--wait-seconds",
                "5",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        report = json.loads(proc.stdout)
        assert by_id(report)[vol]["status"] == "deleted"
        # moto's server does not implement DescribeCapacityReservations (it answers HTTP 500 with an
        # HTML page): that report-only kind is unknown, not an error, and nothing else failed.
        assert report["errors"] == [] and proc.returncode == 0, proc.stderr
        assert [u["kind"] for u in report["unknown"]] == ["capacity-reservation"]
        assert "ec2:DescribeCapacityReservations is not an AWS API response" in report["unknown"][0]["reason"]
        assert vol not in {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}
    finally:
        server.stop()


# --- new-user trial defects --------------------------------------------------------------------


@pytest.mark.parametrize("argv, needle", [
    (["--region", "x y"], "--region: 'x y' is not an AWS region name"),
    (["--region", "us-east-1", "--wait-seconds", "-1"], "--wait-seconds: -1 must be between 0"),
    (["--region", "us-east-1", "--wait-seconds", "nan"], "--wait-seconds: nan"),
    (["--regio", "us-east-1"], "unrecognized arguments: --regio"),  # no abbreviations
    (["--now"], "--now: expected one argument"),
])
def test_usage_errors_are_one_line_exit_2(argv, needle):
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "ops" / "sweep.py"), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"},
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, proc.stderr


def test_bad_region_from_the_environment_names_its_source(monkeypatch, capsys):
    monkeypatch.setenv("AWS_REGION", "us east")
    assert sweep.main([], clients=Recorder()) == 2
    assert "'us east' is not an AWS region name" in capsys.readouterr().err


def test_client_fails_fast_on_an_unreachable_endpoint(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    config = sweep.default_client_factory("ec2", REGION).meta.config
    assert config.connect_timeout <= 5 and config.read_timeout <= 30
    assert config.retries["mode"] == "standard" and config.retries["total_max_attempts"] <= 4  # was 9 attempts, adaptive


def test_unreachable_endpoint_is_exit_1_with_the_reason_in_seconds():
    import socket
    import time

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "ops" / "sweep.py"), "--region", REGION, "--region", "eu-west-1", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - started < 20
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    assert [e.split(":")[0] for e in report["errors"]] == [REGION, "eu-west-1"]  # one reason per region, not one per kind
    assert all("cannot reach the AWS endpoint" in e and "Could not connect" in e for e in report["errors"])


# --- the registry of kinds (scripts/ops/sweeping/registry.py, kinds.py) -----------------------------

from scripts.ops.sweeping import registry as sweep_registry  # noqa: E402  beside the tests that use it
from scripts.ops.sweeping.kinds import REGISTRY  # noqa: E402


def test_delete_order_is_built_from_the_registry_and_respects_every_dependency():
    order = sweep.DELETE_ORDER
    assert order == REGISTRY.delete_order()
    deletable = [k.name for k in REGISTRY if not k.report_only]
    assert sorted(order) == sorted(deletable) and len(set(order)) == len(order)
    for kind in REGISTRY:
        for before in kind.after:
            assert order.index(before) < order.index(kind.name), f"{before} must be deleted before {kind.name}"
        if kind.report_only:
            assert kind.name not in order and kind.delete is None and kind.gone is None
        else:
            assert callable(kind.delete) and callable(kind.gone) and callable(kind.discover)
    assert set(sweep.REPORT_ONLY_KINDS) == {"s3-bucket", "capacity-reservation"}


@pytest.mark.parametrize(
    "first, then",
    [
        ("eks-nodegroup", "eks-cluster"),  # EKS refuses to delete a cluster with node groups
        ("eks-cluster", "load-balancer"),  # the service controller would recreate the balancer
        ("load-balancer", "network-interface"),
        ("ec2-instance", "ebs-volume"),  # VolumeInUse until the instance is gone
        ("ec2-instance", "fsx-file-system"),
        ("fsx-file-system", "security-group"),
        ("network-interface", "security-group"),  # DependencyViolation while an interface is in it
        ("ec2-instance", "security-group"),
    ],
)
def test_dependencies_named_by_hand_hold(first, then):
    """Facts typed here independently of the registry: ``then`` is declared (directly or through
    others) to be deleted after ``first``, so a dependency dropped from the registry fails here
    even where registration order would still happen to put the kinds right."""
    closure, todo = set(), list(REGISTRY[then].after)
    while todo:
        name = todo.pop()
        if name not in closure:
            closure.add(name)
            todo.extend(REGISTRY[name].after)
    assert first in closure
    assert sweep.DELETE_ORDER.index(first) < sweep.DELETE_ORDER.index(then)


def _noop_discover(ctx):
    return []


def _noop_delete(client, found):
    return None


def _noop_gone(client, found):
    return True


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"delete": None, "gone": _noop_gone}, "has no delete"),
        ({"delete": _noop_delete, "gone": None}, "has no gone"),
        ({"delete": None, "gone": None}, "has no delete and no gone"),
        ({"delete": _noop_delete, "gone": _noop_gone, "report_only": True}, "is report-only"),
        ({"delete": _noop_delete, "gone": _noop_gone, "after": ("x",)}, "cannot be deleted after itself"),
    ],
)
def test_a_kind_without_delete_or_gone_fails_registration(kwargs, needle):
    reg = sweep_registry.Registry()
    with pytest.raises(sweep_registry.RegistrationError, match=needle):
        reg.register(sweep_registry.Kind("x", "xs", _noop_discover, **kwargs))
    assert "x" not in reg


def test_registry_rejects_duplicates_unknown_dependencies_and_cycles():
    def kind(name, *after):
        return sweep_registry.Kind(name, name + "s", _noop_discover, _noop_delete, _noop_gone, after=after)

    reg = sweep_registry.Registry()
    reg.register(kind("a"))
    with pytest.raises(sweep_registry.RegistrationError, match="already registered"):
        reg.register(kind("a"))
    reg.register(kind("b", "c"))
    with pytest.raises(sweep_registry.RegistrationError, match="deleted after c: not a deletable kind"):
        reg.delete_order()
    reg.register(kind("c", "b"))
    with pytest.raises(sweep_registry.RegistrationError, match="cycle: b, c"):
        reg.delete_order()


def test_delete_order_is_a_topological_sort_with_ties_in_registration_order():
    reg = sweep_registry.Registry()
    for name, after in (("sg", ("eni", "vm")), ("vm", ()), ("eni", ("vm",)), ("ng", ()), ("cluster", ("ng",))):
        reg.register(sweep_registry.Kind(name, name, _noop_discover, _noop_delete, _noop_gone, after=after))
    reg.register(sweep_registry.Kind("bucket", "buckets", _noop_discover, report_only=True))
    assert reg.delete_order() == ("vm", "eni", "sg", "ng", "cluster")
    assert reg.report_only() == ("bucket",)


def test_every_kind_is_discovered_and_its_label_names_it_in_errors(aws):
    """Each registered kind's discover runs (one failing kind is one error naming its label,
    the others are still listed)."""
    rec = Recorder(refuse={"DescribeVolumes": "UnauthorizedOperation"})
    seen = sweep.discover(rec, REGION, NOW)
    assert seen.errors == [f"{REGION}: could not list volumes: An error occurred (UnauthorizedOperation) when calling the "
                           "DescribeVolumes operation: DescribeVolumes refused by test"]
    assert seen.unknown == []
    assert {k.label for k in REGISTRY} >= {"volumes", "instances", "EKS clusters", "EKS node groups", "S3 buckets"}


def test_a_report_only_kind_that_cannot_be_listed_is_unknown_not_a_failure(aws, capsys):
    """Capacity reservations are only reported: when they cannot be listed the report says
    unknown (region, kind, reason) and the run still exits 0 on an empty account; a deletable
    kind that cannot be listed stays an error (exit 1): something expired could hide there."""
    report = sweeper(Recorder(refuse={"DescribeCapacityReservations": "UnauthorizedOperation"}), destroy=False).run()
    assert report["errors"] == [] and report["exit_code"] == 0
    assert report["summary"]["unknown"] == 1
    [unknown] = report["unknown"]
    assert unknown["region"] == REGION and unknown["kind"] == "capacity-reservation"
    assert unknown["reason"].startswith("capacity reservations could not be listed: An error occurred (UnauthorizedOperation)")
    sweep.render_table(report)
    out = " ".join(capsys.readouterr().out.split())
    assert f"unknown: {REGION}: capacity reservations could not be listed" in out and "unknown 1" in out

    report = sweeper(Recorder(refuse={"DescribeInstances": "UnauthorizedOperation"}), destroy=False).run()
    assert report["unknown"] == [] and report["exit_code"] == 1
    assert any("could not list instances" in e for e in report["errors"])



@pytest.mark.parametrize("value", ["yes", "YES", "1", "on", " True ", "keep"])
def test_retain_means_retain_in_any_spelling_but_false(aws, value):
    """New-user trial: `kimi-deploy:retain=yes` was a would-delete with an empty reason and --destroy terminated it."""
    ec2 = boto3.client("ec2", region_name=REGION)
    ami = ec2.describe_images()["Images"][0]["ImageId"]

    def instance(extra: dict[str, str]) -> str:
        return ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="t3.micro",
                                 TagSpecifications=spec("instance", tags("b300", PAST, **extra)))["Instances"][0]["InstanceId"]

    kept, swept = instance({sweep.TAG_RETAIN: value}), instance({sweep.TAG_RETAIN: "false"})
    dry = by_id(sweeper(Recorder(), destroy=False).run())
    assert dry[kept]["status"] == "kept" and dry[kept]["reason"] == f"retained: tagged {sweep.TAG_RETAIN}={value.strip()}"
    assert dry[swept]["status"] == "would-delete" and dry[swept]["reason"].startswith(f"expired: expires-at {PAST} ")
    rec = Recorder()
    sweeper(rec, destroy=True).run()
    assert instance_state(kept) == "running" and instance_state(swept) == "terminated"
    state = {"resources": [{"urn": "urn:i", "outputs": {"tags": {sweep.TAG_RETAIN: value}}}]}
    assert sweep.unsafe_retained_in_state(state) == ["urn:i"]  # pulumi destroy is not run over it either
