"""AWS and EKS rules a first `pulumi up` would hit (issue 10), each on the plans of every AWS stack
and of the variants that change the rule's outcome: Local Zone, capacity block, ODCR, extended
expiry. Preflight checks run against moto where it has the API and against answers recorded in
the API reference's shape (tests/fixtures, validated by botocore's Stubber) where it has not.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest

from components.core.config import eks_version_of, namespace_config, read_stack_config
from components.core.errors import ConfigError
from components.core.load import parse_spec
from components.core.sizing import compute_sizing
from components.core.targets import INSTANCES, is_local_zone
from components.core.versions import (
    EKS_EXTENDED_USD_PER_CLUSTER_HOUR,
    EKS_VERSION,
    EKS_VERSIONS,
    KUBERNETES_VERSION,
    eks_support_status,
)
from components.core.weights import mirror_key_prefix
from tests.conftest import FIXED_NOW, STACKS, TEST_DEPLOYER_CIDR, plan_for

FIXTURES = Path(__file__).parent / "fixtures"
AWS_STACKS = [s for s in STACKS if read_stack_config(s).get("kimi-deploy:platform", "").startswith("aws-")]
EKS_STACKS = [s for s in AWS_STACKS if read_stack_config(s)["kimi-deploy:platform"] == "aws-eks"]
LOCAL_ZONE = "us-east-1-dfw-2a"
RESERVATION = "cr-0fedcba9876543210"  # a stand-in: a shipped example id blocks `pulumi up`


def _with(stack: str, key: str, **changes) -> dict:
    """The stack's ``kimi-deploy:<key>`` object with ``changes`` merged (one level deep)."""
    out = copy.deepcopy(read_stack_config(stack).get(f"kimi-deploy:{key}", {}))
    for k, v in changes.items():
        out[k] = {**out.get(k, {}), **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _capacity(stack: str, cap_type: str, az: str) -> dict:
    compute = _with(stack, "compute")
    compute.pop("availabilityZone", None)
    if cap_type == "on-demand":
        compute["capacity"] = {"type": "on-demand"}
        compute["availabilityZone"] = az
    else:
        compute["capacity"] = {"type": cap_type, "reservationId": RESERVATION, "availabilityZone": az}
    return {"kimi-deploy:compute": compute}


# Variants per stack: the stack as written, plus what changes the rules' outcomes.
VARIANTS: dict[str, dict] = {
    "b300": {},
    "b300-capacity-block": _capacity("b300", "capacity-block", "us-east-1c"),
    "b300-odcr": _capacity("b300", "odcr", "us-east-1a"),
    "gb300": {},
    "gb300-local-zone": _capacity("gb300", "capacity-block", LOCAL_ZONE),
    "b300-prod": {},
    "b300-prod-on-demand": _capacity("b300-prod", "on-demand", "us-east-1a"),
}


def variant_plan(name: str):
    stack = name.split("-capacity")[0].split("-odcr")[0].split("-local")[0].split("-on-demand")[0]
    return plan_for(stack, overrides=VARIANTS[name] or None)


# -- 1. EKS version inside standard support ------------------------------------------------------


@pytest.mark.parametrize("variant", ["gb300", "gb300-local-zone", "b300-prod", "b300-prod-on-demand"])
def test_every_eks_plan_runs_a_version_in_standard_support(variant):
    run = variant_plan(variant)
    spec = run.context.spec
    assert spec.platform == "aws-eks"
    cluster = run.named("eks-cluster").inputs
    assert cluster["version"] == eks_version_of(spec.config) == EKS_VERSION
    assert cluster["upgradePolicy"] == {"supportType": "STANDARD"}
    assert eks_support_status(cluster["version"], FIXED_NOW) == "standard"
    # DRA (resource.k8s.io/v1, ComputeDomains) is GA from 1.34.
    assert tuple(int(x) for x in cluster["version"].split(".")) >= (1, 34)


def test_schema_version_of_the_tests_is_the_eks_version_and_ships_with_kubernetes_validate():
    import kubernetes_validate

    assert KUBERNETES_VERSION == EKS_VERSION
    assert any(kubernetes_validate.utils.major_minor(v) == KUBERNETES_VERSION for v in kubernetes_validate.utils.all_versions())


def _eks_spec(now: datetime = FIXED_NOW, **kubernetes):
    ns, _ = namespace_config(read_stack_config("gb300"))
    ns["kubernetes"] = {**ns.get("kubernetes", {}), **kubernetes}
    return parse_spec(ns, stack="gb300", now=now)


def test_a_version_out_of_standard_support_needs_extended_chosen_and_states_its_price():
    with pytest.raises(ConfigError) as info:
        _eks_spec(eksVersion="1.33")
    msg = str(info.value)
    assert msg.startswith("kimi-deploy:kubernetes.eksVersion: '1.33'") and "2026-07-29" in msg
    assert "EXTENDED" in msg and f"{EKS_EXTENDED_USD_PER_CLUSTER_HOUR:.2f}" in msg and "1.35" in msg
    # 1.33 is too old for DRA anyway; 1.34 is in standard support on the test clock, out of it a week later.
    assert _eks_spec(eksVersion="1.34").config.kubernetes.eks_version == "1.34"
    later = FIXED_NOW + timedelta(days=7)
    with pytest.raises(ConfigError, match="left standard support on 2026-12-02"):
        _eks_spec(now=later, eksVersion="1.34")
    spec = _eks_spec(now=later, eksVersion="1.34", eksSupportType="EXTENDED")
    assert any("extended support" in w and "0.60" in w for w in spec.warnings)
    assert plan_for(
        "gb300", overrides={"kimi-deploy:kubernetes": _with("gb300", "kubernetes", eksVersion="1.34", eksSupportType="EXTENDED")}
    ).named("eks-cluster").inputs["upgradePolicy"] == {"supportType": "EXTENDED"}


def test_the_default_follows_the_clock_unknown_and_unsupported_versions_are_refused():
    # The default is checked against the run's clock too: past 2027-03-27 it must be bumped.
    with pytest.raises(ConfigError, match="kubernetes.eksVersion: '1.35' left standard support on 2027-03-27"):
        _eks_spec(now=datetime(2027, 4, 1, tzinfo=UTC))
    with pytest.raises(ConfigError, match="is not a known EKS version"):
        _eks_spec(eksVersion="1.99")
    with pytest.raises(ConfigError, match="too old"):
        _eks_spec(eksVersion="1.32", eksSupportType="EXTENDED")
    ns, _ = namespace_config(read_stack_config("b300"))
    ns["kubernetes"] = {"eksVersion": "1.35"}
    with pytest.raises(ConfigError, match="is read only on aws-eks"):
        parse_spec(ns, stack="b300", now=FIXED_NOW)


def test_the_version_table_is_fourteen_months_standard_then_twelve_extended():
    for v in EKS_VERSIONS.values():
        standard_days = (v.end_of_standard_support - v.released).days
        assert 14 * 30 - 10 <= standard_days <= 14 * 31 + 5, v
        assert 365 <= (v.end_of_extended_support - v.end_of_standard_support).days <= 366, v
    assert EKS_VERSIONS["1.34"].end_of_standard_support.isoformat() == "2026-12-02"
    assert EKS_VERSIONS["1.33"].end_of_standard_support.isoformat() == "2026-07-29"


def _recorded(name: str, operation: str, service: str, params: dict | None = None, tweak=None):
    """A botocore client answering ``operation`` once with the recorded fixture ``name``; the
    Stubber validates the answer against botocore's model, so the fixture has the API's shape."""
    from botocore.stub import ANY, Stubber

    answer = json.loads((FIXTURES / name).read_text())
    answer.pop("_source")
    for item in answer.get("clusterVersions", []):
        for key in ("releaseDate", "endOfStandardSupportDate", "endOfExtendedSupportDate"):
            item[key] = datetime.fromisoformat(item[key].replace("Z", "+00:00"))
    if tweak:
        tweak(answer)
    client = boto3.client(service, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    stub.add_response(operation, answer, {k: ANY for k in (params or {})} or None)
    stub.activate()
    return client


def _preflight():
    from scripts.ops import preflight

    return preflight


def test_preflight_eks_version_against_a_recorded_describe_cluster_versions():
    preflight = _preflight()
    spec = plan_for("gb300").context.spec

    def check(spec, tweak=None):
        client = _recorded("eks_describe_cluster_versions.json", "describe_cluster_versions", "eks",
                           {"clusterVersions": 1, "includeAll": 1}, tweak)
        clients = preflight.AwsClients("us-east-1", overrides={"eks:DescribeClusterVersions": client})
        return preflight.check_eks_version(spec, clients, FIXED_NOW)

    ok = check(spec)
    assert ok.status == "pass" and "1.35" in ok.reason and "2027-03-27" in ok.reason

    def moved(answer):
        answer["clusterVersions"][0]["endOfStandardSupportDate"] = datetime(2027, 2, 1, tzinfo=UTC)

    assert check(spec, moved).status == "warn"  # the table disagrees with EKS: update it

    extended = _eks_spec(now=FIXED_NOW, eksVersion="1.34")

    def ended(answer):
        answer["clusterVersions"][1].update(versionStatus="EXTENDED_SUPPORT", status="extended-support")

    bad = check(extended, ended)
    assert bad.status == "fail" and "refuses supportType STANDARD" in bad.reason
    assert preflight.check_eks_version(plan_for("b300").context.spec, None, FIXED_NOW).status == "skip"


# -- 2. Local Zones ---------------------------------------------------------------------------------


def test_local_zone_names():
    assert is_local_zone(LOCAL_ZONE) and is_local_zone("us-west-2-lax-1a")
    assert not is_local_zone("us-east-1a") and not is_local_zone(None)


@pytest.mark.parametrize("variant", ["gb300", "gb300-local-zone", "b300-prod", "b300", "b300-capacity-block"])
def test_control_plane_nat_and_public_subnet_never_in_a_local_zone(variant):
    run = variant_plan(variant)
    spec = run.context.spec
    subnets = {r.name: r.inputs for r in run.of_type("aws:ec2/subnet:Subnet")}
    gpu_zone = subnets["net-private-gpu"]["availabilityZone"]
    assert gpu_zone == spec.availability_zone
    local = is_local_zone(gpu_zone)
    assert local == (variant == "gb300-local-zone")
    nat_subnet = run.named("net-nat").inputs["subnetId"]
    public_zone = subnets[nat_subnet.removesuffix("-id")]["availabilityZone"]
    assert not is_local_zone(public_zone)
    if spec.platform == "aws-eks":
        cluster_subnets = [s.removesuffix("-id") for s in run.named("eks-cluster").inputs["vpcConfig"]["subnetIds"]]
        zones = [subnets[s]["availabilityZone"] for s in cluster_subnets]
        assert len(set(zones)) == 2 and not any(is_local_zone(z) for z in zones)
        assert run.named("eks-system").inputs["subnetIds"] == run.named("eks-cluster").inputs["vpcConfig"]["subnetIds"]
        assert run.named("eks-gpu").inputs["subnetIds"] == ["net-private-gpu-id"]
        # Internal load balancers only in parent-region subnets (no NLB in a Local Zone).
        elb = {n for n, s in subnets.items() if s["tags"].get("kubernetes.io/role/internal-elb") == "1"}
        assert elb == set(cluster_subnets)
    if local:
        assert "net-private-gpu" not in cluster_subnets and public_zone != gpu_zone
    else:
        # A regular AZ: the GPU subnet is one of the control plane's, the NAT sits in the GPU AZ.
        assert public_zone == gpu_zone


def test_local_zone_with_fsx_warns_and_an_existing_vpc_needs_parent_region_subnets():
    ns, _ = namespace_config(copy.deepcopy({**read_stack_config("b300-prod"), **_capacity("b300-prod", "odcr", "us-east-1a")}))
    ns["compute"]["capacity"]["availabilityZone"] = "us-east-1-mia-2a"
    ns["compute"].pop("availabilityZone", None)
    ns["storage"]["kind"] = "nvme-from-fsx"
    # b300 has offering facts: a Local Zone outside them is refused (preflight then asks EC2).
    with pytest.raises(ConfigError, match="does not offer p6-b300.48xlarge"):
        parse_spec(ns, stack="b300-prod", now=FIXED_NOW)
    lz = copy.deepcopy({**read_stack_config("gb300"), **VARIANTS["gb300-local-zone"]})
    ns, _ = namespace_config(lz)
    ns["storage"] = {**ns.get("storage", {}), "kind": "nvme-from-fsx"}
    spec = parse_spec(ns, stack="gb300", now=FIXED_NOW)
    assert any("Local Zone" in w and "FSx" in w for w in spec.warnings)
    only_lz = {
        "kimi-deploy:network": {
            "vpcId": "vpc-0123456789abcdef0",
            "privateSubnetIds": ["subnet-0123456789abcdef0"],
            "allowedCidrs": ["10.0.0.0/8"],
            "apiServerPublicCidrs": [TEST_DEPLOYER_CIDR],
        }
    }
    with pytest.raises(Exception, match="parent-region AZs"):
        plan_for("gb300", overrides={**VARIANTS["gb300-local-zone"], **only_lz})


def test_preflight_reads_the_zone_type(monkeypatch):
    preflight = _preflight()
    lz = variant_plan("gb300-local-zone").context.spec

    def zones(kind: str, opted: str = "opted-in"):
        from botocore.stub import ANY, Stubber

        client = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
        stub = Stubber(client)
        zone = {"ZoneName": LOCAL_ZONE, "ZoneType": kind, "OptInStatus": opted, "GroupName": "us-east-1-dfw-2",
                "ParentZoneName": "us-east-1d", "RegionName": "us-east-1", "State": "available"}
        stub.add_response(
            "describe_availability_zones", {"AvailabilityZones": [zone]}, {"ZoneNames": ANY, "AllAvailabilityZones": ANY}
        )
        stub.activate()
        return preflight.AwsClients("us-east-1", overrides={"ec2:DescribeAvailabilityZones": client})

    assert preflight.check_zone_type(lz, zones("local-zone")).status == "pass"
    assert preflight.check_zone_type(lz, zones("local-zone", "not-opted-in")).status == "fail"
    assert preflight.check_zone_type(lz, zones("wavelength-zone")).status == "fail"
    # An AZ under moto: availability-zone, as the plan assumed.
    from moto import mock_aws

    for var in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        check = preflight.check_zone_type(
            plan_for("gb300").context.spec, preflight.AwsClients("us-east-1", session=boto3.session.Session())
        )
    assert check.status == "pass" and "availability zone" in check.reason


# -- 3. Instance facts from the API, EFA layout per family -------------------------------------------


def _moto_instance_type(name: str) -> dict:
    import gzip

    import moto

    data = json.load(gzip.open(Path(moto.__file__).parent / "ec2" / "resources" / "instance_types.json.gz"))
    return data[name]


def test_b300_facts_match_moto_and_every_mismatch_is_named():
    preflight = _preflight()
    inst = INSTANCES["p6-b300.48xlarge"]
    gpu = plan_for("b300").context.spec.target.gpu
    it = _moto_instance_type("p6-b300.48xlarge")
    assert preflight.instance_fact_mismatches(inst, gpu, it) == []
    bad = copy.deepcopy(it)
    bad["MemoryInfo"]["SizeInMiB"] = 2 * 1024 * 1024
    bad["ProcessorInfo"]["SupportedArchitectures"] = ["arm64"]
    bad["InstanceStorageInfo"]["Disks"][0]["Count"] = 4
    bad["NetworkInfo"]["NetworkCards"][3]["InterfaceTypes"] = ["interface"]
    bad["NetworkInfo"]["MaximumNetworkCards"] = 16
    bad["VCpuInfo"]["DefaultVCpus"] = 96
    problems = " | ".join(preflight.instance_fact_mismatches(inst, gpu, bad))
    for needle in (
        "memory",
        "architectures",
        "instance-store disks",
        "network card 3 takes interface",
        "EFA layout takes no efa-only",
        "16 network cards",
        "96 vCPUs",
    ):
        assert needle in problems, needle


def test_gb300_facts_against_the_recorded_unverified_answer():
    preflight = _preflight()
    spec = plan_for("gb300").context.spec
    assert spec.instance.facts_source.startswith("unverified")
    client = _recorded("ec2_describe_instance_types_p6e_gb300.json", "describe_instance_types", "ec2", {"InstanceTypes": 1})
    check, known = preflight.check_instance_facts(
        spec, preflight.AwsClients("us-east-1", overrides={"ec2:DescribeInstanceTypes": client})
    )
    assert known is True and check.status == "pass", check.reason
    # The same answer with 8 EFA-capable cards only (even cards ENA) still fits the odd-card layout...
    def even_ena(answer):
        for card in answer["InstanceTypes"][0]["NetworkInfo"]["NetworkCards"][2::2]:
            card["InterfaceTypes"] = ["interface", "efa"]

    client = _recorded(
        "ec2_describe_instance_types_p6e_gb300.json", "describe_instance_types", "ec2", {"InstanceTypes": 1}, even_ena
    )
    check, _ = preflight.check_instance_facts(
        spec, preflight.AwsClients("us-east-1", overrides={"ec2:DescribeInstanceTypes": client})
    )
    # ...but differs from the recorded per-card types, which preflight reports.
    assert check.status == "fail" and "network card 2 takes interface/efa" in check.reason and "EFA layout" not in check.reason


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_launch_template_efa_interfaces_follow_the_family_layout(variant):
    run = variant_plan(variant)
    spec = run.context.spec
    inst = spec.instance
    for lt in run.of_type("aws:ec2/launchTemplate:LaunchTemplate"):
        nics = lt.inputs.get("networkInterfaces") or []
        efa = sorted(n["networkCardIndex"] for n in nics if n["interfaceType"] == "efa-only")
        if not nics:
            continue
        assert spec.efa_enabled
        assert efa == sorted(inst.efa_cards)
        for card in efa:
            assert "efa-only" in inst.network_card_interface_types[card]
        assert len(efa) <= inst.efa_interfaces
    if spec.target.name == "gb300":
        assert inst.efa_cards == (1, 3, 5, 7, 9, 11, 13, 15)  # P6e: odd cards, 8 (4 or 8 recommended)


# -- 4. Updates on reserved capacity ----------------------------------------------------------------


@pytest.mark.parametrize("variant", ["gb300", "gb300-local-zone", "b300-prod", "b300-prod-on-demand"])
def test_reserved_gpu_node_groups_update_minimal_and_replace_delete_first(variant, monkeypatch):
    import pulumi_aws

    seen: dict[str, bool] = {}
    original = pulumi_aws.eks.NodeGroup

    class Recording(original):  # type: ignore[misc,valid-type]
        def __init__(self, name, *args, opts=None, **kwargs):
            seen[name] = bool(opts and opts.delete_before_replace)
            super().__init__(name, *args, opts=opts, **kwargs)

    monkeypatch.setattr(pulumi_aws.eks, "NodeGroup", Recording)
    overrides = VARIANTS[variant] or {"kimi-deploy:owner": read_stack_config(variant)["kimi-deploy:owner"]}  # uncached
    stack = "gb300" if variant.startswith("gb300") else "b300-prod"
    run = plan_for(stack, overrides=overrides)
    reserved = run.context.spec.config.compute.capacity.type in ("odcr", "capacity-block")
    assert reserved == (variant != "b300-prod-on-demand")
    update = run.named("eks-gpu").inputs["updateConfig"]
    assert update == {"maxUnavailable": 1, "updateStrategy": "MINIMAL" if reserved else "DEFAULT"}
    assert seen["eks-gpu"] is reserved
    assert seen["eks-system"] is False


# -- 5. Extending a trial does not recycle GPUs -------------------------------------------------------


GPU_TYPES = ("aws:ec2/instance:Instance", "aws:ec2/launchTemplate:LaunchTemplate", "aws:eks/nodeGroup:NodeGroup")


def _doc(run) -> dict:
    return {"resources": [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in run.resources]}


@pytest.mark.parametrize("variant", [v for v in VARIANTS if not v.startswith("b300-prod")])
def test_extending_the_expiry_changes_no_gpu_resource_in_a_way_that_replaces_or_recycles_it(variant):
    from scripts.ops.plan_diff import diff_documents

    base = dict(VARIANTS[variant])
    first = plan_for(
        variant.split("-")[0], overrides={**base, "kimi-deploy:expiresAt": (FIXED_NOW + timedelta(hours=40)).isoformat()}
    )
    later = plan_for(
        variant.split("-")[0], overrides={**base, "kimi-deploy:expiresAt": (FIXED_NOW + timedelta(hours=300)).isoformat()}
    )
    diff = diff_documents(_doc(first), _doc(later))
    assert diff["added"] == [] and diff["removed"] == []
    changed = {c["name"]: c for c in diff["changed"]}
    assert changed, "the expiry tag must change somewhere (else the test proves nothing)"
    # The expiry stop moves with the expiry, in place: the schedule's time, and on EC2 the
    # parameter the instance reads it from (components/aws/expiry.py).
    moves = {"aws:scheduler/schedule:Schedule": {"scheduleExpression"}, "aws:ssm/parameter:Parameter": {"insecureValue"}}
    for c in diff["changed"]:
        paths = {f["path"].split(".")[0] for f in c["fields"]}
        assert paths <= {"tags", "metadata"} | moves.get(c["type"], set()), (c["name"], paths)
        if c["type"] in GPU_TYPES or c["type"] in moves:
            assert c["action"] == "update" and not c["disruptive"], c
    schedules = later.of_type("aws:scheduler/schedule:Schedule")  # on EKS also the Launch suspension
    assert schedules and all(s.inputs["scheduleExpression"] == "at(2026-12-13T00:00:00)" for s in schedules)
    for lt in later.of_type("aws:ec2/launchTemplate:LaunchTemplate"):
        for spec in lt.inputs.get("tagSpecifications", []):
            assert "expires-at" not in spec["tags"]
    # ...while the GPU resources themselves carry the new expiry (the sweeper reads it there).
    gpu = [r for r in later.resources if r.type in ("aws:ec2/instance:Instance", "aws:eks/nodeGroup:NodeGroup")]
    assert gpu and all(r.inputs["tags"]["expires-at"].startswith("2026-12-13") for r in gpu)


def test_plan_diff_marks_a_launch_template_version_change_as_replacing_the_instance():
    from scripts.ops.plan_diff import diff_documents

    run = plan_for("b300")
    old = _doc(run)
    new = copy.deepcopy(old)
    lt = next(r for r in new["resources"] if r["name"] == "gpu-lt")
    lt["inputs"]["userData"] = "Y2hhbmdlZA=="
    diff = diff_documents(old, new)
    instance = next(c for c in diff["changed"] if c["name"] == "gpu-instance")
    assert instance["action"] == "replace" and instance["fields"][0]["path"] == "launchTemplate.version"
    assert diff["summary"]["replaced"] == 1
    # A tag-only change of the template makes no version: nothing follows.
    new = copy.deepcopy(old)
    next(r for r in new["resources"] if r["name"] == "gpu-lt")["inputs"]["tags"]["Name"] = "x"
    assert [c["name"] for c in diff_documents(old, new)["changed"]] == ["gpu-lt"]
    # Node groups following a new version are recycled (disruptive), not replaced.
    gb = _doc(plan_for("gb300"))
    new = copy.deepcopy(gb)
    next(r for r in new["resources"] if r["name"] == "eks-gpu-lt")["inputs"]["tagSpecifications"] = []
    ng = next(c for c in diff_documents(gb, new)["changed"] if c["name"] == "eks-gpu")
    assert ng["action"] == "update" and ng["disruptive"]


# -- 6. No role reads a parameter or secret outside its own; parliament finds nothing ----------------


SECRET_READ_ACTIONS = ("ssm:getparameter", "ssm:getparameters", "ssm:getparametersbypath", "ssm:getparameterhistory",
                       "secretsmanager:getsecretvalue", "kms:decrypt")
# The statement of AmazonSSMManagedInstanceCore that reads parameters (AWS managed policy
# reference, version v3): what the walker must catch if the policy comes back.
SSM_MANAGED_INSTANCE_CORE_READS = {"Effect": "Allow", "Action": ["ssm:GetParameter", "ssm:GetParameters"], "Resource": "*"}
# Managed policies the stacks attach, checked against the AWS managed policy reference: none
# grants any of SECRET_READ_ACTIONS.
MANAGED_WITHOUT_SECRET_READS = {
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryPullOnly",
    "AmazonEKSClusterPolicy",
}


def _allows(pattern: str, action: str) -> bool:
    import fnmatch

    return fnmatch.fnmatchcase(action, pattern.lower())


def secret_reads_outside(doc: dict, own: set[str]) -> list[str]:
    """Statements of ``doc`` that allow reading a parameter or secret not in ``own`` (ARNs)."""
    import fnmatch

    bad = []
    for st in doc["Statement"]:
        if st.get("Effect") != "Allow":
            continue
        actions = [a.lower() for a in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])]
        resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        if not any(_allows(p, a) for p in actions for a in SECRET_READ_ACTIONS):
            continue
        for res in resources:
            # A resource that matches anything besides our own ARNs reaches outside.
            if res not in own or any(ch in res for ch in "*?"):
                if not (res in own and not any(fnmatch.fnmatchcase(o, res) and o != res for o in own)):
                    bad.append(f"{actions} on {res}")
    return bad


