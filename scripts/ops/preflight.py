#!/usr/bin/env python3
"""Preflight: can this stack get its GPUs before `pulumi up` spends an hour finding out?

    python scripts/ops/preflight.py --stack b300 [--region R] [--only CHECK] [--json]

Checks (each pass / warn / fail / unknown / skip with a one-line reason):
  deployable            the stack has no blocker (what makes `pulumi up` refuse it, e.g. an engine
                        build that cannot serve the model)
  deploy-credentials    the AWS credentials outlive the modelled `pulumi up`: renewable (a profile's
                        role, instance role) or long-term keys pass; a session token nothing can
                        renew fails when it expires before `pulumi up` would end; SSO (and a
                        credential_process over an SSO profile) passes only while the SSO token in
                        ~/.aws/sso/cache outlives it (warn where a refresh token may extend it)
  instance-facts        EC2 knows the type and its GPUs, GPU memory, vCPUs, memory, architecture,
                        disks, network cards, interface types and EFA match the profile
  offered-in-region     DescribeInstanceTypeOfferings lists the type in the region
  offered-in-az         ... and in the AZ the nodes are pinned to
  zone-type             the GPU zone is the kind (AZ or Local Zone) the network layout assumes
  vcpu-quota            the On-Demand vCPU quota of the family (Service Quotas) covers the nodes
  capacity-reservation  the ODCR / capacity block exists, is active or scheduled, matches type,
                        count and AZ
  capacity-end          the reservation does not end before the stack expires (a capacity
                        block's instances are terminated 30 min before its end)
  capacity-ready        ... and a capacity block still runs instances when the modelled time to
                        ready has passed (warn otherwise)
  fsx, eks              the services answer in the region (where the stack uses them)
  eks-version           DescribeClusterVersions: the EKS version is in standard support (or
                        extended support was chosen), and versions.EKS_VERSIONS agrees
  kubernetes-api        (aws-eks) this machine reaches the EKS API server the Kubernetes objects go
                        through: the cluster's endpoint answers on 443 (TCP, 5 s); before it exists,
                        this machine's egress address (checkip.amazonaws.com, KIMI_DEPLOY_CHECKIP_URL)
                        is in network.apiServerPublicCidrs, or its address toward network.vpcId in
                        network.apiServerPrivateCidrs (private)
  mirror                the S3 mirror exists and its manifest.json is complete
  cluster, gpu-nodes    (Kubernetes, with --check-cluster) the kubeconfig reaches the API server
                        and enough nodes advertise the GPU resource
  vllm-argv             the stack's serve commands pass the real vLLM (.venv-vllm): its parser,
                        env check, attention backends and the frontend the env selects
  engine-image          (where docker or podman answers; --runtime to force one or none) `kimi-deploy
                        engine verify` of the stack's engine image: version, required features,
                        parsers, env names
An API that cannot answer (type unknown to the catalog, access denied, not implemented by the
endpoint, no credentials) gives ``unknown``, never a crash; a check that does not apply to the
stack is ``skip`` with or without credentials. boto3 honors AWS_ENDPOINT_URL (on localhost with no
credentials set, dummy ones are used and a note says so).
The result line counts the statuses and says "ok" only when every check ran and passed (or
warned): "ok (11 passed)", "ok, with warnings to read (10 passed, 1 warned)";
otherwise "nothing failed, but not everything was checked (3 passed,
8 skipped)", "FAILED (...)" or "NOT CHECKED (...)".
Exit codes: 0 nothing failed and at least one check passed or warned, 1 a check failed, 2 usage
or config error, or nothing could be checked: no AWS credentials, the AWS endpoint cannot be
reached, or every check was skipped or unknown (the checks are still printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: its folder is on sys.path, the project may not be installed here
    import _cli  # noqa: F401  first: a missing package (or the project itself) prints `make setup`, not a traceback

from components.core.config import DeploymentSpec, format_utc, stack_names
from components.core.config.phase import SWITCH_TO_SERVE
from components.core.errors import ConfigError
from components.core.load import load_stack
from components.core.targets import MIB, GpuFacts, InstanceFacts, ec2_vcpu_quota, is_local_zone
from components.core.versions import EKS_API_SERVER_PORT
from components.core.weights import MANIFEST_NAME, MARKER_NAME, mirror_key_prefix
from scripts.ops import engine_verify
from scripts.ops._cli import (
    DUMMY_AWS_CREDENTIALS,
    EXIT_CHECK_FAILED,
    EXIT_USAGE,
    FAIL,
    PASS,
    SKIP,
    UNKNOWN,
    WARN,
    CliParser,
    UsageError,
    aws_session,
    counts_text,
    exit_code,
    local_aws_endpoint,
    one_line,
    print_json,
    print_overlay_notice,
    print_table,
    prog_name,
    run_cli,
    status_counts,
    verdict,
)
from scripts.ops.vllm_parser import INSTALL_HINT as VLLM_PARSER_INSTALL_HINT
from scripts.ops.vllm_parser import VllmParserError, argv_check_request, find_vllm_python, run_argv_check

REPO_ROOT = Path(__file__).resolve().parents[2]

# Capacity reservation states that will (scheduled) or do (active) hold instances.
_GOOD_RESERVATION_STATES = ("active", "scheduled")
# Error codes that mean "this API cannot tell us", not "the answer is no".
_UNKNOWN_CODES = (
    "AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnrecognizedClientException",
    "InvalidClientTokenId", "AuthFailure", "ExpiredToken", "NotImplemented", "InternalError",
    "InternalFailure", "ServiceUnavailable", "NoSuchResourceException", "TooManyRequestsException",
)
# Tolerance on the NVMe total: EC2 reports whole GB.
_NVME_TOLERANCE = 0.01


@dataclass(frozen=True)
class Check:
    """One preflight result.

    Attributes:
        name: short check id (``offered-in-az``).
        status: ``pass``, ``warn``, ``fail``, ``unknown`` or ``skip``.
        reason: one line saying why.
    """

    name: str
    status: str
    reason: str


NO_CREDENTIALS = (
    "no AWS credentials: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
    "or AWS_ENDPOINT_URL for a local endpoint (e.g. moto on 127.0.0.1)"
)
# AWS_ENDPOINT_URL and the dummy credentials for a local endpoint: one helper for every script.
DUMMY_CREDENTIALS = DUMMY_AWS_CREDENTIALS
local_endpoint = local_aws_endpoint


class AwsClients:
    """boto3 clients for one region; ``overrides`` lets tests answer single services or
    operations (``"service-quotas"``, ``"ec2:DescribeCapacityReservations"``) with stubbed
    clients while everything else goes to moto or AWS.

    Without credentials and with ``AWS_ENDPOINT_URL`` on this machine (a local moto), dummy
    credentials are used and ``notes`` says so. ``unreachable`` is set (one line) by the first
    call that cannot connect; every later call is then ``unknown`` at once instead of waiting
    for the same timeout again.
    """

    def __init__(self, region: str, session: Any = None, overrides: Mapping[str, Any] | None = None):
        import boto3
        from botocore.config import Config

        self.region = region
        self.overrides = dict(overrides or {})
        self.notes: list[str] = []
        self.unreachable: str | None = None
        self.reached = False  # some call got an answer: the network path to AWS works
        if session is None:
            session = boto3.session.Session() if self.overrides else aws_session(self.notes)
        self.session = session
        # Few retries and short timeouts: an endpoint that does not answer is "unknown", fast.
        self._config = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=3, read_timeout=20)
        self._cache: dict[str, Any] = {}
        self._has_credentials: bool | None = None

    def get(self, service: str, operation: str | None = None) -> Any:
        """The client for ``service`` (an override for ``service:operation`` or ``service`` first)."""
        for key in (f"{service}:{operation}", service):
            if key in self.overrides:
                return self.overrides[key]
        if service not in self._cache:
            self._cache[service] = self.session.client(service, region_name=self.region, config=self._config)
        return self._cache[service]

    def has_credentials(self) -> bool:
        """Whether credentials can be found (overrides count as credentials); looked up once."""
        if self.overrides:
            return True
        if self._has_credentials is None:
            self._has_credentials = _credentials(self.session) is not None
        return self._has_credentials


def _credentials(session: Any) -> Any:
    try:
        return session.get_credentials()
    except Exception:  # noqa: BLE001 - a broken profile is the user's to fix; reported as no credentials
        return None


class ApiUnknown(Exception):
    """The API could not answer; ``str(err)`` is the one-line reason."""


def _call(clients: AwsClients, service: str, operation: str, method: str, **kwargs: Any) -> dict[str, Any]:
    """Call ``service.method(**kwargs)``; errors that mean "cannot tell" raise ``ApiUnknown``,
    other ``ClientError`` codes propagate for the check to judge."""
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if not clients.has_credentials():
        raise ApiUnknown(NO_CREDENTIALS.split(":")[0])
    if clients.unreachable:
        raise ApiUnknown(f"{operation} not tried: {clients.unreachable}")
    try:
        answer = getattr(clients.get(service, operation), method)(**kwargs)
        clients.reached = True
        return answer
    except BotoConnectionError as err:
        # Once AWS answered, an endpoint that does not resolve is a service missing from the
        # region (check_service says so); otherwise the endpoint as a whole cannot be reached.
        if clients.reached and isinstance(err, EndpointConnectionError) and not os.environ.get("AWS_ENDPOINT_URL"):
            raise ApiUnknown(f"{operation}: {one_line(err)[:200]}") from err
        clients.unreachable = f"cannot reach the AWS endpoint ({one_line(err)[:200]})"
        raise ApiUnknown(f"{operation}: {clients.unreachable}") from None
    except ClientError as err:
        clients.reached = True
        code = err.response.get("Error", {}).get("Code", "")
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in _UNKNOWN_CODES or status >= 500 or "NotImplemented" in code:
            message = err.response.get("Error", {}).get("Message", "")
            raise ApiUnknown(f"{operation}: {code or status} {one_line(message)[:160]}".rstrip()) from None
        raise
    except NotImplementedError:
        raise ApiUnknown(f"{operation} is not implemented by this endpoint") from None
    except BotoCoreError as err:
        raise ApiUnknown(f"{operation}: {one_line(err)[:200]}") from None
    except Exception as err:  # noqa: BLE001 - e.g. an unparseable error page: cannot tell, never crash
        if type(err).__name__ == "ResponseParserError":
            raise ApiUnknown(f"{operation}: the endpoint did not answer in AWS's format (not implemented there?)") from None
        raise ApiUnknown(f"{operation}: {type(err).__name__}: {one_line(err)[:160]}") from None


def _code(err: Exception) -> str:
    return getattr(err, "response", {}).get("Error", {}).get("Code", "") if hasattr(err, "response") else ""


# ---------------------------------------------------------------------------------------------
# AWS checks
# ---------------------------------------------------------------------------------------------


def check_instance_facts(spec: DeploymentSpec, clients: AwsClients) -> tuple[Check, bool | None]:
    """EC2's facts of the instance type against the profile. Returns the check and whether EC2
    knows the type (None when it could not say)."""
    from botocore.exceptions import ClientError

    inst = spec.instance
    name = "instance-facts"
    try:
        answer = _call(clients, "ec2", "DescribeInstanceTypes", "describe_instance_types", InstanceTypes=[inst.instance_type])
    except ApiUnknown as err:
        return Check(name, UNKNOWN, str(err)), None
    except ClientError as err:
        if _code(err) in ("InvalidInstanceType", "InvalidParameterValue"):
            return Check(
                name, UNKNOWN, f"{inst.instance_type} is unknown to the EC2 catalog in {clients.region}; facts not verified"
            ), False
        return Check(name, UNKNOWN, f"DescribeInstanceTypes: {_code(err)}"), None
    types = answer.get("InstanceTypes", [])
    if not types:
        return Check(name, UNKNOWN, f"{inst.instance_type} is unknown to the EC2 catalog in {clients.region}"), False
    it = types[0]
    gpu = spec.target.gpu
    problems = instance_fact_mismatches(inst, gpu, it)
    gpus = it.get("GpuInfo", {}).get("Gpus", [])
    gpu_count = sum(g.get("Count", 0) for g in gpus)
    gpu_mib = gpus[0].get("MemoryInfo", {}).get("SizeInMiB", 0) if gpus else 0
    nvme_gb = it.get("InstanceStorageInfo", {}).get("TotalSizeInGB", 0)
    net = it.get("NetworkInfo", {})
    efa = net.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0) if net.get("EfaSupported") else 0
    vcpus = it.get("VCpuInfo", {}).get("DefaultVCpus")
    if problems:
        return Check(name, FAIL, f"{inst.instance_type} differs from the profile: " + "; ".join(problems)), True
    return Check(
        name, PASS,
        f"{inst.instance_type}: {gpu_count}x {gpu.name} {gpu_mib:,} MiB, {nvme_gb:,} GB NVMe, {efa} EFA, {vcpus} vCPUs",
    ), True


def instance_fact_mismatches(inst: InstanceFacts, gpu: GpuFacts, it: Mapping[str, Any]) -> list[str]:
    """Every difference between ``targets.py``'s facts and one EC2 ``InstanceTypeInfo`` (the
    DescribeInstanceTypes shape, EC2 API reference): GPU model (``GpuInfo.Gpus[].Name``), count
    and memory, vCPUs, memory,
    CPU architecture, instance-store disks (count, size, total), network cards, the interface
    types of each card, the EFA maximum, and that every card of the launch template's EFA
    layout takes an ``efa-only`` interface. Empty when everything matches.
    """
    problems: list[str] = []
    gpus = it.get("GpuInfo", {}).get("Gpus", [])
    names = sorted({str(g.get("Name")) for g in gpus if g.get("Name")})
    if names and names != [gpu.name]:
        problems.append(f"{'/'.join(names)} GPUs (profile {gpu.name})")
    gpu_count = sum(g.get("Count", 0) for g in gpus)
    if gpu_count != inst.gpus:
        problems.append(f"{gpu_count} GPUs (profile {inst.gpus})")
    gpu_mib = gpus[0].get("MemoryInfo", {}).get("SizeInMiB") if gpus else None
    if gpu_mib is not None and gpu_mib != gpu.memory_bytes // MIB:
        problems.append(f"{gpu_mib:,} MiB per GPU (profile {gpu.memory_bytes // MIB:,})")
    vcpus = it.get("VCpuInfo", {}).get("DefaultVCpus")
    if vcpus != inst.vcpus:
        problems.append(f"{vcpus} vCPUs (profile {inst.vcpus})")
    mem_mib = it.get("MemoryInfo", {}).get("SizeInMiB")
    if mem_mib != inst.memory_gib * 1024:
        problems.append(f"{mem_mib} MiB memory (profile {inst.memory_gib * 1024})")
    archs = it.get("ProcessorInfo", {}).get("SupportedArchitectures", [])
    if inst.cpu_architecture not in archs:
        problems.append(f"architectures {archs} (profile {inst.cpu_architecture})")
    storage = it.get("InstanceStorageInfo", {})
    disks = storage.get("Disks", [])
    count = sum(d.get("Count", 0) for d in disks)
    sizes = {d.get("SizeInGB") for d in disks}
    if count != inst.nvme_devices or (disks and sizes != {inst.nvme_device_bytes // 10**9}):
        problems.append(
            f"{count} x {'/'.join(str(x) for x in sorted(sizes, key=str))} GB instance-store disks (profile {inst.nvme_devices} "
            f"x {inst.nvme_device_bytes // 10**9})"
        )
    nvme_gb = storage.get("TotalSizeInGB", 0)
    if abs(nvme_gb * 10**9 - inst.nvme_total_bytes) > _NVME_TOLERANCE * max(inst.nvme_total_bytes, 1):
        problems.append(f"{nvme_gb:,} GB NVMe (profile {inst.nvme_total_bytes // 10**9:,})")
    net = it.get("NetworkInfo", {})
    efa = net.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0) if net.get("EfaSupported") else 0
    if efa != inst.efa_interfaces:
        problems.append(f"{efa} EFA interfaces (profile {inst.efa_interfaces})")
    cards = {c.get("NetworkCardIndex"): tuple(c.get("InterfaceTypes", ())) for c in net.get("NetworkCards", [])}
    max_cards = net.get("MaximumNetworkCards", len(cards))
    if max_cards != inst.network_cards:
        problems.append(f"{max_cards} network cards (profile {inst.network_cards})")
    for index, expected in enumerate(inst.network_card_interface_types):
        got = cards.get(index)
        if got is not None and set(got) != set(expected):
            problems.append(f"network card {index} takes {'/'.join(got) or 'nothing'} (profile {'/'.join(expected)})")
    for card in inst.efa_cards:
        if card in cards and "efa-only" not in cards[card]:
            problems.append(f"network card {card} of the EFA layout takes no efa-only interface")
        elif card not in cards and cards:
            problems.append(f"network card {card} of the EFA layout does not exist")
    return problems


def check_eks_version(spec: DeploymentSpec, clients: AwsClients, now: datetime) -> Check:
    """``eks-version``: the live EKS DescribeClusterVersions answer for the stack's version
    (``kubernetes.eksVersion``) against ``versions.EKS_VERSIONS`` and the chosen support type.

    fail: EKS reports the version unsupported, or out of standard support while
    ``eksSupportType`` is STANDARD (EKS would refuse it); warn: in extended support (billed at
    the extended rate) or the table's end-of-standard-support date differs from EKS's (update
    the table); pass otherwise. The response shape is EKS API reference
    ``ClusterVersionInformation`` (``clusterVersion``, ``versionStatus``,
    ``endOfStandardSupportDate``, ``endOfExtendedSupportDate``)."""
    from botocore.exceptions import ClientError

    from components.core.config import eks_version_of
    from components.core.versions import EKS_EXTENDED_USD_PER_CLUSTER_HOUR, EKS_VERSIONS

    name = "eks-version"
    if spec.platform != "aws-eks":
        return Check(name, SKIP, f"not applicable: platform {spec.platform}")
    version = eks_version_of(spec.config)
    support = spec.config.kubernetes.eks_support_type
    try:
        answer = _call(
            clients, "eks", "DescribeClusterVersions", "describe_cluster_versions", clusterVersions=[version], includeAll=True
        )
    except ApiUnknown as err:
        return Check(name, UNKNOWN, str(err))
    except ClientError as err:
        return Check(name, UNKNOWN, f"DescribeClusterVersions: {_code(err)}")
    info = next((v for v in answer.get("clusterVersions", []) if v.get("clusterVersion") == version), None)
    if info is None:
        return Check(name, FAIL, f"EKS does not offer Kubernetes {version} in {clients.region}")
    status = (info.get("versionStatus") or info.get("status") or "").upper().replace("-", "_")
    end_std = info.get("endOfStandardSupportDate")
    end_std_day = end_std.astimezone(UTC).date() if isinstance(end_std, datetime) else None
    if status == "UNSUPPORTED":
        return Check(name, FAIL, f"EKS reports Kubernetes {version} as unsupported: choose a newer kubernetes.eksVersion")
    if status == "EXTENDED_SUPPORT" and support == "STANDARD":
        return Check(
            name,
            FAIL,
            f"Kubernetes {version} is in extended support (ended standard {end_std_day}): EKS refuses supportType STANDARD; "
            "choose a newer kubernetes.eksVersion or eksSupportType EXTENDED (USD "
            f"{EKS_EXTENDED_USD_PER_CLUSTER_HOUR:.2f}/cluster-hour)",
        )
    table = EKS_VERSIONS.get(version)
    if table is not None and end_std_day is not None and end_std_day != table.end_of_standard_support:
        return Check(
            name,
            WARN,
            f"EKS ends standard support of {version} on {end_std_day}, versions.EKS_VERSIONS says "
            f"{table.end_of_standard_support}: update the table",
        )
    if status == "EXTENDED_SUPPORT":
        return Check(
            name,
            WARN,
            f"Kubernetes {version} is in extended support: USD {EKS_EXTENDED_USD_PER_CLUSTER_HOUR:.2f} per cluster-hour",
        )
    left = f", {(end_std_day - now.date()).days} days left" if end_std_day is not None else ""
    return Check(
        name,
        PASS,
        f"Kubernetes {version}: {status.lower().replace('_', ' ') or 'listed'} until {end_std_day or 'unknown'}{left} "
        f"(supportType {support})",
    )


def check_zone_type(spec: DeploymentSpec, clients: AwsClients) -> Check:
    """``zone-type``: the GPU zone's ``ZoneType`` (EC2 DescribeAvailabilityZones) agrees with the
    network layout the plan chose from its name (``targets.is_local_zone``): a Local Zone gets
    only the GPU subnet, the control plane and NAT stay in the parent region. A Local Zone whose
    group is not opted in fails (``OptInStatus``)."""
    from botocore.exceptions import ClientError

    name = "zone-type"
    az = spec.availability_zone
    if not az:
        return Check(name, SKIP, "no GPU zone pinned (compute.availabilityZone)")
    try:
        answer = _call(
            clients, "ec2", "DescribeAvailabilityZones", "describe_availability_zones", ZoneNames=[az], AllAvailabilityZones=True
        )
    except ApiUnknown as err:
        return Check(name, UNKNOWN, str(err))
    except ClientError as err:
        if _code(err) in ("InvalidParameterValue", "InvalidZone.NotFound"):
            return Check(name, FAIL, f"{az} is not a zone of {clients.region}")
        return Check(name, UNKNOWN, f"DescribeAvailabilityZones: {_code(err)}")
    zones = [z for z in answer.get("AvailabilityZones", []) if z.get("ZoneName") == az]
    if not zones:
        return Check(name, FAIL, f"{az} is not a zone of {clients.region}")
    zone = zones[0]
    kind = zone.get("ZoneType", "availability-zone")
    planned = "local-zone" if is_local_zone(az) else "availability-zone"
    if kind not in ("local-zone", "availability-zone"):
        return Check(name, FAIL, f"{az} is a {kind}: GPU nodes go in an availability zone or a Local Zone")
    if kind != planned:
        return Check(name, FAIL, f"{az} is a {kind} but the plan laid the network out for a {planned}")
    if kind == "local-zone" and zone.get("OptInStatus") == "not-opted-in":
        return Check(name, FAIL, f"{az} is a Local Zone of group {zone.get('GroupName')} that the account has not opted in to")
    if kind == "local-zone":
        return Check(
            name,
            PASS,
            f"{az} is a Local Zone (parent {zone.get('ParentZoneName', clients.region)}): GPU subnet only there, control plane "
            "and NAT in the region",
        )
    return Check(name, PASS, f"{az} is an availability zone")


def check_offerings(spec: DeploymentSpec, clients: AwsClients, az: str | None, known: bool | None) -> list[Check]:
    """The type's offerings in the region and in the pinned AZ."""
    from botocore.exceptions import ClientError

    itype, region = spec.instance.instance_type, clients.region
    if known is False:
        reason = f"{itype} is unknown to the EC2 catalog: offerings cannot be listed"
        return [Check("offered-in-region", UNKNOWN, reason), Check("offered-in-az", UNKNOWN, reason)]
    try:
        answer = _call(
            clients, "ec2", "DescribeInstanceTypeOfferings", "describe_instance_type_offerings",
            LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [itype]}],
        )
    except (ApiUnknown, ClientError) as err:
        reason = str(err) if isinstance(err, ApiUnknown) else f"DescribeInstanceTypeOfferings: {_code(err)}"
        return [Check("offered-in-region", UNKNOWN, reason), Check("offered-in-az", UNKNOWN, reason)]
    azs = sorted({o["Location"] for o in answer.get("InstanceTypeOfferings", [])})
    if not azs:
        return [
            Check("offered-in-region", FAIL, f"{itype} is not offered in {region}"),
            Check("offered-in-az", FAIL if az and az.startswith(region) else SKIP, f"{itype} is not offered in {region}"),
        ]
    checks = [Check("offered-in-region", PASS, f"{itype} offered in {region}: {', '.join(azs)}")]
    if az is None:
        checks.append(
            Check("offered-in-az", SKIP, f"no AZ pinned (compute.availabilityZone); the type is offered in {', '.join(azs)}")
        )
    elif not az.startswith(region):
        checks.append(
            Check("offered-in-az", SKIP, f"the stack's AZ {az} is not in {region} (--region overrides the stack's region)")
        )
    elif az in azs:
        checks.append(Check("offered-in-az", PASS, f"{az} offers {itype}"))
    else:
        checks.append(Check("offered-in-az", FAIL, f"{az} does not offer {itype} (offered: {', '.join(azs)})"))
    return checks


def check_quota(spec: DeploymentSpec, clients: AwsClients) -> Check:
    """The family's On-Demand vCPU quota against the vCPUs of all GPU nodes."""
    name = "vcpu-quota"
    inst = spec.instance
    quota = ec2_vcpu_quota(inst.instance_type)
    if quota is None:
        return Check(name, UNKNOWN, f"no vCPU quota code recorded for {inst.instance_type} (components/core/targets.py)")
    code, title = quota
    need = inst.vcpus * spec.gpu_nodes
    try:
        answer = _call(clients, "service-quotas", "GetServiceQuota", "get_service_quota", ServiceCode="ec2", QuotaCode=code)
    except ApiUnknown as err:
        return Check(name, UNKNOWN, f"{title} ({code}): {err}")
    except Exception as err:  # noqa: BLE001 - any other answer is "cannot tell", never a crash
        return Check(name, UNKNOWN, f"{title} ({code}): {_code(err) or one_line(err)}")
    value = answer.get("Quota", {}).get("Value")
    if value is None:
        return Check(name, UNKNOWN, f"{title} ({code}) returned no value")
    have = int(value)
    what = f"{title} ({code}) is {have:,} vCPUs; {spec.gpu_nodes} node(s) x {inst.vcpus} = {need:,} needed"
    if have >= need:
        return Check(name, PASS, f"{what} (running P instances also count)")
    if spec.config.compute.capacity.type == "capacity-block":
        return Check(
            name, WARN, f"{what}; if launching into the capacity block fails with VcpuLimitExceeded, request an increase"
        )
    return Check(name, FAIL, f"{what}: request an increase in Service Quotas")