def _role_documents(run) -> dict[str, list[dict]]:
    """Role resource name -> its policy documents (inline, and the recorded reads of managed
    ones). Policies are named ``<role>-<policy>`` (iam.role), which attributes them."""
    docs: dict[str, list[dict]] = {r.name: [] for r in run.of_type("aws:iam/role:Role")}

    def owner_of(name: str) -> str:
        return max((r for r in docs if name.startswith(r + "-")), key=len)

    for pol in run.of_type("aws:iam/rolePolicy:RolePolicy"):
        docs[owner_of(pol.name)].append(json.loads(pol.inputs["policy"]))
    for att in run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment"):
        name = att.inputs["policyArn"].rsplit("/", 1)[1]
        owner = owner_of(att.name)
        if name == "AmazonSSMManagedInstanceCore":
            docs.setdefault(owner, []).append({"Statement": [SSM_MANAGED_INSTANCE_CORE_READS]})
        else:
            assert name in MANAGED_WITHOUT_SECRET_READS, f"{name}: check the managed policy reference and list it"
    return docs


def test_the_walker_catches_account_wide_parameter_reads():
    own = {"arn:aws:ssm:us-east-1:123456789012:parameter/kimi-deploy/b300/vllm-api-key"}
    assert secret_reads_outside({"Statement": [SSM_MANAGED_INSTANCE_CORE_READS]}, own)
    assert secret_reads_outside(
        {
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": "ssm:Get*",
                    "Resource": "arn:aws:ssm:us-east-1:123456789012:parameter/kimi-deploy/*",
                }
            ]
        },
        own,
    )
    assert secret_reads_outside({"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}, own)
    assert not secret_reads_outside(
        {"Statement": [{"Effect": "Allow", "Action": "ssm:GetParameter", "Resource": sorted(own)}]}, own
    )


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_no_role_reads_a_parameter_or_secret_outside_its_own(variant):
    run = variant_plan(variant)
    own = {
        r.inputs.get("arn") or f"arn:aws:ssm:us-east-1:123456789012:parameter{r.inputs['name']}"
        for r in run.of_type("aws:ssm/parameter:Parameter")
    }
    assert not run.of_type("aws:secretsmanager/secret:Secret")
    roles = _role_documents(run)
    assert roles
    for role, docs in roles.items():
        for doc in docs:
            assert secret_reads_outside(doc, own) == [], role
    attached = {a.inputs["policyArn"].rsplit("/", 1)[1] for a in run.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")}
    assert "AmazonSSMManagedInstanceCore" not in attached
    # Session Manager still works: every instance or node role has the channel actions.
    for role in run.of_type("aws:iam/role:Role"):
        if "ec2.amazonaws.com" in role.inputs["assumeRolePolicy"]:
            actions = {
                a
                for d in roles[role.name]
                for st in d["Statement"]
                for a in (st["Action"] if isinstance(st["Action"], list) else [st["Action"]])
            }
            assert {
                "ssm:UpdateInstanceInformation",
                "ssmmessages:OpenDataChannel",
                "ssmmessages:CreateControlChannel",
            } <= actions, role.name


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_parliament_finds_nothing_in_any_identity_policy(stack):
    from parliament import analyze_policy_string

    assert [
        f.issue
        for f in analyze_policy_string(
            json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObjekt", "Resource": "*"}]})
        ).findings
    ]
    run = plan_for(stack)
    docs = [r.inputs["policy"] for r in run.of_type("aws:iam/rolePolicy:RolePolicy")]
    assert docs
    for doc in docs:
        findings = [(f.issue, f.detail) for f in analyze_policy_string(doc).findings]
        assert findings == [], (doc, findings)


# -- 7. Publishers write only their revision -----------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_write_rights_on_the_mirror_cover_only_the_stacks_revision(variant):
    run = variant_plan(variant)
    from components.core import engine_cache

    spec = run.context.spec
    revision = mirror_key_prefix(spec)
    writers = cache_writers = 0
    for pol in run.of_type("aws:iam/rolePolicy:RolePolicy"):
        for st in json.loads(pol.inputs["policy"])["Statement"]:
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            if any(a in ("s3:PutObject", "s3:DeleteObject", "s3:*", "*") for a in actions):
                if pol.name.endswith("-engine-cache"):
                    # The vLLM pods' engine-cache save (aws-eks): the revision's _engine-cache/ only, no delete.
                    cache_writers += 1
                    assert st["Resource"] == f"arn:aws:s3:::mirror-bucket-a1b2c3d/{engine_cache.cache_key_prefix(spec)}/*"
                    assert not any(a in ("s3:DeleteObject", "s3:*", "*") for a in actions), pol.name
                    continue
                writers += 1
                assert st["Resource"] == f"arn:aws:s3:::mirror-bucket-a1b2c3d/{revision}/*", pol.name
    assert writers == 1  # the EC2 instance, or the EKS publish Job's role: the serving side never writes weights
    assert cache_writers == (spec.platform == "aws-eks" and engine_cache.restored_at_start(spec))


# -- 8. GB300: the block is the bill ----------------------------------------------------------------


def test_gb300_is_priced_as_the_whole_ultraserver_block_and_warns_about_idle_trays():
    overrides = {"kimi-deploy:compute": _with("gb300", "compute", capacity={"usdPerHour": 50.0})}
    ns, _ = namespace_config(copy.deepcopy({**read_stack_config("gb300"), **overrides}))
    spec = parse_spec(ns, stack="gb300", now=FIXED_NOW)
    sizing = compute_sizing(spec)
    assert spec.gpu_nodes == 2 and spec.instance.ultraserver_instances == (18,)
    assert sizing.usd_per_hour == pytest.approx(18 * 50.0)
    assert "18 p6e-gb300.36xlarge in the UltraServer block (2 used)" in sizing.price_source
    assert any("16 trays sit idle" in w for w in spec.warnings)
    # Two UltraServers bought, 36 trays: priced as bought.
    ns["compute"]["capacity"]["blockInstances"] = 36
    assert compute_sizing(parse_spec(ns, stack="gb300", now=FIXED_NOW)).usd_per_hour == pytest.approx(36 * 50.0)
    ns["compute"]["capacity"]["blockInstances"] = 20
    with pytest.raises(ConfigError, match="blockInstances: 20 is not a whole number of UltraServers"):
        parse_spec(ns, stack="gb300", now=FIXED_NOW)
    # The plan shows it.
    assert "UltraServer block" in plan_for("gb300").context.sizing.price_source


def test_per_instance_capacity_blocks_are_priced_per_instance():
    run = variant_plan("b300-capacity-block")
    assert run.context.spec.instance.ultraserver_instances == ()
    ns, _ = namespace_config(copy.deepcopy({**read_stack_config("b300"), **VARIANTS["b300-capacity-block"]}))
    ns["compute"]["capacity"]["usdPerHour"] = 60.0
    assert compute_sizing(parse_spec(ns, stack="b300", now=FIXED_NOW)).usd_per_hour == pytest.approx(60.0)
    ns["compute"]["capacity"]["blockInstances"] = 2
    with pytest.raises(ConfigError, match="only for UltraServer capacity blocks"):
        parse_spec(ns, stack="b300", now=FIXED_NOW)


# -- 9. What Kubernetes creates carries the stack's tags ------------------------------------------------


def test_internal_nlb_services_carry_the_stacks_tags():
    from components.k8s.vllm_service import LB_ADDITIONAL_TAGS_ANNOTATION

    run = plan_for("b300-prod")
    assert run.context.spec.config.kubernetes.service_type == "internal-nlb"
    services = [
        r for r in run.resources if r.type == "kubernetes:core/v1:Service" and r.inputs["spec"].get("type") == "LoadBalancer"
    ]
    assert len(services) == 1
    value = services[0].inputs["metadata"]["annotations"][LB_ADDITIONAL_TAGS_ANNOTATION]
    pairs = dict(p.split("=", 1) for p in value.split(","))
    assert pairs == run.context.spec.tags and pairs["kimi-deploy:stack"] == "b300-prod"



def _k8s_world(cluster: str = "kimi-deploy-gb300") -> dict[str, str]:
    """An expired EKS stack whose cluster left what Kubernetes created: an NLB tagged only for
    the cluster (legacy service controller), a CNI interface, an LBC security group; and the
    same kinds for a foreign cluster."""
    sweep = _sweep()
    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.44.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.44.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    ours = {
        sweep.TAG_STACK: "gb300",
        sweep.TAG_OWNER: "ml-platform",
        sweep.TAG_ENVIRONMENT: "trial",
        sweep.TAG_EXPIRES: "2026-11-01T00:00:00Z",
    }
    eks = boto3.client("eks", region_name="us-east-1")
    eks.create_cluster(
        name=cluster, roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={"subnetIds": [subnet]}, tags=ours
    )
    elb = boto3.client("elbv2", region_name="us-east-1")
    ids = {}
    ids["lb"] = elb.create_load_balancer(
        Name="a1b2c3",
        Subnets=[subnet],
        Type="network",
        Scheme="internal",
        Tags=[
            {"Key": f"kubernetes.io/cluster/{cluster}", "Value": "owned"},
            {"Key": "kubernetes.io/service-name", "Value": "kimi/vllm"},
        ],
    )["LoadBalancers"][0]["LoadBalancerArn"]
    ids["lb_foreign"] = elb.create_load_balancer(
        Name="other",
        Subnets=[subnet],
        Type="network",
        Scheme="internal",
        Tags=[{"Key": "kubernetes.io/cluster/someone-else", "Value": "owned"}],
    )["LoadBalancers"][0]["LoadBalancerArn"]
    ids["eni_cni"] = ec2.create_network_interface(
        SubnetId=subnet,
        TagSpecifications=[
            {"ResourceType": "network-interface", "Tags": [{"Key": "cluster.k8s.amazonaws.com/name", "Value": cluster}]}
        ],
    )["NetworkInterface"]["NetworkInterfaceId"]
    ids["eni_foreign"] = ec2.create_network_interface(
        SubnetId=subnet,
        TagSpecifications=[
            {"ResourceType": "network-interface", "Tags": [{"Key": "cluster.k8s.amazonaws.com/name", "Value": "someone-else"}]}
        ],
    )["NetworkInterface"]["NetworkInterfaceId"]
    ids["sg_lbc"] = ec2.create_security_group(
        GroupName="k8s-kimi-vllm",
        Description="lbc",
        VpcId=vpc,
        TagSpecifications=[{"ResourceType": "security-group", "Tags": [{"Key": "elbv2.k8s.aws/cluster", "Value": cluster}]}],
    )["GroupId"]
    return ids


def _sweep():
    from scripts.ops import sweep

    return sweep


class _Calls:
    """boto3 clients that record mutating calls, optionally refusing one operation."""

    def __init__(self, refuse: str | None = None):
        self.ops: list[str] = []
        self.refuse = refuse
        self._clients: dict = {}

    def __call__(self, service, region):
        if (service, region) not in self._clients:
            client = boto3.client(service, region_name=region)
            client.meta.events.register("before-call", self._before)
            self._clients[(service, region)] = client
        return self._clients[(service, region)]

    def _before(self, model, params, **kwargs):
        if model.name == "DescribeCapacityReservations":
            # moto 5.2 does not implement it: answer "none" as EC2 would.
            from botocore.awsrequest import AWSResponse

            return (AWSResponse(None, 200, {}, None), {"CapacityReservations": [], "ResponseMetadata": {"HTTPStatusCode": 200}})
        if model.name.startswith(("Delete", "Terminate", "Detach", "Revoke")):
            self.ops.append(model.name)
            if model.name == self.refuse:
                from botocore.exceptions import ClientError

                raise ClientError({"Error": {"Code": "AccessDenied", "Message": "refused by test"}}, model.name)
        return None


def test_sweeper_removes_what_kubernetes_created_for_an_expired_cluster_after_the_cluster(moto_aws):
    sweep = _sweep()
    ids = _k8s_world()
    calls = _Calls()
    now = datetime(2026, 12, 1, tzinfo=UTC)
    dry = sweep.Sweeper(calls, ["us-east-1"], now, destroy=False).run()
    found = {r["id"]: r for s in dry["stacks"].values() for r in s["resources"]}
    for key in ("lb", "eni_cni", "sg_lbc"):
        assert found[ids[key]]["status"] == "would-delete", key
        assert ids[key] in {r["id"] for r in dry["stacks"]["gb300"]["resources"]}, key
        assert "Kubernetes for EKS cluster kimi-deploy-gb300" in json.dumps(found[ids[key]])
    assert ids["lb_foreign"] not in found and ids["eni_foreign"] not in found
    assert calls.ops == []

    report = sweep.Sweeper(calls, ["us-east-1"], now, destroy=True, wait_seconds=5, poll_seconds=0.01).run()
    assert report["summary"]["failed"] == 0 and report["exit_code"] == 0, report
    arns = {
        b["LoadBalancerArn"] for b in boto3.client("elbv2", region_name="us-east-1").describe_load_balancers()["LoadBalancers"]
    }
    assert ids["lb"] not in arns and ids["lb_foreign"] in arns
    enis = {
        e["NetworkInterfaceId"]
        for e in boto3.client("ec2", region_name="us-east-1").describe_network_interfaces()["NetworkInterfaces"]
    }
    assert ids["eni_cni"] not in enis and ids["eni_foreign"] in enis
    ops = calls.ops
    # The cluster first (its controller would recreate a deleted NLB), then the NLB, then what keeps the VPC.
    assert (
        ops.index("DeleteCluster")
        < ops.index("DeleteLoadBalancer")
        < ops.index("DeleteNetworkInterface")
        < ops.index("DeleteSecurityGroup")
    )


def test_sweeper_reports_a_kubernetes_load_balancer_it_cannot_delete_with_exit_1(moto_aws):
    sweep = _sweep()
    ids = _k8s_world()
    report = sweep.Sweeper(
        _Calls(refuse="DeleteLoadBalancer"),
        ["us-east-1"],
        datetime(2026, 12, 1, tzinfo=UTC),
        destroy=True,
        wait_seconds=1,
        poll_seconds=0.01,
    ).run()
    found = {r["id"]: r for s in report["stacks"].values() for r in s["resources"]}
    assert found[ids["lb"]]["status"] == "failed" and "AccessDenied" in found[ids["lb"]]["reason"]
    assert report["exit_code"] == 1


# -- 10. Smaller items ----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fsx_metadata_is_automatic_and_eks_gpu_roots_are_small_when_containerd_is_on_the_raid0(variant):
    run = variant_plan(variant)
    spec = run.context.spec
    for fs in run.of_type("aws:fsx/lustreFileSystem:LustreFileSystem"):
        assert fs.inputs["metadataConfiguration"] == {"mode": "AUTOMATIC"}
    if spec.platform == "aws-eks":
        root = run.named("eks-gpu-lt").inputs["blockDeviceMappings"][0]["ebs"]["volumeSize"]
        assert spec.instance.nvme_devices > 0 and root == 100
    if spec.target.needs_compute_domain:
        (cd,) = [r for r in run.resources if r.type.endswith("ComputeDomain")]
        assert cd.inputs["spec"]["numNodes"] == 0


# -- Hardware however it is named: the target's GPU model, count and memory ---------------------------


def _stack_values(stack: str) -> dict:
    values, _ = namespace_config(read_stack_config(stack))
    return copy.deepcopy(values)


def _parse_stack(values: dict, stack: str):
    return parse_spec(values, stack=stack, project="kimi-deploy", now=FIXED_NOW)


@pytest.mark.parametrize("name", sorted(n for n, f in INSTANCES.items() if f.cloud == "aws"))
def test_instance_gpus_are_ec2s(name):
    """The GPU model and count of every AWS instance profile are EC2's (moto's copy of
    DescribeInstanceTypes); where the profile's GPU memory is EC2's figure (B300, B200), it too.
    Types moto does not know are flagged ``in_ec2_catalog=False`` (preflight asks the live API)."""
    import gzip

    import moto

    data = json.load(gzip.open(Path(moto.__file__).parent / "ec2" / "resources" / "instance_types.json.gz"))
    facts = INSTANCES[name]
    assert (name in data) == facts.in_ec2_catalog, name
    if name not in data:
        return
    gpus = data[name]["GpuInfo"]["Gpus"]
    assert [g["Name"] for g in gpus] == [facts.gpu.name]
    assert sum(g["Count"] for g in gpus) == facts.gpus
    if facts.gpu.name in ("B300", "B200"):  # H100/H200 keep the datasheet GB figure that explains their rejection
        assert gpus[0]["MemoryInfo"]["SizeInMiB"] * 1024**2 == facts.gpu.memory_bytes


@pytest.mark.parametrize(
    ("stack", "instance_type", "gpus"),
    [
        ("b300", "p5.48xlarge", "8x NVIDIA H100 of 80 GB"),
        ("b300", "p5en.48xlarge", "8x NVIDIA H200 of 141 GB"),
        ("b300", "p6-b200.48xlarge", "8x NVIDIA B200 of 192 GB"),
        ("b300-prod", "p6-b200.48xlarge", "8x NVIDIA B200 of 192 GB"),
        ("gb300", "p6e-gb200.36xlarge", "4x NVIDIA GB200 of 186 GB"),
        ("gb300", "p5.48xlarge", "8x NVIDIA H100 of 80 GB"),
    ],
)
def test_an_instance_type_of_other_gpus_is_not_the_target(stack, instance_type, gpus):
    values = _stack_values(stack)
    values.setdefault("compute", {})["instanceType"] = instance_type
    with pytest.raises(ConfigError) as err:
        _parse_stack(values, stack)
    target = values["target"]
    fits = "p6-b300.48xlarge" if target == "b300" else "p6e-gb300.36xlarge"
    assert str(err.value) == (
        f"kimi-deploy:compute.instanceType: '{instance_type}' has {gpus}, not the "
        f"{'8x NVIDIA B300 of 288 GB' if target == 'b300' else '4x NVIDIA GB300 of 288 GB'} per node of target {target} "
        f"(instance types of {target}: {fits})"
    )


def test_an_instance_type_without_a_profile_never_passes_as_the_target():
    values = _stack_values("b300")
    values["compute"]["instanceType"] = "p4d.24xlarge"  # 8 GPUs in EC2's catalog, but A100s
    with pytest.raises(ConfigError, match=r"'p4d.24xlarge' has no profile: nothing says it is a b300 node"):
        _parse_stack(values, "b300")


@pytest.mark.parametrize(
    ("stack", "key", "value", "fragment"),
    [
        ("mi355x", "amd.com/gpu.product-name", "AMD_Instinct_MI300X_OAM", "names another GPU than the MI355X"),
        ("mi355x", "amd.com/gpu.vram", "192G", "is not the 288 GB per GPU of the MI355X"),
        ("mi355x", "node.kubernetes.io/instance-type", "p5.48xlarge", "has 8x NVIDIA H100 of 80 GB, not the 8x AMD MI355X"),
        ("b300-prod", "node.kubernetes.io/instance-type", "p4d.24xlarge", "is an instance type with no profile"),
        ("b300-prod", "nvidia.com/gpu.product", "NVIDIA-GB300", "names another GPU than the B300 of target b300"),
        ("b300-prod", "nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3", "names another GPU than the B300"),
        ("b300-prod", "nvidia.com/gpu.count", "4", "is not the 8 GPUs per node of target b300"),
        ("gb300", "karpenter.k8s.aws/instance-gpu-name", "gb200", "names another GPU than the GB300"),
        ("gb300", "karpenter.k8s.aws/instance-gpu-memory", "189696", "is not the 288 GB per GPU"),
    ],
)
def test_a_node_selector_for_other_hardware_is_an_error(stack, key, value, fragment):
    values = _stack_values(stack)
    values.setdefault("kubernetes", {}).setdefault("nodeSelector", {})[key] = value
    with pytest.raises(ConfigError) as err:
        _parse_stack(values, stack)
    assert str(err.value).startswith(f"kimi-deploy:kubernetes.nodeSelector.{key}: '{value}' ") and fragment in str(err.value)


@pytest.mark.parametrize(
    ("stack", "key", "value"),
    [
        ("mi355x", "amd.com/gpu.product-name", "AMD_Instinct_MI355X"),
        ("b300-prod", "node.kubernetes.io/instance-type", "p6-b300.48xlarge"),
        ("b300-prod", "nvidia.com/gpu.product", "NVIDIA-B300-SXM6-AC"),
        ("b300-prod", "karpenter.k8s.aws/instance-gpu-memory", "275040"),
        ("gb300", "nvidia.com/gpu.count", "4"),
        ("b300-prod", "topology.kubernetes.io/zone", "us-east-1c"),  # not a hardware label
    ],
)
def test_a_node_selector_for_the_target_passes(stack, key, value):
    values = _stack_values(stack)
    values.setdefault("kubernetes", {}).setdefault("nodeSelector", {})[key] = value
    _parse_stack(values, stack)


def test_preflight_names_another_gpu_model_in_ec2s_answer():
    preflight = _preflight()
    problems = preflight.instance_fact_mismatches(
        INSTANCES["p6-b300.48xlarge"], INSTANCES["p6-b300.48xlarge"].gpu, _moto_instance_type("p6-b200.48xlarge")
    )
    assert problems[0] == "B200 GPUs (profile B300)"