def trial_expiry(spec: DeploymentSpec, now: datetime) -> tuple[datetime | None, str]:
    """When the stack expires and how that was worked out."""
    if spec.expires_at is not None:
        return spec.expires_at, f"expiresAt {format_utc(spec.expires_at)}"
    if spec.environment == "trial":
        at = now + timedelta(hours=spec.trial_ttl_hours)
        return (
            at,
            f"now + trialTtlHours {spec.trial_ttl_hours} h = {format_utc(at)} (no expiresAt; the TTL starts at the first `pulumi "
            "up`)",
        )
    return None, f"{spec.environment} has no expiry"


def _reservation_checks(status: str, reason: str, end_reason: str | None = None) -> list[Check]:
    """``capacity-end`` and ``capacity-ready`` when the reservation was not read (same status)."""
    return [Check("capacity-end", status, end_reason or reason), Check("capacity-ready", status, end_reason or reason)]


def check_reservation(
    spec: DeploymentSpec, clients: AwsClients, now: datetime, ready: ReadyModel | None = None
) -> list[Check]:
    """The configured ODCR or capacity block: existence, state, type, size, AZ (``capacity-reservation``),
    its end against the stack's expiry (``capacity-end``) and against the modelled time to ready
    (``capacity-ready``).

    A capacity block's instances are terminated 30 minutes before its ``EndDate``
    (``components.core.capacity``: AWS EC2 user guide, capacity-blocks-monitor), so both compare
    its usable end, ``capacity.usable_until(EndDate)``. ``capacity-end`` fails when the stack
    expires after it; ``capacity-ready`` warns when the model is not served before it (``ready``:
    the scenario of ``time_to_ready``; the GPU phases wait for a scheduled block's start). An
    ODCR's instances keep running as On-Demand after it ends: only its end is compared.
    """
    from botocore.exceptions import ClientError

    from components.core.capacity import CAPACITY_BLOCK_SOURCE, usable_until

    cap = spec.config.compute.capacity
    if cap.type == "on-demand":
        reason = "capacity type on-demand: no reservation to check"
        return [Check("capacity-reservation", SKIP, reason), *_reservation_checks(SKIP, reason)]
    rid = cap.reservation_id
    try:
        answer = _call(
            clients, "ec2", "DescribeCapacityReservations", "describe_capacity_reservations", CapacityReservationIds=[rid]
        )
    except ApiUnknown as err:
        return [Check("capacity-reservation", UNKNOWN, str(err)), *_reservation_checks(UNKNOWN, "reservation not read")]
    except ClientError as err:
        if "NotFound" in _code(err) or "Malformed" in _code(err):
            return [
                Check("capacity-reservation", FAIL, f"{rid} does not exist in {clients.region} ({_code(err)})"),
                *_reservation_checks(SKIP, "no reservation"),
            ]
        return [
            Check("capacity-reservation", UNKNOWN, f"DescribeCapacityReservations: {_code(err)}"),
            *_reservation_checks(UNKNOWN, "reservation not read"),
        ]
    found = answer.get("CapacityReservations", [])
    if not found:
        return [
            Check("capacity-reservation", FAIL, f"{rid} does not exist in {clients.region}"),
            *_reservation_checks(SKIP, "no reservation"),
        ]
    cr = found[0]
    kind = "capacity block" if cap.type == "capacity-block" else "ODCR"
    state = cr.get("State", "?")
    problems, warnings = [], []
    if state not in _GOOD_RESERVATION_STATES:
        problems.append(f"state {state} (needs active or scheduled)")
    rtype = cr.get("ReservationType")
    if rtype and (rtype == "capacity-block") != (cap.type == "capacity-block"):
        problems.append(f"reservation type {rtype} but compute.capacity.type is {cap.type}")
    if cr.get("InstanceType") and cr["InstanceType"] != spec.instance.instance_type:
        problems.append(f"instance type {cr['InstanceType']} (stack uses {spec.instance.instance_type})")
    az = cr.get("AvailabilityZone")
    if az and az != cap.availability_zone:
        problems.append(f"AZ {az} (stack pins {cap.availability_zone})")
    count = cr.get("TotalInstanceCount", cr.get("InstanceCount"))
    if count is not None and count < spec.gpu_nodes:
        problems.append(f"{count} instance(s) for {spec.gpu_nodes} node(s)")
    available = cr.get("AvailableInstanceCount")
    if state == "active" and available is not None and available < spec.gpu_nodes and not problems:
        warnings.append(f"only {available} of {count} instance(s) free")
    start = cr.get("StartDate")
    start = (start if start.tzinfo else start.replace(tzinfo=UTC)) if isinstance(start, datetime) else None
    if state == "scheduled" and start:
        warnings.append(f"starts {format_utc(start)}")
    summary = f"{kind} {rid}: {state}, {count}x {cr.get('InstanceType', '?')} in {az}"
    if problems:
        first = Check("capacity-reservation", FAIL, f"{summary}: " + "; ".join(problems))
    elif warnings:
        first = Check("capacity-reservation", WARN, f"{summary}; " + "; ".join(warnings))
    else:
        first = Check("capacity-reservation", PASS, summary)

    end = cr.get("EndDate")
    if end is None:
        reason = f"{rid} has no end date ({cr.get('EndDateType', 'unlimited')})"
        return [first, Check("capacity-end", PASS, reason), Check("capacity-ready", PASS, reason)]
    end = end if end.tzinfo else end.replace(tzinfo=UTC)
    block = cap.type == "capacity-block" or rtype == "capacity-block"
    usable = usable_until(end) if block else end
    ends = (f"{rid} runs instances until {format_utc(usable)} (it ends {format_utc(end)}; {CAPACITY_BLOCK_SOURCE})"
            if block else f"{rid} ends {format_utc(end)}")
    expiry, how = trial_expiry(spec, now)
    if end <= now:
        second = Check("capacity-end", FAIL, f"{rid} ended {format_utc(end)}")
    elif usable <= now:
        second = Check("capacity-end", FAIL, f"{ends}: its instances are being terminated now ({format_utc(now)})")
    elif expiry is None:
        second = Check("capacity-end", WARN, f"{ends} but {how}: plan the move before then")
    elif usable < expiry:
        second = Check("capacity-end", FAIL, f"{ends}, before the stack expires: {how}")
    else:
        second = Check("capacity-end", PASS, f"{ends}, after the stack expires: {how}")
    return [first, second, _capacity_ready(str(rid), usable, block, start, now, ready)]


@dataclass(frozen=True)
class ReadyModel:
    """The time-to-ready scenario preflight compares a reservation with.

    Attributes:
        scenario: ``first_deploy`` or ``repeat_trial`` (``time_to_ready.SCENARIOS``).
        lead_seconds: from `pulumi up` until the first phase that needs a GPU node.
        gpu_seconds: from that phase until the model is served.
    """

    scenario: str
    lead_seconds: int
    gpu_seconds: int

    @classmethod
    def of(cls, model: Any, scenario: str) -> ReadyModel:
        """From a ``time_to_ready.TimeToReady`` and a scenario name."""
        chosen = model.scenarios[scenario]
        return cls(scenario, chosen.total_seconds - chosen.gpu_seconds, chosen.gpu_seconds)

    def ready_at(self, now: datetime, start: datetime | None) -> datetime:
        """When the model is served if `pulumi up` starts at ``now`` and GPU nodes exist from
        ``start`` (a scheduled reservation) or at once."""
        gpu_from = now + timedelta(seconds=self.lead_seconds)
        if start is not None and start > gpu_from:
            gpu_from = start
        return gpu_from + timedelta(seconds=self.gpu_seconds)


def _capacity_ready(
    rid: str, usable: datetime, block: bool, start: datetime | None, now: datetime, ready: ReadyModel | None
) -> Check:
    """``capacity-ready``: the model is served before the reservation stops running instances."""
    name = "capacity-ready"
    if not block:
        return Check(name, SKIP, f"{rid} is an ODCR: its instances keep running as On-Demand after it ends")
    if ready is None:
        return Check(name, SKIP, "no time-to-ready model")
    at = ready.ready_at(now, start)
    scenario = ready.scenario.replace("_", " ")
    what = f"modelled {scenario} serves at {format_utc(at)} ({_hours(ready.lead_seconds + ready.gpu_seconds)} of work"
    what += f", GPU phases from the block's start {format_utc(start)})" if start is not None and start > now else ")"
    if at >= usable:
        return Check(
            name, WARN,
            f"{what}, but {rid}'s instances are terminated from {format_utc(usable)}: the model would not be served "
            "(a longer block, or a repeat trial with a complete mirror)",
        )
    return Check(name, PASS, f"{what}; {_hours((usable - at).total_seconds())} of serving before {format_utc(usable)}")


def _hours(seconds: float) -> str:
    """``"5.1 h"`` (``"42 min"`` under an hour)."""
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


# botocore credential providers (botocore/credentials.py, 1.44) whose credentials botocore renews
# before they expire by calling the source again: STS AssumeRole (``role_arn`` + ``source_profile``
# or ``credential_source``), AssumeRoleWithWebIdentity, IAM Identity Center (``sso``), the
# console login (``login``), instance metadata (``iam-role``), the container endpoint
# (``container-role``) and ``credential_process`` when it returns an ``Expiration``. The Pulumi
# AWS provider (aws-sdk-go-v2) renews the same sources. ``env`` is not among them: EnvProvider's
# "refresh" with AWS_CREDENTIAL_EXPIRATION re-reads the same environment, which no one changes
# under a running `pulumi up`.
REFRESHING_CREDENTIAL_METHODS = (
    "assume-role", "assume-role-with-web-identity", "sso", "login", "iam-role", "container-role", "custom-process",
)
# Renewed from a session whose end botocore does not manage: the SSO token (``_sso_check``), or
# whatever a credential_process runs (followed to an SSO profile where its command names one).
SSO_BACKED_METHODS = ("sso", "custom-process")
# STS AssumeRole's default session (DurationSeconds 3600: STS API reference, AssumeRole): a session
# token whose expiry is unknown is assumed to be that young and that short.
STS_DEFAULT_SESSION_SECONDS = 3600
CREDENTIALS_FIX = (
    "use a profile the SDK renews (AWS_PROFILE with role_arn + source_profile, or sso_session) or an instance/"
    "container role instead of exported session tokens"
)


# IAM Identity Center (SSO): botocore's SSOTokenProvider refreshes an access token within 15 min of
# its expiry with the refresh token of an `sso_session` (botocore/tokens.py, _REFRESH_WINDOW), until
# the client registration (``registrationExpiresAt``) or the Identity Center session ends; a legacy
# profile (sso_start_url in the profile itself) has no refresh token: its token's ``expiresAt`` is the
# end. Tokens are cached in ~/.aws/sso/cache/<sha1 of the session name, else of the start URL>.json
# (botocore/utils.py SSOTokenLoader), which `aws sso login` writes.
SSO_TOKEN_CACHE_DIR = ("~", ".aws", "sso", "cache")


@dataclass(frozen=True)
class SsoToken:
    """The cached IAM Identity Center token a profile's credentials are renewed with.

    Attributes:
        profile: the AWS profile whose SSO settings name it.
        session_name: the ``sso_session`` (None for a legacy profile).
        path: the cache file.
        expires_at: the access token's ``expiresAt`` (UTC).
        refreshable_until: the end of the client registration when the token carries a refresh
            token (``sso_session`` profiles), else None (nothing renews it).
    """

    profile: str
    session_name: str | None
    path: Path
    expires_at: datetime
    refreshable_until: datetime | None

    @property
    def login_command(self) -> str:
        """The command that starts a new session."""
        if self.session_name:
            return f"aws sso login --sso-session {self.session_name}"
        return f"aws sso login --profile {self.profile}"


def _utc(text: Any) -> datetime | None:
    """An ISO 8601 time of the token cache (``2026-11-30T20:00:00Z``, or with an offset) in UTC, or None."""
    try:
        value = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def sso_token_of(profile: str, full_config: Mapping[str, Any], now: datetime) -> SsoToken | None:
    """The cached SSO token behind ``profile`` (botocore's ``full_config``: ``profiles`` and
    ``sso_sessions``), read the way botocore reads it; None when the profile is not an SSO one or
    no readable token is cached. A ``credential_process`` profile whose command names another
    profile (``--profile NAME``, as in `aws configure export-credentials --profile NAME --format
    process`) is followed to that profile."""
    import hashlib
    import shlex

    profiles = full_config.get("profiles", {}) or {}
    settings = profiles.get(profile, {}) or {}
    process = settings.get("credential_process")
    if process and "sso_session" not in settings and "sso_start_url" not in settings:
        try:
            words = shlex.split(str(process))
        except ValueError:
            return None
        named = next((w.split("=", 1)[1] for w in words if w.startswith("--profile=")), None)
        if named is None and "--profile" in words[:-1]:
            named = words[words.index("--profile") + 1]
        if not named or named == profile:
            return None
        return sso_token_of(named, {**full_config, "profiles": {k: v for k, v in profiles.items() if k != profile}}, now)
    session_name = settings.get("sso_session")
    session = (full_config.get("sso_sessions", {}) or {}).get(session_name, {}) if session_name else {}
    start_url = settings.get("sso_start_url") or session.get("sso_start_url")
    if not session_name and not start_url:
        return None
    key = hashlib.sha1(str(session_name or start_url).encode("utf-8")).hexdigest()  # noqa: S324 - botocore's cache key
    path = Path(os.path.expanduser(os.path.join(*SSO_TOKEN_CACHE_DIR))) / f"{key}.json"
    try:
        token = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(token, dict) or (expires_at := _utc(token.get("expiresAt"))) is None:
        return None
    registration = _utc(token.get("registrationExpiresAt"))
    can_refresh = bool(session_name) and all(token.get(k) for k in ("refreshToken", "clientId", "clientSecret"))
    refreshable_until = registration if can_refresh and registration and registration > now else None
    return SsoToken(profile, session_name, path, expires_at, refreshable_until)


def _sso_check(name: str, who: str, token: SsoToken | None, now: datetime, up_seconds: int, up: str, method: str) -> Check:
    """The deploy-credentials verdict of SSO-backed credentials: the token must outlive `pulumi up`."""
    if token is None:
        if method == "custom-process":
            return Check(name, WARN, f"{who}: credential_process is run again to renew, and works only as long as the "
                                     f"session behind it (SSO, a vault) lasts, which is not visible here; {up}")
        return Check(name, WARN, f"{who}: no readable SSO token in ~/.aws/sso/cache: its expiry is not checked; {up}")
    deadline = now + timedelta(seconds=up_seconds)
    via = f"credential_process over profile {token.profile}: " if method == "custom-process" else ""
    if token.expires_at <= now:
        return Check(name, FAIL, f"{who}: {via}the SSO session expired {format_utc(token.expires_at)}: run "
                                 f"`{token.login_command}`")
    if token.expires_at > deadline:
        return Check(name, PASS, f"{who}: {via}the SSO token is valid until {format_utc(token.expires_at)}, after the "
                                 f"modelled `pulumi up` ends ({format_utc(deadline)}; {up})")
    if token.refreshable_until is not None and token.refreshable_until > deadline:
        return Check(name, WARN, f"{who}: {via}the SSO token expires {format_utc(token.expires_at)}, before `pulumi up` "
                                 f"would end ({format_utc(deadline)}; {up}); its refresh token renews it while the IAM "
                                 f"Identity Center session lasts (set in Identity Center, not visible here): run "
                                 f"`{token.login_command}` just before `pulumi up`")
    why = ("its client registration ends " + format_utc(token.refreshable_until) if token.refreshable_until
           else "no refresh token renews it" + ("" if token.session_name else " (a legacy profile without sso_session)"))
    return Check(name, FAIL, f"{who}: {via}the SSO token expires {format_utc(token.expires_at)}, before `pulumi up` would "
                             f"end ({format_utc(deadline)}; {up}), and {why}: run `{token.login_command}` right before "
                             "`pulumi up`, or use an sso_session profile (renewed with its refresh token)")


def check_deploy_credentials(spec: DeploymentSpec, clients: AwsClients, now: datetime, up_seconds: int, up_how: str) -> Check:
    """``deploy-credentials``: the AWS credentials that would run `pulumi up` last as long as it
    does (``up_seconds``, ``time_to_ready.pulumi_up_seconds``); Pulumi cannot save its snapshot
    when they expire under it.

    Classified the way botocore resolved them (``session.get_credentials()``; botocore 1.44
    ``credentials.py``): pass for credentials a provider renews (``REFRESHING_CREDENTIAL_METHODS``)
    and for long-term access keys (no session token), except that SSO and credential_process are
    renewed only while the session behind them lasts (``_sso_check``: the cached SSO token's
    ``expiresAt`` against the modelled end, ``sso_token_of``); for a session token no provider can renew
    (``env``: AWS_SESSION_TOKEN, or a token in the credentials or config file) fail when it
    expires within the modelled `pulumi up` (its expiry from AWS_CREDENTIAL_EXPIRATION, or, when
    unknown, a 1-hour STS default session against a longer `pulumi up`), else warn. STS
    GetCallerIdentity names the identity (a read-only call; it also makes botocore fetch
    deferred credentials such as assume-role).
    """
    from botocore.credentials import RefreshableCredentials

    from components.core.config import parse_utc

    name = "deploy-credentials"
    if not spec.profile.provisions_aws:
        return Check(name, SKIP, f"not applicable: platform {spec.platform}")
    if clients.overrides:
        return Check(name, SKIP, "stubbed AWS clients: no credentials of yours to judge")
    if any("dummy credentials" in note for note in clients.notes):
        return Check(name, SKIP, "dummy credentials for a local endpoint")
    creds = _credentials(clients.session)
    if creds is None:
        return Check(name, UNKNOWN, NO_CREDENTIALS.split(":")[0])
    method = getattr(creds, "method", None) or "unknown"
    up = f"the modelled `pulumi up` lasts {_hours(up_seconds)} ({up_how})"
    sso_token = None
    if method in SSO_BACKED_METHODS:
        import botocore.session

        profile = clients.session.profile_name
        try:
            sso_token = sso_token_of(profile, botocore.session.Session(profile=profile).full_config, now)
        except Exception:  # noqa: BLE001 - an unreadable config: the token is "not visible" (warn below)
            sso_token = None
    try:
        identity = _call(clients, "sts", "GetCallerIdentity", "get_caller_identity").get("Arn", "?")
    except Exception as err:  # noqa: BLE001 - e.g. an assume-role that STS refuses: cannot tell
        if sso_token is not None and sso_token.expires_at <= now:  # an ended SSO session is why, and the fix is known
            return _sso_check(name, f"profile {clients.session.profile_name} ({method})", sso_token, now, up_seconds, up,
                              method)
        why = str(err) if isinstance(err, ApiUnknown) else _code(err) or one_line(err)[:160]
        return Check(name, UNKNOWN, f"{method} credentials: {why}")
    who = f"{identity} ({method})"
    if method in SSO_BACKED_METHODS and isinstance(creds, RefreshableCredentials):
        return _sso_check(name, who, sso_token, now, up_seconds, up, method)
    if method in REFRESHING_CREDENTIAL_METHODS and isinstance(creds, RefreshableCredentials):
        return Check(name, PASS, f"{who}: botocore renews these credentials before they expire; {up}")
    if not creds.get_frozen_credentials().token:
        return Check(name, PASS, f"{who}: long-term access keys, no expiry; {up}")
    deadline = now + timedelta(seconds=up_seconds)
    expiry_text = os.environ.get("AWS_CREDENTIAL_EXPIRATION", "") if method == "env" else ""
    if expiry_text:
        try:
            expiry = parse_utc(expiry_text, "AWS_CREDENTIAL_EXPIRATION")
        except ConfigError:
            return Check(name, FAIL, f"{who}: AWS_CREDENTIAL_EXPIRATION {expiry_text!r} is not an ISO 8601 time")
        if expiry <= deadline:
            return Check(
                name, FAIL,
                f"{who}: a session token no SDK can renew, expiring {format_utc(expiry)}, before `pulumi up` would end "
                f"({format_utc(deadline)}; {up}): {CREDENTIALS_FIX}",
            )
        return Check(
            name, WARN,
            f"{who}: a session token no SDK can renew, valid until {format_utc(expiry)}, "
            f"{_hours((expiry - deadline).total_seconds())} after the modelled `pulumi up` ends; {CREDENTIALS_FIX} to be safe",
        )
    status = FAIL if up_seconds > STS_DEFAULT_SESSION_SECONDS else WARN
    return Check(
        name, status,
        f"{who}: a session token no SDK can renew, expiry unknown (an STS AssumeRole session lasts "
        f"{_hours(STS_DEFAULT_SESSION_SECONDS)} by default); {up}: {CREDENTIALS_FIX}",
    )


def check_deployable(spec: DeploymentSpec) -> Check:
    """``deployable``: the stack's blockers (``spec.up_blockers``: what makes `pulumi up` refuse the
    stack in its phase, e.g. an engine build that cannot serve the model, or an EKS API source no
    machine has; ``program.build_context`` raises the first) fail here, one line each joined; pass
    when there is none (a stage with only serve's blockers passes, naming them)."""
    blockers = spec.up_blockers
    if blockers:
        more = f" (+{len(blockers) - 1} more)" if len(blockers) > 1 else ""
        return Check("deployable", FAIL, f"`pulumi up` refuses this stack: {one_line(blockers[0])}{more}")
    if spec.blockers:
        more = f" (+{len(spec.blockers) - 1} more)" if len(spec.blockers) > 1 else ""
        # the program declares a stage whatever blocks serving only (program.build_context)
        return Check("deployable", PASS, f"phase: stage: `pulumi up` stages the weights; serve is refused until "
                                         f"fixed: {one_line(spec.blockers[0])}{more}")
    return Check("deployable", PASS, "`pulumi up` accepts the stack's config (no blocker)")


def check_service(spec: DeploymentSpec, clients: AwsClients, service: str) -> Check:
    """FSx for Lustre or EKS answers in the region (only where the stack uses it)."""
    from botocore.exceptions import ClientError, EndpointConnectionError

    if service == "fsx":
        used = spec.config.storage.kind in ("fsx", "nvme-from-fsx")
        why = f"storage.kind {spec.config.storage.kind}"
        op, method, kwargs, title = "DescribeFileSystems", "describe_file_systems", {"MaxResults": 1}, "FSx for Lustre"
    else:
        used = spec.platform == "aws-eks"
        why = f"platform {spec.platform}"
        op, method, kwargs, title = "ListClusters", "list_clusters", {"maxResults": 1}, "EKS"
    if not used:
        return Check(service, SKIP, f"not used ({why})")
    try:
        _call(clients, service, op, method, **kwargs)
    except ApiUnknown as err:
        if isinstance(err.__cause__, EndpointConnectionError):
            return Check(service, FAIL, f"{title} has no endpoint in {clients.region}")
        return Check(service, UNKNOWN, str(err))
    except ClientError as err:
        return Check(service, UNKNOWN, f"{op}: {_code(err)}")
    return Check(service, PASS, f"{title} answers in {clients.region} ({why})")


def check_mirror(spec: DeploymentSpec, clients: AwsClients, bucket_override: str | None) -> Check:
    """The S3 mirror bucket and its manifest.json: every listed file present at its size. In a
    ``phase: stage`` stack a complete mirror says to switch to serve (``SWITCH_TO_SERVE``)."""
    from botocore.exceptions import ClientError

    name = "mirror"
    mirror = spec.config.storage.mirror
    if not mirror.enabled:
        return Check(name, SKIP, "storage.mirror.enabled is false: nodes sync from the hub")
    bucket = bucket_override or mirror.bucket_name
    if not bucket:
        return Check(name, SKIP, "created by `pulumi up` (no storage.mirror.bucketName); pass --mirror-bucket to check it later")
    prefix = mirror_key_prefix(spec)
    where = f"s3://{bucket}/{prefix}"
    try:
        _call(clients, "s3", "HeadBucket", "head_bucket", Bucket=bucket)
    except ApiUnknown as err:
        return Check(name, UNKNOWN, str(err))
    except ClientError as err:
        if _code(err) in ("404", "NoSuchBucket", "NotFound"):
            if mirror.create and not bucket_override:
                return Check(name, SKIP, f"bucket {bucket} does not exist yet: `pulumi up` creates it")
            return Check(name, FAIL, f"bucket {bucket} does not exist")
        return Check(name, UNKNOWN, f"HeadBucket {bucket}: {_code(err)}")
    try:
        body = _call(clients, "s3", "GetObject", "get_object", Bucket=bucket, Key=f"{prefix}/{MANIFEST_NAME}")["Body"].read()
    except ApiUnknown as err:
        return Check(name, UNKNOWN, str(err))
    except ClientError as err:
        if _code(err) in ("NoSuchKey", "404"):
            if spec.staging:
                return Check(name, WARN, f"{where}/{MANIFEST_NAME} is missing: the stage's publish has not finished; stay in "
                             "phase stage (the manifest and marker are written last)")
            return Check(
                name,
                WARN,
                f"{where}/{MANIFEST_NAME} is missing: the first sync downloads {spec.model.weights_bytes / 1e12:.2f} TB from the "
                "hub",
            )
        return Check(name, UNKNOWN, f"GetObject {MANIFEST_NAME}: {_code(err)}")
    try:
        document = json.loads(body)
        files = {str(f["path"]): int(f["size_bytes"]) for f in document["files"]}
    except (ValueError, KeyError, TypeError) as err:
        return Check(name, FAIL, f"{where}/{MANIFEST_NAME} is malformed ({type(err).__name__})")
    sizes: dict[str, int] = {}
    try:
        paginator = clients.get("s3", "ListObjectsV2").get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=f"{prefix}/"):
            for obj in page.get("Contents", []):
                sizes[obj["Key"][len(prefix) + 1 :]] = obj["Size"]
    except Exception as err:  # noqa: BLE001 - cannot list: cannot tell
        return Check(name, UNKNOWN, f"ListObjectsV2 {where}: {_code(err) or one_line(err)}")
    missing = [p for p in files if p not in sizes]
    wrong = [p for p, size in files.items() if p in sizes and sizes[p] != size]
    if missing or wrong:
        first = (missing + wrong)[0]
        return Check(name, FAIL, f"{where} is incomplete: {len(missing)} missing, {len(wrong)} wrong size (e.g. {first})")
    total = sum(files.values())
    what = f"{where}: {len(files)} files, {total / 1e12:.2f} TB, all present"
    if MARKER_NAME not in sizes:
        return Check(name, WARN, f"{what}, but no {MARKER_NAME}: the last sync did not finish")
    if len(files) != spec.model.file_count:
        return Check(name, WARN, f"{what}; the model profile lists {spec.model.file_count} files")
    if spec.staging:
        return Check(name, PASS, f"{what}: staged; switch: {SWITCH_TO_SERVE}")
    return Check(name, PASS, what)


# ---------------------------------------------------------------------------------------------
# The Kubernetes API: can this machine reach what `pulumi up` creates objects through?
# ---------------------------------------------------------------------------------------------

# Where this machine's public (egress) address is looked up: AWS's own checkip service answers the
# address it sees, one line. KIMI_DEPLOY_CHECKIP_URL (or --checkip-url) replaces it; empty: no look-up.
CHECKIP_URL_ENV = "KIMI_DEPLOY_CHECKIP_URL"
DEFAULT_CHECKIP_URL = "https://checkip.amazonaws.com"
# Short: a path that works answers in well under a second; pulumi-kubernetes itself waits 32 s per
# request (pulumi-kubernetes#349) before it calls the cluster unreachable.
API_CONNECT_TIMEOUT_SECONDS = 5.0
CHECKIP_TIMEOUT_SECONDS = 5.0


def checkip_url_from_env() -> str | None:
    """The egress look-up URL: ``KIMI_DEPLOY_CHECKIP_URL`` when set (empty: None, no look-up), else
    ``DEFAULT_CHECKIP_URL``."""
    value = os.environ.get(CHECKIP_URL_ENV)
    if value is None:
        return DEFAULT_CHECKIP_URL
    return value.strip() or None


def egress_address(url: str, timeout_seconds: float = CHECKIP_TIMEOUT_SECONDS) -> tuple[str | None, str]:
    """This machine's public IPv4 address as ``url`` (a checkip-style service: the body is the
    address) sees it: ``(address, "")``, or ``(None, why not)``. Never raises."""
    import ipaddress
    import urllib.request

    if not url.lower().startswith(("http://", "https://")):  # never a local file's bytes in a report
        return None, f"{url.split(':', 1)[0]!r} URLs are not read (http or https only)"
    try:
        with urllib.request.urlopen(url, timeout=timeout_seconds) as response:  # noqa: S310 - a URL the operator chose
            text = response.read(64).decode("ascii", "replace").strip()
    except Exception as err:  # noqa: BLE001 - no answer is "cannot tell", never a crash
        return None, f"{url} did not answer ({one_line(getattr(err, 'reason', None) or err)[:120]})"
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None, f"{url} answered {text[:40]!r}, not an address"
    if address.version != 4:
        return None, f"{url} answered the IPv6 address {address}: the cluster admits IPv4 sources only"
    return str(address), ""


def tcp_reach(host: str, port: int, timeout_seconds: float = API_CONNECT_TIMEOUT_SECONDS) -> tuple[bool, str]:
    """A TCP connection to ``host:port`` (what the Kubernetes client opens first): ``(True, "answers
    at <address>")`` or ``(False, why not)`` (the name does not resolve, refused, timed out). Never raises."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as err:
        return False, f"{host} does not resolve ({one_line(err)[:100]})"
    address = str(infos[0][4][0])
    try:
        with socket.create_connection((address, port), timeout=timeout_seconds):
            return True, f"{host}:{port} answers (at {address})"
    except TimeoutError:
        return False, f"{host}:{port} (at {address}) did not answer within {timeout_seconds:g} s"
    except OSError as err:
        return False, f"{host}:{port} (at {address}): {one_line(err.strerror or err)[:100]}"


def source_address_toward(address: str) -> str | None:
    """The address this machine sends from toward ``address`` (its routing table's choice), or
    None when it has no route. A UDP ``connect`` picks the route and sends nothing."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, EKS_API_SERVER_PORT))
            return str(probe.getsockname()[0])
    except OSError:
        return None


def _in_any(address: str, cidrs: Sequence[str]) -> str | None:
    """The first of ``cidrs`` that holds ``address``, or None."""
    import ipaddress

    ip = ipaddress.ip_address(address)
    return next((c for c in cidrs if ip in ipaddress.ip_network(c)), None)


def kubernetes_api_not_applicable(spec: DeploymentSpec) -> Check | None:
    """``kubernetes-api`` as ``skip`` where the stack creates no EKS cluster (an existing cluster's
    kubeconfig is ``cluster``'s to contact), else None."""
    if spec.profile.creates_cluster:
        return None
    why = ("an existing cluster: its kubeconfig's server is checked by `cluster` (--check-cluster)"
           if spec.profile.runs_kubernetes else f"not applicable: platform {spec.platform} (no Kubernetes API)")
    return Check("kubernetes-api", SKIP, why)


def check_kubernetes_api(spec: DeploymentSpec, clients: AwsClients, checkip_url: str | None) -> Check:
    """``kubernetes-api``: this machine reaches the EKS API server the stack's Kubernetes objects go
    through (``config.api_server_access``), so `pulumi up`, preview and destroy do not fail with
    "cluster unreachable" after the cluster and its GPU nodes exist (pulumi-eks#1134).

    - The cluster exists (EKS DescribeCluster of ``naming.eks_cluster_name``): a TCP connection to
      its endpoint on 443 within ``API_CONNECT_TIMEOUT_SECONDS``: pass, or fail naming the keys of
      the stack's access mode.
    - Not yet (ResourceNotFoundException): ``public-cidrs``: this machine's egress address
      (``checkip_url``) is in ``network.apiServerPublicCidrs`` (pass) or not (fail);
      ``private``: the address it sends from toward ``network.vpcId`` (DescribeVpcs) is in
      ``network.apiServerPrivateCidrs`` (pass) or not (fail; unknown when security groups are
      also admitted, since this machine's groups are not visible here).
    - ``unknown`` whenever it cannot tell (no credentials, no look-up URL, no answer); ``skip``
      off ``aws-eks``.
    """
    from components.core.config import api_server_access
    from components.core.naming import eks_cluster_name

    name = "kubernetes-api"
    skip = kubernetes_api_not_applicable(spec)
    if skip is not None:
        return skip
    access = api_server_access(spec.config)
    cluster = eks_cluster_name(spec.project, spec.stack)
    keys = ("network.apiServerPublicCidrs (this machine's egress address, /32)" if access.public
            else "network.apiServerPrivateCidrs or apiServerPrivateSecurityGroupIds (this machine's network)")
    not_yet = ""
    try:
        found = _call(clients, "eks", "DescribeCluster", "describe_cluster", name=cluster)["cluster"]
    except ApiUnknown as err:
        found, not_yet = None, f"EKS cannot say whether {cluster} exists ({err}); "
    except Exception as err:  # noqa: BLE001 - judged below
        if _code(err) != "ResourceNotFoundException":
            return Check(name, UNKNOWN, f"DescribeCluster {cluster}: {_code(err) or one_line(err)[:160]}")
        found = None
    if found is not None:
        from urllib.parse import urlsplit

        endpoint = urlsplit(str(found.get("endpoint") or ""))
        if not endpoint.hostname:
            return Check(name, UNKNOWN, f"{cluster} has no endpoint yet (status {found.get('status', '?')})")
        ok, detail = tcp_reach(endpoint.hostname, endpoint.port or EKS_API_SERVER_PORT)
        if ok:
            return Check(name, PASS, f"{cluster}: {detail} from this machine ({access.summary})")
        return Check(name, FAIL, f"{cluster}: {detail}: `pulumi up`, preview and destroy from here fail with \"cluster "
                                 f"unreachable\"; this machine must be admitted by {keys} ({access.summary})")
    if access.public:
        if checkip_url is None:
            return Check(name, UNKNOWN, f"{not_yet}this machine's egress address was not looked up ({CHECKIP_URL_ENV} is "
                                        f"empty); it must be in {', '.join(access.public_cidrs)}")
        address, why = egress_address(checkip_url)
        if address is None:
            return Check(name, UNKNOWN,
                         f"{not_yet}{why}: cannot tell whether this machine is in {', '.join(access.public_cidrs)}")
        holder = _in_any(address, access.public_cidrs)
        if holder:
            return Check(name, PASS, f"{not_yet}before creation: this machine's egress address {address} is in {holder} "
                                     "(network.apiServerPublicCidrs)")
        return Check(name, FAIL, f"{not_yet}before creation: this machine's egress address {address} is not in "
                                 f"network.apiServerPublicCidrs ({', '.join(access.public_cidrs)}): `pulumi up` from here "
                                 f"would create the cluster and GPU nodes, then fail \"cluster unreachable\"; add "
                                 f"{address}/32 or run from an address in the list")
    vpc_id = access.vpc_id or "?"
    try:
        vpcs = _call(clients, "ec2", "DescribeVpcs", "describe_vpcs", VpcIds=[vpc_id])["Vpcs"]
    except ApiUnknown as err:
        return Check(name, UNKNOWN, f"{not_yet}DescribeVpcs {vpc_id}: {err}")
    except Exception as err:  # noqa: BLE001
        return Check(name, FAIL if _code(err).startswith("InvalidVpcID") else UNKNOWN,
                     f"{not_yet}network.vpcId {vpc_id}: {_code(err) or one_line(err)[:160]}")
    import ipaddress

    resolver = str(ipaddress.ip_network(vpcs[0]["CidrBlock"])[2])  # the VPC's DNS resolver: always in it
    source = source_address_toward(resolver)
    if source is None:
        return Check(name, FAIL, f"{not_yet}this machine has no route to {vpc_id} ({vpcs[0]['CidrBlock']}): connect the "
                                 "VPN, peering or transit gateway first, or run inside the VPC")
    holder = _in_any(source, access.private_cidrs) if access.private_cidrs else None
    if holder:
        return Check(name, PASS, f"{not_yet}before creation: this machine sends from {source} toward {vpc_id}, in {holder} "
                                 "(network.apiServerPrivateCidrs); the route itself is not tried")
    if access.private_security_group_ids:
        return Check(name, UNKNOWN, f"{not_yet}this machine sends from {source} toward {vpc_id}, not in "
                                    f"network.apiServerPrivateCidrs; whether it is in "
                                    f"{', '.join(access.private_security_group_ids)} is not visible here")
    return Check(name, FAIL, f"{not_yet}before creation: this machine sends from {source} toward {vpc_id}, not in "
                             f"network.apiServerPrivateCidrs ({', '.join(access.private_cidrs)}): the cluster security "
                             "group would not admit it on 443 (add its network, or the address a VPN translates it to)")


# ---------------------------------------------------------------------------------------------
# Kubernetes checks (only with --check-cluster: they contact the cluster)
# ---------------------------------------------------------------------------------------------


def _check_kubeconfig_shape(kubeconfig: Path) -> None:
    """Refuse a file that is no kubeconfig before the client reads it (``--kubeconfig /etc/passwd``
    ended in a TypeError inside the client): UTF-8 YAML within the stack files' bounds
    (``stack_file.yaml_bounds_problem``) whose top is a map with a ``contexts`` list, as kubectl
    writes it (Kubernetes docs, "Organizing Cluster Access Using kubeconfig Files").

    Raises:
        UsageError: one line naming the file and what it is instead.
    """
    import yaml

    from components.core.config.stack_file import read_text_file, yaml_bounds_problem

    expected = "a YAML map with clusters, contexts and users, as kubectl or `aws eks update-kubeconfig` writes it"
    try:
        text = read_text_file(kubeconfig, "--kubeconfig", str(kubeconfig), "the file")
        problem = yaml_bounds_problem(text)
        data = None if problem else yaml.safe_load(text)
    except ConfigError as err:
        raise UsageError(str(err)) from None
    except yaml.YAMLError as err:
        raise UsageError(f"--kubeconfig: {kubeconfig} is not YAML ({one_line(err)[:100]}): give {expected}") from None
    if problem:
        raise UsageError(f"--kubeconfig: {kubeconfig} {problem}")
    if not isinstance(data, dict) or not isinstance(data.get("contexts"), list):
        found = type(data).__name__ if not isinstance(data, dict) else "a map without a contexts list"
        found = {"str": "one line of text", "NoneType": "empty", "list": "a list"}.get(found, found)
        raise UsageError(f"--kubeconfig: {kubeconfig} is not a kubeconfig ({found}): give {expected}")


def _list_nodes(kubeconfig: Path, context: str | None, timeout_seconds: float) -> list[dict[str, Any]]:
    """The cluster's nodes (``GET /api/v1/nodes``) as JSON dicts, through the official client.

    ``kubernetes.config.load_kube_config`` reads the context (server, CA, client certificate,
    token) and runs exec plugins such as ``aws eks get-token``, the way kubectl does; CoreV1Api
    lists the nodes. Source: https://github.com/kubernetes-client/python (config/kube_config.py,
    ``ExecProvider``).

    Raises:
        UsageError: the kubeconfig cannot be read, ``context`` is not in it, or it has no server.
        ApiUnknown: the API server does not answer (``does not answer``) or answers an error
            (``answered HTTP 401``); a failed exec plugin's message is appended.
    """
    import logging

    import urllib3
    from kubernetes import client as kube_client
    from kubernetes import config as kube_config
    from kubernetes.config.config_exception import ConfigException

    _check_kubeconfig_shape(kubeconfig)
    try:
        contexts, active = kube_config.list_kube_config_contexts(config_file=str(kubeconfig))
    except (ConfigException, OSError, ValueError) as err:  # yaml errors are ValueErrors
        raise UsageError(f"--kubeconfig: cannot read {kubeconfig}: {one_line(err)[:120]}") from None
    except (TypeError, AttributeError, KeyError) as err:  # a map whose parts are not what a kubeconfig holds
        raise UsageError(f"--kubeconfig: {kubeconfig} is not a kubeconfig ({type(err).__name__} in the client: "
                         f"{one_line(err)[:80]}); give the file `aws eks update-kubeconfig` or kubectl wrote") from None
    ctx_name = context or (active or {}).get("name")
    if ctx_name not in {c.get("name") for c in contexts or []}:
        raise UsageError(f"--context: {ctx_name!r} is not a context in {kubeconfig}")
    # The loader logs (not raises) a failing exec plugin; keep the message for the reason.
    plugin_errors: list[str] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = lambda record: plugin_errors.append(one_line(record.getMessage())[:160])  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    try:
        configuration = kube_client.Configuration()
        kube_config.load_kube_config(
            config_file=str(kubeconfig), context=ctx_name, client_configuration=configuration, persist_config=False
        )
    except ConfigException as err:
        raise UsageError(f"--kubeconfig: context {ctx_name!r}: {one_line(err)[:160]}") from None
    finally:
        logging.getLogger().removeHandler(handler)
    configuration.retries = 0  # one try: an unreachable server is reported, not retried three times
    plugin = f" (exec plugin: {plugin_errors[0]})" if plugin_errors else ""
    try:
        with kube_client.ApiClient(configuration) as api_client:
            nodes = kube_client.CoreV1Api(api_client).list_node(_request_timeout=timeout_seconds)
            return [api_client.sanitize_for_serialization(node) for node in nodes.items or []]
    except kube_client.ApiException as err:
        raise ApiUnknown(f"{configuration.host}/api/v1/nodes answered HTTP {err.status}{plugin}") from None
    except (urllib3.exceptions.HTTPError, OSError, ValueError) as err:  # connection, TLS, timeout, bad JSON
        reason = getattr(err, "reason", None) or err
        raise ApiUnknown(f"{configuration.host} does not answer: {one_line(reason)[:160]}{plugin}") from None


def check_cluster(spec: DeploymentSpec, kubeconfig: Path | None, context: str | None, enabled: bool) -> list[Check]:
    """The cluster answers and enough nodes advertise the target's GPU resource; where a copy spans
    an NVLink domain, their cliques hold every copy (``check_nvlink_cliques``)."""
    if not spec.profile.runs_kubernetes:
        reason = f"platform {spec.platform}: no Kubernetes cluster"
        return [Check("cluster", SKIP, reason), Check("gpu-nodes", SKIP, reason)]
    if not enabled:
        reason = "pass --check-cluster to contact the cluster (a network call)"
        return [Check("cluster", SKIP, reason), Check("gpu-nodes", SKIP, reason)]
    path = kubeconfig or Path(os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or Path.home() / ".kube" / "config")
    context = context or spec.config.kubernetes.context
    try:
        items = _list_nodes(Path(path), context, 15)
    except ApiUnknown as err:
        return [Check("cluster", UNKNOWN, str(err)), Check("gpu-nodes", UNKNOWN, "cluster not reached")]
    resource, per_node = spec.target.gpu_resource_name, spec.target.gpus_per_node
    ready = []
    for node in items:
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        try:
            count = int(str(allocatable.get(resource, "0")))
        except ValueError:
            count = 0
        if count >= per_node:
            ready.append(node.get("metadata", {}).get("name", "?"))
    first = Check("cluster", PASS, f"API server answers: {len(items)} node(s)")
    need = spec.gpu_nodes
    what = f"{len(ready)} node(s) advertise {per_node}x {resource}; {need} needed"
    cliques = [check_nvlink_cliques(spec, [n for n in items if n.get("metadata", {}).get("name", "?") in ready])]
    cliques = cliques if spec.spans_nvlink_domain else []
    if len(ready) >= need:
        return [first, Check("gpu-nodes", PASS, f"{what} ({', '.join(ready[:4])})"), *cliques]
    return [first, Check("gpu-nodes", FAIL, f"{what}: is the device plugin / GPU operator running?"), *cliques]


def check_nvlink_cliques(spec: DeploymentSpec, gpu_nodes: list[dict[str, Any]]) -> Check:
    """``nvlink-cliques``: the GPU nodes' NVLink cliques (``nvidia.com/gpu.clique``, GPU Feature
    Discovery) hold every copy, each inside one clique (the LeaderWorkerSet's required pod affinity,
    components/k8s/vllm_service.py ``nvlink_clique_affinity``): the sum over cliques of
    ``nodes // nodes_per_copy`` is at least ``replicas``. A GPU node without the label takes no vLLM
    pod. ``gpu_nodes``: Node objects (``metadata.labels``) that advertise the GPUs."""
    from components.core.targets import NVLINK_CLIQUE_LABEL

    per_clique: dict[str, int] = {}
    unlabelled = 0
    for node in gpu_nodes:
        value = ((node.get("metadata") or {}).get("labels") or {}).get(NVLINK_CLIQUE_LABEL)
        if value:
            per_clique[value] = per_clique.get(value, 0) + 1
        else:
            unlabelled += 1
    copies = sum(n // spec.nodes_per_copy for n in per_clique.values())
    what = (f"{len(per_clique)} clique(s) of {sorted(per_clique.values(), reverse=True)} GPU node(s) hold {copies} "
            f"copy(ies) of {spec.nodes_per_copy} nodes; {spec.replicas} needed")
    if unlabelled:
        what += f"; {unlabelled} GPU node(s) without {NVLINK_CLIQUE_LABEL} (is GPU feature discovery running?)"
    return Check("nvlink-cliques", PASS if copies >= spec.replicas else FAIL, what)


def check_vllm_argv(spec: DeploymentSpec, vllm_python: Path | None) -> Check:
    """Every role's ``vllm serve`` command of the stack (``vllm.extraArgs`` included) parsed by
    the real vLLM parser in ``vllm_python`` (``.venv-vllm``; scripts/ops/vllm_parser.py), with the
    role's environment, through the steps ``vllm serve`` takes before it loads a model
    (scripts/ops/vllm_argv_check.py: argparse, validate, parser registry, engine args, cache config, the
    scheduler limits through the engine's own SchedulerConfig for the target's GPU, the attention backend).

    ``skip`` without the parser venv (it is a 2 GB developer install); ``unknown`` when it cannot
    run; ``fail`` names the role, the stage and vLLM's own error; ``warn`` when the parser is
    another vLLM release than the stack's engine (a flag added since is not known to it).
    """
    if vllm_python is None:
        return Check("vllm-argv", SKIP, f"vLLM parser not installed ({VLLM_PARSER_INSTALL_HINT}) to check the command")
    from components.core.engine import attention_facts, parse_engine_image
    from components.core.sizing import compute_sizing
    from components.core.vllm import build_vllm_command

    command = build_vllm_command(spec, compute_sizing(spec))
    gpu = spec.target.gpu
    facts = attention_facts(spec.model, gpu.compute_capability, gpu_memory_bytes=gpu.memory_bytes, gpu_name=gpu.name)
    request = argv_check_request((role.concrete_argv() for role in command.roles), (role.env for role in command.roles),
                                 (facts for _ in command.roles))
    try:
        report = run_argv_check(vllm_python, request, timeout_seconds=300)
    except VllmParserError as err:
        return Check("vllm-argv", UNKNOWN, one_line(err)[:200])
    parser_version = str(report.get("vllm_version"))
    for role, result in zip(command.roles, report["results"], strict=True):
        if not result["ok"]:
            return Check(
                "vllm-argv", FAIL,
                f"vLLM {parser_version} rejects the {role.name} command [{result['stage']}]: "
                f"{one_line(result['error'])[:200]} (kimi-deploy:vllm.extraArgs?)",
            )
    roles = ", ".join(role.name for role in command.roles)
    build = parse_engine_image(command.image)
    if build.version != parser_version:
        return Check(
            "vllm-argv", WARN,
            f"vLLM {parser_version}'s parser accepts the {roles} command, but the image is not that release "
            f"({build.describe()}): flags added or removed since are not checked",
        )
    return Check("vllm-argv", PASS, f"vLLM {parser_version}'s parser accepts the {roles} command")


def check_engine_image(spec: DeploymentSpec, runtime: engine_verify.RuntimeSelection | str | None) -> Check:
    """``kimi-deploy engine verify`` of the stack's engine image (scripts/ops/engine_verify.py): pulled
    with the chosen container runtime, the model's required features, version, parsers, env names
    and serve commands checked inside it (the image is ~25 GB).

    ``runtime``: a runtime's path; or ``engine_verify.select_runtime()``'s answer (the reason names
    the runtime used and why others were skipped; with none chosen, ``skip`` says why each was not
    used; an empty selection is ``--runtime none``); or None (no runtime: ``skip``).
    """
    from components.core.sizing import compute_sizing
    from components.core.vllm import build_vllm_command

    hint = "run `kimi-deploy engine verify --image IMAGE` where one does"
    if runtime is None:
        return Check("engine-image", SKIP, f"no container runtime (docker or podman) answers here: {hint}")
    if isinstance(runtime, str):
        path, used = runtime, os.path.basename(runtime)
    elif runtime.chosen is not None and runtime.chosen.path is not None:
        path, used = runtime.chosen.path, runtime.brief()
    elif not runtime.probes:
        return Check("engine-image", SKIP, "not run (--runtime none): `kimi-deploy engine verify --image IMAGE` runs it alone")
    else:
        return Check("engine-image", SKIP, one_line(f"{runtime.describe()}: {hint}")[:300])
    image = build_vllm_command(spec, compute_sizing(spec)).image
    result = engine_verify.verify(image, spec.stack, path)
    # The verdict first (cut to fit a table cell), then the runtime that gave it.
    if result.proven:
        verdict, status = f"{image} serves {spec.model.display_name} (pinned: {result.pinned})", PASS
    else:
        verdict, status = "; ".join(result.refusals()), FAIL
    verdict = one_line(verdict)
    return Check("engine-image", status, f"{verdict if len(verdict) <= 240 else verdict[:237] + '...'} (runtime {used})")


# ---------------------------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------------------------


def aws_region(spec: DeploymentSpec, override: str | None) -> str:
    """The AWS region preflight asks: ``override`` (``--region``) when set, else the stack's
    ``aws:region``.

    Raises:
        UsageError: neither is set (``parse_spec`` requires ``aws:region`` on AWS platforms, so
            only a spec built around it gets here).
    """
    region = override or spec.region
    if not region:
        raise UsageError("--region: the stack sets no aws:region; pass --region (e.g. us-east-1)")
    return region


# Every check's name, in the order run_checks lists them (``--only`` takes these).
AWS_CHECK_NAMES = (
    "deploy-credentials",
    "instance-facts",
    "offered-in-region",
    "offered-in-az",
    "zone-type",
    "vcpu-quota",
    "capacity-reservation",
    "capacity-end",
    "capacity-ready",
    "fsx",
    "eks",
    "eks-version",
    "kubernetes-api",
    "mirror",
)
CHECK_NAMES = ("deployable", *AWS_CHECK_NAMES, "cluster", "gpu-nodes", "vllm-argv", "engine-image")


def run_checks(
    spec: DeploymentSpec,
    *,
    region: str | None = None,
    now: datetime | None = None,
    clients: AwsClients | None = None,
    mirror_bucket: str | None = None,
    check_cluster_enabled: bool = False,
    kubeconfig: Path | None = None,
    context: str | None = None,
    progress: Callable[[str], None] | None = None,
    vllm_python: Path | None = None,
    container_runtime: engine_verify.RuntimeSelection | str | None = None,
    checkip_url: str | None = None,
    only: Collection[str] | None = None,
) -> list[Check]:
    """All preflight checks of ``spec`` in order (``CHECK_NAMES``). Never raises for an API's answer.

    ``vllm_python``: the vLLM parser venv's python for ``vllm-argv`` (None: that check is skipped).
    ``container_runtime``: the runtime for ``engine-image`` (``check_engine_image``): a path, or
    ``engine_verify.select_runtime()``'s answer; without one that check is ``skip``.
    ``checkip_url``: where ``kubernetes-api`` looks up this machine's egress address before the
    cluster exists (None: it does not look, and says so).
    ``only``: run and list these checks alone (and what they need: the mirror decides the
    capacity scenario, instance-facts the offerings).
    """
    from components.core.time_to_ready import pulumi_up_seconds, stack_time_to_ready

    def want(*names: str) -> bool:
        return only is None or any(n in only for n in names)

    now = now or datetime.now(UTC)
    checks: list[Check] = []
    step = progress or (lambda _name: None)
    step("config")
    checks.append(check_deployable(spec))
    if not spec.profile.provisions_aws:
        checks += [kubernetes_api_not_applicable(spec) or Check(n, SKIP, "") if n == "kubernetes-api"
                   else Check(n, SKIP, f"not applicable: platform {spec.platform}") for n in AWS_CHECK_NAMES]
    else:
        region = aws_region(spec, region)
        clients = clients or AwsClients(region)
        model = stack_time_to_ready(spec)
        # Without credentials every check still runs: one that does not apply to the stack is
        # `skip` either way; one that needs an API answer is `unknown` (``_call``).
        if want("deploy-credentials"):
            step("credentials")
            checks.append(check_deploy_credentials(spec, clients, now, *pulumi_up_seconds(spec, model)))
        if want("instance-facts", "offered-in-region", "offered-in-az", "zone-type"):
            step("instance type")
            facts, known = check_instance_facts(spec, clients)
            checks.append(facts)
            step("offerings")
            checks += check_offerings(spec, clients, spec.availability_zone, known)
            checks.append(check_zone_type(spec, clients))
        if want("vcpu-quota"):
            step("quota")
            checks.append(check_quota(spec, clients))
        mirror = None
        if want("mirror", "capacity-reservation", "capacity-end", "capacity-ready"):
            # The mirror decides the scenario the capacity is compared with: a complete one is a
            # repeat trial (weights and caches from the mirror), otherwise a first deploy.
            step("S3 mirror")
            mirror = check_mirror(spec, clients, mirror_bucket)
        if mirror is not None and want("capacity-reservation", "capacity-end", "capacity-ready"):
            step("capacity reservation")
            scenario = "repeat_trial" if mirror.status == PASS else "first_deploy"
            checks += check_reservation(spec, clients, now, ReadyModel.of(model, scenario))
        if want("fsx", "eks", "eks-version"):
            step("FSx and EKS")
            checks.append(check_service(spec, clients, "fsx"))
            checks.append(check_service(spec, clients, "eks"))
            checks.append(check_eks_version(spec, clients, now))
        if want("kubernetes-api"):
            step("Kubernetes API")
            checks.append(check_kubernetes_api(spec, clients, checkip_url))
        if mirror is not None:
            checks.append(mirror)
    if want("cluster", "gpu-nodes"):
        step("cluster")
        checks += check_cluster(spec, kubeconfig, context, check_cluster_enabled)
    if want("vllm-argv"):
        step("vLLM command")
        checks.append(check_vllm_argv(spec, vllm_python))
    if want("engine-image"):
        step("engine image")
        checks.append(check_engine_image(spec, container_runtime))
    return [c for c in checks if only is None or c.name in only]


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog=prog_name("scripts/ops/preflight.py"),
        description="Check that a stack can get its GPU capacity before `pulumi up`: instance offered in "
        "the region and AZ, facts match the profile, vCPU quota, capacity reservation or block, FSx/EKS, "
        "the S3 weight mirror and (optionally) the Kubernetes cluster. Statuses: pass, warn, fail, "
        "unknown (the API could not answer), skip (not applicable).",
        epilog="Exit codes: 0 nothing failed and at least one check passed or warned (the result line says "
        "'ok' only when no check was skipped or unknown, else e.g. 'nothing failed, but not everything was "
        "checked (3 passed, 8 skipped)'), 1 a check failed, 2 usage or config error, no AWS credentials, the "
        "AWS endpoint cannot be reached, or every check was skipped or unknown (nothing was checked; the "
        "per-check results are still printed). "
        "AWS credentials and AWS_ENDPOINT_URL are read from the environment as boto3 does; with AWS_ENDPOINT_URL "
        "on localhost/127.0.0.1 and no credentials, dummy credentials are used (a local moto).",
    )
    parser.add_argument("--stack", required=True, help=f"stack name: stacks/Pulumi.<stack>.yaml ({', '.join(stack_names())})")
    parser.add_argument("--region", help="AWS region to check instead of the stack's aws:region (e.g. to compare regions)")
    parser.add_argument(
        "--mirror-bucket", metavar="BUCKET",
        help="S3 mirror bucket to check when the stack lets `pulumi up` name it (the stack output)",
    )
    parser.add_argument(
        "--check-cluster", action="store_true",
        help="for Kubernetes platforms: contact the API server with the kubeconfig and count GPU nodes "
        "(a network call, off by default)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="kubeconfig for --check-cluster (default $KUBECONFIG, then ~/.kube/config)",
    )
    parser.add_argument(
        "--context", help="kubeconfig context for --check-cluster (default kubernetes.context, then current-context)"
    )
    parser.add_argument(
        "--only", metavar="CHECK", action="append", type=_check_names,
        help="run only these checks (repeatable or comma-separated; e.g. --only kubernetes-api where `pulumi preview` "
        f"runs): {', '.join(CHECK_NAMES)}",
    )
    parser.add_argument(
        "--checkip-url", metavar="URL",
        help=f"where kubernetes-api looks up this machine's egress address before the cluster exists (default "
        f"${CHECKIP_URL_ENV}, else {DEFAULT_CHECKIP_URL}; '' to not look it up)",
    )
    parser.add_argument(
        "--runtime", choices=(*engine_verify.RUNTIMES, "none"),
        help="container runtime for the engine-image check (default: the first of docker, podman on PATH whose "
        "`info` answers); `none` skips that check (it pulls the ~25 GB engine image)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for machines instead of a table")
    return parser


def _check_names(text: str) -> list[str]:
    """``--only`` values: comma-separated check names (``CHECK_NAMES``)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECK_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or repr(text)} is not a check (checks: {', '.join(CHECK_NAMES)})")
    return names


def _nothing_checked_hint(spec: DeploymentSpec, checks: Sequence[Check], args: argparse.Namespace) -> str:
    """What would let a run that checked nothing check something: ``--check-cluster`` only where the
    stack runs Kubernetes and the cluster checks were asked for (it is a Kubernetes-only option; an
    EC2 stack's `--only vllm-argv` was told to pass it), else the first skipped check's own reason."""
    cluster_asked = args.only is None or any({"cluster", "gpu-nodes"} & set(names) for names in args.only)
    if spec.profile.runs_kubernetes and cluster_asked and not args.check_cluster:
        return "; pass --check-cluster to check the cluster"
    skipped = next((c for c in checks if c.status == SKIP), None)
    return f"; {skipped.name}: {skipped.reason}" if skipped is not None else ""


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.kubeconfig is not None and not args.kubeconfig.is_file():
        raise UsageError(f"--kubeconfig: {args.kubeconfig} is not a file")
    if args.region is not None:
        from components.core.errors import did_you_mean
        from components.core.targets import AWS_REGIONS

        if args.region not in AWS_REGIONS:  # else every AWS check reports the endpoint, not the typo
            raise UsageError(f"--region: {args.region!r} is not an AWS region"
                             + (did_you_mean(args.region, AWS_REGIONS) or " (e.g. us-east-1)"))
    checkip = checkip_url_from_env() if args.checkip_url is None else (args.checkip_url.strip() or None)
    if checkip is not None and not checkip.lower().startswith(("http://", "https://")):
        # urllib also opens file:// and ftp://: --checkip-url file:///etc/passwd printed the file's first bytes.
        where = "--checkip-url" if args.checkip_url is not None else CHECKIP_URL_ENV
        raise UsageError(f"{where}: {checkip.split(':', 1)[0]!r} URLs are not read: give an http(s) URL of a checkip-style "
                         f"service (default {DEFAULT_CHECKIP_URL}), or an empty value for no look-up")
    now = datetime.now(UTC)
    print_overlay_notice(stack=args.stack)
    spec = load_stack(args.stack, now=now)
    region = args.region or spec.region
    clients = AwsClients(aws_region(spec, args.region)) if spec.profile.provisions_aws else None
    common: dict[str, Any] = {
        "region": region, "now": now, "clients": clients, "mirror_bucket": args.mirror_bucket,
        "check_cluster_enabled": args.check_cluster, "kubeconfig": args.kubeconfig, "context": args.context,
        "vllm_python": find_vllm_python(),
        "container_runtime": (engine_verify.RuntimeSelection(()) if args.runtime == "none"
                              else engine_verify.find_runtime(args.runtime) if args.runtime
                              else engine_verify.select_runtime()),
        "checkip_url": checkip,
        "only": None if args.only is None else {n for names in args.only for n in names},
    }
    if sys.stderr.isatty() and not args.json:
        from rich.console import Console

        with Console(stderr=True).status("preflight") as status:
            checks = run_checks(spec, **common, progress=lambda s: status.update(f"preflight: {s}"))
    else:
        checks = run_checks(spec, **common)
    code = exit_code(c.status for c in checks)
    counts = status_counts(c.status for c in checks)
    result, verdict_code = verdict(counts)
    notes = list(clients.notes) if clients else []
    # Nothing checked is no green light: no credentials or no endpoint is exit 2, not 0 (or 1).
    error = None
    # Only a check left unknown needed AWS (--only deployable needs none: its pass is the verdict).
    needed_aws = any(c.status == UNKNOWN for c in checks)
    if clients is not None and not clients.has_credentials() and needed_aws:
        error = NO_CREDENTIALS
    elif clients is not None and clients.unreachable and needed_aws:
        error = f"{clients.unreachable}: check the network or AWS_ENDPOINT_URL"
    elif verdict_code == EXIT_USAGE:
        error = f"nothing could be checked ({counts_text(counts)})" + _nothing_checked_hint(spec, checks, args)
    if error and code == EXIT_CHECK_FAILED:
        # A check that ran and failed (e.g. vllm-argv, offline) is the verdict; the AWS problem
        # that kept the other checks from running is said as a note, not in its place.
        notes.append(f"not checked on AWS: {error}")
        error = None
    if error:
        code = EXIT_USAGE
        result = f"NOT CHECKED ({counts_text(counts)}): see the error below"
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        print_json({
            "stack": spec.stack, "platform": spec.platform, "region": region,
            "availability_zone": spec.availability_zone, "instance_type": spec.instance.instance_type,
            "gpu_nodes": spec.gpu_nodes, "ok": code == 0 and result.startswith("ok"), "exit_code": code,
            "result": result, "counts": counts, "error": error, "notes": notes, "checks": [asdict(c) for c in checks],
        })
    else:
        where = f"{region} / {spec.availability_zone or 'any AZ'}" if spec.profile.provisions_aws else spec.platform
        print_table(
            f"Preflight: stack {spec.stack} ({spec.gpu_nodes}x {spec.instance.instance_type}, {where})",
            ("check", "status", "reason"),
            [(c.name, c.status, c.reason) for c in checks],
            status_column=1,
            caption="result: " + result,
        )
    if error:
        print(f"error: {error}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(run_cli(main))
