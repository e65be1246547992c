#!/usr/bin/env python3
"""Sweeper: find and (with ``--destroy``) remove what kimi-deploy created whose ``expires-at`` passed.

A forgotten trial is the most expensive bug this project can have (one B300 node is ~USD 140/h),
so this runs on a schedule (``.github/workflows/sweep.yml``) and by hand. Without the Pulumi CLI
and without Pulumi state it still works: it reads tags through the AWS APIs (boto3; honors
``AWS_ENDPOINT_URL``).

What is ours: resources tagged ``kimi-deploy:stack`` (every taggable resource carries it, see
``DeploymentSpec.tags``), and what Kubernetes created in AWS for one of our EKS clusters
(load balancers, their interfaces and security groups, VPC CNI interfaces: tagged
``kubernetes.io/cluster/<name>``, ``elbv2.k8s.aws/cluster`` or ``cluster.k8s.amazonaws.com/name``),
which is that cluster's stack's and shares its expiry (``cluster_leftovers``). Expired: its ``expires-at`` tag
(RFC 3339 UTC) is at or before
``--now``. Node groups without their own ``expires-at`` inherit their cluster's. Never touched:
anything tagged ``kimi-deploy:retain=true``, the weight mirror (``kimi-deploy:role=weights-mirror``)
and S3 buckets in general (reported, never deleted). Capacity reservations and capacity blocks
are reported while they are still paid for: destroying a stack does not cancel them.

With ``--destroy``: first ``pulumi destroy`` of each expired stack through the Automation API
when the ``pulumi`` CLI is on PATH (skipped, and said so, when any resource tagged to be retained
in that stack's state lacks ``retainOnDelete``), then delete what is left, in dependency order:
node groups, clusters, instances, load balancers, file systems, network interfaces, security
groups, volumes. Load balancers go after the cluster (while it runs, its service controller
would create a deleted one again) and before the interfaces and groups that keep the VPC.

Exit codes: 0 nothing expired remains (dry run: nothing expired was found); 1 something expired
remains (dry run: expired resources found; with --destroy: something could not be removed);
2 usage error, bad --now, or no AWS credentials.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: its folder is on sys.path, the project may not be installed here
    import _cli  # noqa: F401  first: a missing package (or the project itself) prints `make setup`, not a traceback

from components.spec.config import format_utc as _utc
from components.spec.config import parse_utc
from components.spec.naming import (  # one place for tag keys
    ROLE_WEIGHTS_MIRROR,
    TAG_ENVIRONMENT,
    TAG_OWNER,
    TAG_PROJECT,
    TAG_RETAIN,
    TAG_ROLE,
    TAG_STACK,
)
from components.spec.naming import TAG_EXPIRES_AT as TAG_EXPIRES
from scripts._cli import CliParser, aws_session

REPO_ROOT = Path(__file__).resolve().parents[1]

# AWS region names: us-east-1, us-gov-west-1, ap-southeast-2, eu-central-1 ...
REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$")
# Botocore client settings: an endpoint that does not answer fails in seconds, not minutes
# (a connect timeout of 5 s and 3 attempts; the first refused or timed-out connection of a
# region stops that region's discovery, see ``EndpointUnreachable``).
CLIENT_CONFIG = {"connect_timeout": 5, "read_timeout": 30, "retries": {"max_attempts": 3, "mode": "standard"}}

# Tag keys this sweeper relies on (set by components/program.py and the AWS edge).

# Kinds in the order they are deleted: consumers before what they consume.
DELETE_ORDER: tuple[str, ...] = (
    "eks-nodegroup",
    "eks-cluster",
    "ec2-instance",
    "load-balancer",
    "fsx-file-system",
    "network-interface",
    "security-group",
    "ebs-volume",
)
REPORT_ONLY_KINDS = ("s3-bucket", "capacity-reservation")
# What Kubernetes creates in AWS for a cluster, and how it marks it (the stack's own tags come
# from the Service annotation service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags,
# but older objects, or ones made by hand in the cluster, may carry only these):
# - load balancers and their security groups: ``kubernetes.io/cluster/<name>`` (the legacy AWS
#   cloud provider's service controller) or ``elbv2.k8s.aws/cluster: <name>`` (AWS Load
#   Balancer Controller);
# - network interfaces: ``cluster.k8s.amazonaws.com/name: <name>`` (Amazon VPC CNI) or
#   ``kubernetes.io/cluster/<name>``; a load balancer's own interfaces are described
#   ``ELB net/<lb name>/<id>`` (``app/`` for ALBs) and carry no tag at all.
CLUSTER_TAG_PREFIX = "kubernetes.io/cluster/"
LBC_CLUSTER_TAG = "elbv2.k8s.aws/cluster"
CNI_CLUSTER_TAG = "cluster.k8s.amazonaws.com/name"


class UsageError(Exception):
    """A user's mistake (exit 2, one line, no traceback)."""


def parse_time(text: str) -> datetime:
    """An ISO 8601 / RFC 3339 time as an aware UTC datetime.

    Raises:
        ValueError: not a time.
    """
    return parse_utc(text, TAG_EXPIRES)


def _tags(pairs: Iterable[Mapping[str, str]] | Mapping[str, str] | None) -> dict[str, str]:
    if not pairs:
        return {}
    if isinstance(pairs, Mapping):
        return dict(pairs)
    return {p["Key"]: p.get("Value", "") for p in pairs}


@dataclass
class Found:
    """One resource of ours.

    Attributes:
        kind: one of ``DELETE_ORDER`` or ``REPORT_ONLY_KINDS``.
        id: the AWS id (instance id, ARN for load balancers, ``cluster/nodegroup`` for node groups).
        region: AWS region.
        stack, project, owner, environment: from the tags.
        expires_at: the ``expires-at`` tag as found (None when absent).
        expired: ``expires-at`` is at or before now.
        retained: tagged ``kimi-deploy:retain=true`` or the weight mirror: never deleted.
        status: what was done: ``active`` (not expired), ``would-delete`` (dry run),
            ``deleted``, ``kept`` (retained or never deleted), ``failed``, ``still-paid``.
        reason: why (kept, failed, invalid expiry), one line.
        detail: kind-specific facts (instance type, state, end date of a capacity block).
    """

    kind: str
    id: str
    region: str
    stack: str
    project: str = ""
    owner: str = ""
    environment: str = ""
    expires_at: str | None = None
    expired: bool = False
    retained: bool = False
    status: str = "active"
    reason: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict, repr=False)


def classify(
    kind: str, rid: str, region: str, tags: Mapping[str, str], now: datetime, detail: dict | None = None
) -> Found | None:
    """A ``Found`` for a resource with ``tags``, or None when it is not ours (no stack tag)."""
    if TAG_STACK not in tags:
        return None
    item = Found(
        kind=kind,
        id=rid,
        region=region,
        stack=tags[TAG_STACK],
        project=tags.get(TAG_PROJECT, ""),
        owner=tags.get(TAG_OWNER, ""),
        environment=tags.get(TAG_ENVIRONMENT, ""),
        expires_at=tags.get(TAG_EXPIRES),
        detail=dict(detail or {}),
        tags=dict(tags),
    )
    item.retained = tags.get(TAG_RETAIN, "").lower() == "true" or tags.get(TAG_ROLE) == ROLE_WEIGHTS_MIRROR
    if item.expires_at and item.environment == "prod":
        # Config rejects expiresAt on prod stacks; a prod resource carrying the tag anyway (set by
        # hand, or by an old release) is reported, never ended by the sweeper.
        item.reason = "environment prod: expires-at ignored, never swept"
    elif item.expires_at:
        try:
            item.expired = parse_time(item.expires_at) <= now
        except ValueError:
            item.reason = f"expires-at {item.expires_at!r} is not an RFC 3339 time: not swept (fix the tag)"
    return item


# ---------------------------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------------------------

ClientFactory = Callable[[str, str], Any]


_SESSIONS: list[Any] = []  # one boto3 session per process (scripts._cli.aws_session)
SESSION_NOTES: list[str] = []


def default_client_factory(service: str, region: str):
    """A boto3 client from ``scripts._cli.aws_session``, the same session preflight uses:
    ``AWS_ENDPOINT_URL`` and boto3's per-service variants are read by botocore itself, and a
    local endpoint without credentials gets dummy ones (noted in ``SESSION_NOTES``)."""
    from botocore.config import Config

    if not _SESSIONS:
        _SESSIONS.append(aws_session(SESSION_NOTES))
    return _SESSIONS[0].client(service, region_name=region, config=Config(**CLIENT_CONFIG))


def _paginate(client, op: str, key: str, **kwargs) -> list[dict]:
    out: list[dict] = []
    if client.can_paginate(op):
        for page in client.get_paginator(op).paginate(**kwargs):
            out.extend(page.get(key, []))
    else:
        out.extend(getattr(client, op)(**kwargs).get(key, []))
    return out


_OURS = [{"Name": "tag-key", "Values": [TAG_STACK]}]


class EndpointUnreachable(Exception):
    """The AWS endpoint of a region cannot be reached (refused, DNS, timeout); ``str(err)`` is
    one line with the region and the reason."""


def _is_connection_error(err: Exception) -> bool:
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return False
    return isinstance(err, BotoConnectionError)


def discover(clients: ClientFactory, region: str, now: datetime) -> tuple[list[Found], list[str]]:
    """Everything of ours in ``region``, and errors of kinds that could not be listed.

    Raises:
        EndpointUnreachable: the first call that cannot connect (the other kinds would only
            wait for the same timeout again).
    """
    found: list[Found] = []
    errors: list[str] = []
    ec2 = clients("ec2", region)

    def attempt(what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - one unlistable kind must not hide the others
            if _is_credentials_error(err):
                raise
            if _is_connection_error(err):
                raise EndpointUnreachable(
                    f"{region}: cannot reach the AWS endpoint while listing {what}: {_one_line(err)}"
                ) from None
            errors.append(f"{region}: could not list {what}: {_one_line(err)}")

    def instances():
        for res in _paginate(
            ec2,
            "describe_instances",
            "Reservations",
            Filters=[*_OURS, {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}],
        ):
            for inst in res.get("Instances", []):
                f = classify(
                    "ec2-instance",
                    inst["InstanceId"],
                    region,
                    _tags(inst.get("Tags")),
                    now,
                    {"instance_type": inst.get("InstanceType"), "state": inst.get("State", {}).get("Name")},
                )
                if f:
                    found.append(f)

    def volumes():
        for vol in _paginate(ec2, "describe_volumes", "Volumes", Filters=_OURS):
            f = classify(
                "ebs-volume",
                vol["VolumeId"],
                region,
                _tags(vol.get("Tags")),
                now,
                {"state": vol.get("State"), "size_gib": vol.get("Size")},
            )
            if f:
                found.append(f)

    def security_groups():
        for sg in _paginate(ec2, "describe_security_groups", "SecurityGroups", Filters=_OURS):
            f = classify(
                "security-group",
                sg["GroupId"],
                region,
                _tags(sg.get("Tags")),
                now,
                {"name": sg.get("GroupName"), "vpc_id": sg.get("VpcId")},
            )
            if f:
                found.append(f)

    def enis():
        for eni in _paginate(ec2, "describe_network_interfaces", "NetworkInterfaces", Filters=_OURS):
            f = classify(
                "network-interface",
                eni["NetworkInterfaceId"],
                region,
                _tags(eni.get("TagSet")),
                now,
                {"status": eni.get("Status"), "description": eni.get("Description", "")},
            )
            if f:
                found.append(f)

    def capacity():
        for cr in _paginate(ec2, "describe_capacity_reservations", "CapacityReservations", Filters=_OURS):
            state = cr.get("State")
            f = classify(
                "capacity-reservation",
                cr["CapacityReservationId"],
                region,
                _tags(cr.get("Tags")),
                now,
                {
                    "state": state,
                    "reservation_type": cr.get("ReservationType", "default"),
                    "instance_type": cr.get("InstanceType"),
                    "instance_count": cr.get("TotalInstanceCount"),
                    "availability_zone": cr.get("AvailabilityZone"),
                    "end_date": _utc(cr["EndDate"]) if isinstance(cr.get("EndDate"), datetime) else cr.get("EndDate"),
                },
            )
            if f and state in ("active", "scheduled", "payment-pending", "pending", "assessing"):
                found.append(f)

    attempt("instances", instances)
    attempt("volumes", volumes)
    attempt("security groups", security_groups)
    attempt("network interfaces", enis)
    attempt("capacity reservations", capacity)

    def eks():
        client = clients("eks", region)
        for name in _paginate(client, "list_clusters", "clusters"):
            cluster = client.describe_cluster(name=name)["cluster"]
            ctags = _tags(cluster.get("tags"))
            cf = classify("eks-cluster", name, region, ctags, now, {"status": cluster.get("status")})
            for ng_name in _paginate(client, "list_nodegroups", "nodegroups", clusterName=name):
                ng = client.describe_nodegroup(clusterName=name, nodegroupName=ng_name)["nodegroup"]
                ntags = _tags(ng.get("tags"))
                if TAG_EXPIRES not in ntags and cf is not None and cf.expires_at:
                    ntags = {**ctags, **ntags, TAG_EXPIRES: cf.expires_at}  # inherits the cluster's expiry
                elif TAG_STACK not in ntags and cf is not None:
                    ntags = {**ctags, **ntags}
                nf = classify(
                    "eks-nodegroup",
                    f"{name}/{ng_name}",
                    region,
                    ntags,
                    now,
                    {"instance_types": ng.get("instanceTypes"), "status": ng.get("status")},
                )
                if nf:
                    found.append(nf)
            if cf:
                found.append(cf)

    untagged_lbs: list[tuple[dict, dict[str, str]]] = []  # load balancers without our stack tag

    def lbs():
        client = clients("elbv2", region)
        balancers = _paginate(client, "describe_load_balancers", "LoadBalancers")
        for i in range(0, len(balancers), 20):
            chunk = balancers[i : i + 20]
            descs = client.describe_tags(ResourceArns=[b["LoadBalancerArn"] for b in chunk])["TagDescriptions"]
            by_arn = {d["ResourceArn"]: _tags(d.get("Tags")) for d in descs}
            for b in chunk:
                if TAG_STACK not in by_arn.get(b["LoadBalancerArn"], {}):
                    untagged_lbs.append((b, by_arn.get(b["LoadBalancerArn"], {})))
                f = classify(
                    "load-balancer",
                    b["LoadBalancerArn"],
                    region,
                    by_arn.get(b["LoadBalancerArn"], {}),
                    now,
                    {"name": b.get("LoadBalancerName"), "type": b.get("Type")},
                )
                if f:
                    found.append(f)

    def fsx():
        client = clients("fsx", region)
        for fs in _paginate(client, "describe_file_systems", "FileSystems"):
            if fs.get("Lifecycle") in ("DELETING",):
                continue
            f = classify(
                "fsx-file-system",
                fs["FileSystemId"],
                region,
                _tags(fs.get("Tags")),
                now,
                {"type": fs.get("FileSystemType"), "capacity_gib": fs.get("StorageCapacity")},
            )
            if f:
                found.append(f)

    def buckets():
        client = clients("s3", region)
        for b in client.list_buckets().get("Buckets", []):
            try:
                loc = client.get_bucket_location(Bucket=b["Name"]).get("LocationConstraint") or "us-east-1"
                if loc != region:
                    continue
                tags = _tags(client.get_bucket_tagging(Bucket=b["Name"]).get("TagSet"))
            except Exception as err:  # noqa: BLE001 - untagged or foreign buckets
                if "NoSuchTagSet" in str(err) or "AccessDenied" in str(err) or "NoSuchBucket" in str(err):
                    continue
                raise
            f = classify("s3-bucket", b["Name"], region, tags, now)
            if f:
                found.append(f)

    attempt("EKS clusters and node groups", eks)
    attempt("load balancers", lbs)
    attempt(
        "what Kubernetes created for our clusters", lambda: found.extend(cluster_leftovers(ec2, region, now, found, untagged_lbs))
    )
    attempt("FSx file systems", fsx)
    attempt("S3 buckets", buckets)
    return found, errors


def _for_cluster(tags: Mapping[str, str], cluster: str) -> bool:
    """Whether AWS tags mark a resource as created by Kubernetes for EKS cluster ``cluster``."""
    return (
        f"{CLUSTER_TAG_PREFIX}{cluster}" in tags
        or tags.get(LBC_CLUSTER_TAG) == cluster
        or tags.get(CNI_CLUSTER_TAG) == cluster
    )


def cluster_leftovers(
    ec2, region: str, now: datetime, found: list[Found], untagged_lbs: list[tuple[dict, dict[str, str]]]
) -> list[Found]:
    """Load balancers, their interfaces and security groups, and CNI interfaces that Kubernetes
    created for one of our EKS clusters but that carry no ``kimi-deploy:stack`` tag.

    Each becomes the cluster's stack's, with the cluster's tags (stack, owner, ``expires-at``,
    retain), so it is swept with the cluster: otherwise an NLB of a ``LoadBalancer`` Service
    outlives the cluster, its interfaces keep the subnets (and the VPC) from being deleted,
    and nothing reports it. Resources already found by their own tags are not repeated.
    """
    known = {f.id for f in found}
    out: list[Found] = []
    clusters = [f for f in found if f.kind == "eks-cluster"]

    def inherit(cf: Found, own: Mapping[str, str]) -> dict[str, str]:
        return {**own, **{k: v for k, v in cf.tags.items() if k != "Name"}}

    for cf in clusters:
        note = {"created_by": f"Kubernetes for EKS cluster {cf.id}"}
        lb_descriptions: list[str] = []
        for lb, ltags in untagged_lbs:
            arn = lb["LoadBalancerArn"]
            if arn in known or not _for_cluster(ltags, cf.id):
                continue
            f = classify(
                "load-balancer",
                arn,
                region,
                inherit(cf, ltags),
                now,
                {"name": lb.get("LoadBalancerName"), "type": lb.get("Type"), **note},
            )
            if f:
                out.append(f)
                known.add(arn)
                kind = "net" if lb.get("Type") == "network" else "app"
                lb_descriptions.append(f"ELB {kind}/{lb.get('LoadBalancerName')}/*")
        eni_filters = [
            [{"Name": f"tag:{CNI_CLUSTER_TAG}", "Values": [cf.id]}],
            [{"Name": "tag-key", "Values": [f"{CLUSTER_TAG_PREFIX}{cf.id}"]}],
        ]
        if lb_descriptions:
            eni_filters.append([{"Name": "description", "Values": lb_descriptions}])
        for filters in eni_filters:
            for eni in _paginate(ec2, "describe_network_interfaces", "NetworkInterfaces", Filters=filters):
                eid = eni["NetworkInterfaceId"]
                if eid in known:
                    continue
                f = classify(
                    "network-interface",
                    eid,
                    region,
                    inherit(cf, _tags(eni.get("TagSet"))),
                    now,
                    {"status": eni.get("Status"), "description": eni.get("Description", ""), **note},
                )
                if f:
                    out.append(f)
                    known.add(eid)
        for filters in (
            [{"Name": "tag-key", "Values": [f"{CLUSTER_TAG_PREFIX}{cf.id}"]}],
            [{"Name": f"tag:{LBC_CLUSTER_TAG}", "Values": [cf.id]}],
        ):
            for sg in _paginate(ec2, "describe_security_groups", "SecurityGroups", Filters=filters):
                if sg["GroupId"] in known:
                    continue
                f = classify(
                    "security-group",
                    sg["GroupId"],
                    region,
                    inherit(cf, _tags(sg.get("Tags"))),
                    now,
                    {"name": sg.get("GroupName"), "vpc_id": sg.get("VpcId"), **note},
                )
                if f:
                    out.append(f)
                    known.add(sg["GroupId"])
    return out


def _is_credentials_error(err: Exception) -> bool:
    name = type(err).__name__
    return (
        name in ("NoCredentialsError", "PartialCredentialsError", "NoRegionError")
        or "UnrecognizedClientException" in str(err)
        or "InvalidClientTokenId" in str(err)
    )


def _one_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def _error_code(err: Exception) -> str:
    return getattr(err, "response", {}).get("Error", {}).get("Code", "") if hasattr(err, "response") else ""


# ---------------------------------------------------------------------------------------------
# Pulumi destroy (Automation API)
# ---------------------------------------------------------------------------------------------


@dataclass
class DestroyOutcome:
    """What happened to one stack's ``pulumi destroy``: status ``destroyed``, ``skipped``, ``failed``."""

    stack: str
    status: str
    reason: str = ""


def unsafe_retained_in_state(deployment: Mapping[str, Any]) -> list[str]:
    """URNs in an exported stack state tagged to be retained (or the mirror) that ``pulumi
    destroy`` would delete (no ``retainOnDelete``, not protected)."""
    unsafe = []
    for res in deployment.get("resources", []) or []:
        outputs = res.get("outputs") or {}
        tags = outputs.get("tags") or outputs.get("tagsAll") or {}
        if not isinstance(tags, Mapping):
            continue
        if tags.get(TAG_RETAIN, "").lower() == "true" or tags.get(TAG_ROLE) == ROLE_WEIGHTS_MIRROR:
            if not res.get("retainOnDelete") and not res.get("protect"):
                unsafe.append(res.get("urn", "?"))
    return unsafe


class AutomationDestroyer:
    """``pulumi destroy`` of a stack through ``pulumi.automation`` (needs the CLI on PATH)."""

    def __init__(self, work_dir: Path = REPO_ROOT):
        self.work_dir = work_dir

    def available(self) -> bool:
        return shutil.which("pulumi") is not None

    def destroy(self, stack: str) -> DestroyOutcome:
        from pulumi import automation as auto

        try:
            st = auto.select_stack(stack_name=stack, work_dir=str(self.work_dir))
            state = st.export_stack().deployment or {}
            unsafe = unsafe_retained_in_state(state)
            if unsafe:
                return DestroyOutcome(
                    stack,
                    "skipped",
                    f"state holds resources tagged to be retained without retainOnDelete: {', '.join(unsafe[:3])}",
                )
            st.destroy(exclude_protected=True, continue_on_error=True, on_output=lambda line: print(line, file=sys.stderr))
            return DestroyOutcome(stack, "destroyed")
        except Exception as err:  # noqa: BLE001 - the API cleanup below still runs
            return DestroyOutcome(stack, "failed", _one_line(err))


# ---------------------------------------------------------------------------------------------
# Deletion
# ---------------------------------------------------------------------------------------------


class Sweeper:
    """Finds expired resources and deletes them in dependency order.

    Args:
        clients: ``(service, region) -> boto3 client``.
        regions: regions to sweep.
        now: the clock (aware UTC).
        destroy: False = dry run (nothing is changed).
        destroyer: runs ``pulumi destroy`` per expired stack (None: never).
        wait_seconds: how long to wait for asynchronous deletions (node groups, load balancer
            interfaces) before reporting failure.
        poll_seconds: pause between checks while waiting.
    """

    def __init__(
        self,
        clients: ClientFactory,
        regions: list[str],
        now: datetime,
        *,
        destroy: bool = False,
        destroyer: AutomationDestroyer | None = None,
        wait_seconds: float = 900,
        poll_seconds: float = 10,
        log: Callable[[str], None] | None = None,
    ):
        self.clients, self.regions, self.now = clients, regions, now
        self.destroy, self.destroyer = destroy, destroyer
        self.wait_seconds, self.poll_seconds = wait_seconds, poll_seconds
        self.log = log or (lambda msg: None)

    def run(self) -> dict[str, Any]:
        """Sweep every region; returns the report (see ``report``)."""
        items: list[Found] = []
        errors: list[str] = []
        destroys: list[DestroyOutcome] = []
        for region in self.regions:
            try:
                found, errs = discover(self.clients, region, self.now)
            except EndpointUnreachable as err:
                errors.append(str(err))  # nothing of this region is known: the run fails (exit 1)
                continue
            errors += errs
            if self.destroy and self.destroyer is not None:
                expired_stacks = sorted({f.stack for f in found if f.expired and not f.retained and f.kind in DELETE_ORDER})
                if expired_stacks and not self.destroyer.available():
                    destroys += [
                        DestroyOutcome(s, "skipped", "pulumi CLI not found: deleting through the AWS APIs only")
                        for s in expired_stacks
                        if s not in {d.stack for d in destroys}
                    ]
                elif expired_stacks:
                    for stack in expired_stacks:
                        if stack in {d.stack for d in destroys}:
                            continue
                        self.log(f"pulumi destroy {stack}")
                        destroys.append(self.destroyer.destroy(stack))
                    found, errs = discover(self.clients, region, self.now)  # what destroy left behind
            for f in found:
                self._mark(f)
            if self.destroy:
                self._delete_region(region, [f for f in found if f.status == "would-delete"])
            items += found
        return self.report(items, errors, destroys)

    def _mark(self, f: Found) -> None:
        if f.kind == "capacity-reservation":
            f.status = "still-paid"
            kind = "capacity block" if f.detail.get("reservation_type") == "capacity-block" else "capacity reservation"
            f.reason = (f"{kind} {f.detail.get('state')} until {f.detail.get('end_date') or 'cancelled'}: destroy does not "
                        "cancel it; it is billed for its term")
            return
        if not f.expired:
            return
        if f.retained:
            f.status, f.reason = (
                "kept",
                "tagged to be retained" if f.tags.get(TAG_RETAIN, "").lower() == "true" else "the weight mirror is never deleted",
            )
        elif f.kind in REPORT_ONLY_KINDS:
            f.status, f.reason = "kept", "S3 buckets are never deleted by the sweeper"
        else:
            f.status = "would-delete"

    # Each deleter starts the deletion; ``_gone`` tells when it is complete.
    def _delete_region(self, region: str, targets: list[Found]) -> None:
        by_kind: dict[str, list[Found]] = {k: [] for k in DELETE_ORDER}
        for f in targets:
            by_kind[f.kind].append(f)
        ec2 = self.clients("ec2", region)
        for kind in DELETE_ORDER:
            batch = by_kind[kind]
            if not batch:
                continue
            self.log(f"{region}: deleting {len(batch)} {kind}")
            for f in batch:
                try:
                    getattr(self, "_delete_" + kind.replace("-", "_"))(region, f, ec2)
                except Exception as err:  # noqa: BLE001
                    if _is_credentials_error(err):
                        raise
                    f.status, f.reason = "failed", _one_line(err)
            self._wait(region, [f for f in batch if f.status == "would-delete"], ec2)

    def _wait(self, region: str, pending: list[Found], ec2) -> None:
        deadline = time.monotonic() + self.wait_seconds
        while pending:
            still = []
            for f in pending:
                try:
                    done = self._gone(region, f, ec2)
                except Exception as err:  # noqa: BLE001
                    f.status, f.reason = "failed", _one_line(err)
                    continue
                if done:
                    f.status, f.reason = "deleted", ""
                else:
                    still.append(f)
            pending = still
            if pending and time.monotonic() >= deadline:
                for f in pending:
                    f.status, f.reason = "failed", f"still present after {self.wait_seconds:.0f} s"
                return
            if pending:
                time.sleep(self.poll_seconds)

    # -- per kind ----------------------------------------------------------------------------

    def _delete_eks_nodegroup(self, region, f, ec2):
        cluster, ng = f.id.split("/", 1)
        self.clients("eks", region).delete_nodegroup(clusterName=cluster, nodegroupName=ng)

    def _delete_eks_cluster(self, region, f, ec2):
        self.clients("eks", region).delete_cluster(name=f.id)

    def _delete_ec2_instance(self, region, f, ec2):
        ec2.terminate_instances(InstanceIds=[f.id])

    def _delete_load_balancer(self, region, f, ec2):
        self.clients("elbv2", region).delete_load_balancer(LoadBalancerArn=f.id)

    def _delete_fsx_file_system(self, region, f, ec2):
        # No final backup: a trial's file system only holds an import of the mirror.
        self.clients("fsx", region).delete_file_system(FileSystemId=f.id, LustreConfiguration={"SkipFinalBackup": True})

    def _delete_network_interface(self, region, f, ec2):
        from botocore.exceptions import ClientError

        try:
            eni = ec2.describe_network_interfaces(NetworkInterfaceIds=[f.id])["NetworkInterfaces"][0]
        except ClientError as err:
            if _error_code(err) == "InvalidNetworkInterfaceID.NotFound":
                return  # a load balancer's interface went with it
            raise
        attachment = eni.get("Attachment")
        if attachment and attachment.get("AttachmentId") and attachment.get("DeviceIndex", 1) != 0:
            ec2.detach_network_interface(AttachmentId=attachment["AttachmentId"], Force=True)

    def _delete_security_group(self, region, f, ec2):
        # Rules in other groups that reference this one block its deletion: revoke them first.
        for other in _paginate(
            ec2, "describe_security_groups", "SecurityGroups", Filters=[{"Name": "ip-permission.group-id", "Values": [f.id]}]
        ):
            perms = [
                p for p in other.get("IpPermissions", []) if any(g.get("GroupId") == f.id for g in p.get("UserIdGroupPairs", []))
            ]
            if perms:
                ec2.revoke_security_group_ingress(GroupId=other["GroupId"], IpPermissions=[_only_group(p, f.id) for p in perms])
        for other in _paginate(
            ec2,
            "describe_security_groups",
            "SecurityGroups",
            Filters=[{"Name": "egress.ip-permission.group-id", "Values": [f.id]}],
        ):
            perms = [
                p
                for p in other.get("IpPermissionsEgress", [])
                if any(g.get("GroupId") == f.id for g in p.get("UserIdGroupPairs", []))
            ]
            if perms:
                ec2.revoke_security_group_egress(GroupId=other["GroupId"], IpPermissions=[_only_group(p, f.id) for p in perms])

    def _delete_ebs_volume(self, region, f, ec2):
        pass  # deleted in _gone once detached (instances terminate first)

    def _gone(self, region: str, f: Found, ec2) -> bool:
        """Whether ``f`` is deleted; retries the kinds whose deletion waits on others."""
        from botocore.exceptions import ClientError

        try:
            if f.kind == "eks-nodegroup":
                cluster, ng = f.id.split("/", 1)
                self.clients("eks", region).describe_nodegroup(clusterName=cluster, nodegroupName=ng)
                return False
            if f.kind == "eks-cluster":
                self.clients("eks", region).describe_cluster(name=f.id)
                return False
            if f.kind == "ec2-instance":
                inst = ec2.describe_instances(InstanceIds=[f.id])["Reservations"][0]["Instances"][0]
                return inst["State"]["Name"] == "terminated"
            if f.kind == "load-balancer":
                self.clients("elbv2", region).describe_load_balancers(LoadBalancerArns=[f.id])
                return False
            if f.kind == "fsx-file-system":
                systems = self.clients("fsx", region).describe_file_systems(FileSystemIds=[f.id]).get("FileSystems", [])
                return not systems
            if f.kind == "network-interface":
                ec2.delete_network_interface(NetworkInterfaceId=f.id)
                return True
            if f.kind == "security-group":
                # Detached interfaces left in the group (load balancer or CNI leftovers) block it.
                for eni in _paginate(
                    ec2,
                    "describe_network_interfaces",
                    "NetworkInterfaces",
                    Filters=[{"Name": "group-id", "Values": [f.id]}, {"Name": "status", "Values": ["available"]}],
                ):
                    if _tags(eni.get("TagSet")).get(TAG_RETAIN, "").lower() != "true":
                        ec2.delete_network_interface(NetworkInterfaceId=eni["NetworkInterfaceId"])
                ec2.delete_security_group(GroupId=f.id)
                return True
            if f.kind == "ebs-volume":
                ec2.delete_volume(VolumeId=f.id)
                return True
        except ClientError as err:
            code = _error_code(err)
            if code in (
                "ResourceNotFoundException",
                "LoadBalancerNotFound",
                "FileSystemNotFound",
                "InvalidNetworkInterfaceID.NotFound",
                "InvalidGroup.NotFound",
                "InvalidVolume.NotFound",
                "InvalidInstanceID.NotFound",
            ):
                return True
            if code in (
                "DependencyViolation",
                "InvalidNetworkInterface.InUse",
                "VolumeInUse",
                "IncorrectState",
                "InvalidParameterValue",
            ):
                return False  # something it depends on is still going away: retry until the deadline
            raise
        return True

    # -- report ------------------------------------------------------------------------------

    def report(self, items: list[Found], errors: list[str], destroys: list[DestroyOutcome]) -> dict[str, Any]:
        """The JSON report::

            {"now", "regions", "mode": "dry-run"|"destroy",
             "stacks": {stack: {"expired", "expires_at", "owner", "environment", "resources": [Found]}},
             "pulumi_destroy": [{stack, status, reason}], "still_paid": [Found], "errors": [str],
             "summary": {"expired", "would_delete", "deleted", "failed", "kept", "still_paid", "invalid_expiry"},
             "exit_code"}
        """
        stacks: dict[str, dict[str, Any]] = {}
        for f in items:
            if f.kind == "capacity-reservation":
                continue
            s = stacks.setdefault(
                f.stack, {"expired": False, "expires_at": None, "owner": f.owner, "environment": f.environment, "resources": []}
            )
            s["expired"] = s["expired"] or f.expired
            s["expires_at"] = s["expires_at"] or f.expires_at
            s["resources"].append(_public(f))
        still_paid = [_public(f) for f in items if f.status == "still-paid"]
        count = lambda status: sum(1 for f in items if f.status == status)  # noqa: E731
        summary = {
            "expired": sum(1 for f in items if f.expired and f.kind != "capacity-reservation"),
            "would_delete": count("would-delete"),
            "deleted": count("deleted"),
            "failed": count("failed"),
            "kept": count("kept"),
            "still_paid": len(still_paid),
            "invalid_expiry": sum(1 for f in items if f.reason.startswith("expires-at")),
        }
        remaining = summary["would_delete"] + summary["failed"]
        return {
            "now": _utc(self.now),
            "regions": list(self.regions),
            "mode": "destroy" if self.destroy else "dry-run",
            "stacks": dict(sorted(stacks.items())),
            "pulumi_destroy": [asdict(d) for d in destroys],
            "still_paid": still_paid,
            "errors": errors,
            "summary": summary,
            "exit_code": 1 if remaining or errors else 0,
        }


def _only_group(perm: Mapping[str, Any], group_id: str) -> dict[str, Any]:
    keep = {k: perm[k] for k in ("IpProtocol", "FromPort", "ToPort") if k in perm}
    keep["UserIdGroupPairs"] = [
        {"GroupId": g["GroupId"]} for g in perm.get("UserIdGroupPairs", []) if g.get("GroupId") == group_id
    ]
    return keep


def _public(f: Found) -> dict[str, Any]:
    d = asdict(f)
    d.pop("tags", None)
    return d


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def default_regions() -> list[str]:
    """``AWS_REGION``/``AWS_DEFAULT_REGION`` plus every ``aws:region`` in stacks/*.yaml."""
    regions: list[str] = []
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if os.environ.get(var):
            regions.append(os.environ[var])
    try:
        import yaml

        for path in sorted((REPO_ROOT / "stacks").glob("Pulumi.*.yaml")):
            cfg = (yaml.safe_load(path.read_text()) or {}).get("config", {}) or {}
            if cfg.get("aws:region"):
                regions.append(str(cfg["aws:region"]))
    except Exception:  # noqa: BLE001 - the flag still works without stack files
        pass
    return list(dict.fromkeys(regions)) or ["us-east-1"]


def make_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog="sweep.py",
        description="Find what kimi-deploy created (tag kimi-deploy:stack) whose expires-at tag has passed, grouped by "
        "stack, and with --destroy remove it. Never deletes the weight mirror, S3 buckets, or anything tagged "
        "kimi-deploy:retain=true. Reports capacity reservations/blocks that are still paid for. "
        "Exit 0: nothing expired remains; 1: something expired remains or could not be removed; 2: usage error.",
    )
    parser.add_argument(
        "--region",
        action="append",
        metavar="R",
        help="AWS region to sweep (repeatable; default: AWS_REGION plus every aws:region in stacks/)",
    )
    parser.add_argument(
        "--now",
        metavar="ISO",
        help="the clock, ISO 8601 (default: now); resources whose expires-at is at or before it are expired",
    )
    parser.add_argument(
        "--destroy",
        action="store_true",
        help="delete expired resources (default: a dry run that only reports): `pulumi destroy` per expired stack when the "
             "pulumi CLI is on PATH, then the AWS APIs in dependency order",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the report as JSON (for machines and CI logs) instead of a table"
    )
    parser.add_argument(
        "--no-pulumi",
        action="store_true",
        help="with --destroy: skip `pulumi destroy` even when the CLI is present (AWS APIs only)",
    )
    parser.add_argument(
        "--wait-seconds",
        type=float,
        default=900,
        metavar="S",
        help="how long to wait for asynchronous deletions (node groups, file systems, load-balancer interfaces) before reporting "
             "failure (default 900)",
    )
    return parser


def render_table(report: Mapping[str, Any]) -> None:
    """Print the report for people (rich)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160)
    s = report["summary"]
    console.print(
        f"[bold]kimi-deploy sweep[/bold] ({report['mode']}) now {report['now']} regions {', '.join(report['regions'])}",
        highlight=False,
    )
    table = Table()
    for col in ("stack", "kind", "id", "expires-at", "status", "reason"):
        table.add_column(col, overflow="fold")
    styles = {"deleted": "green", "would-delete": "yellow", "failed": "red", "kept": "cyan", "active": "dim"}
    for stack, info in report["stacks"].items():
        for r in info["resources"]:
            st = styles.get(r["status"], "")
            table.add_row(
                stack,
                r["kind"],
                r["id"],
                r["expires_at"] or "-",
                f"[{st}]{r['status']}[/{st}]" if st else r["status"],
                r["reason"],
            )
    console.print(table)
    for d in report["pulumi_destroy"]:
        console.print(f"pulumi destroy {d['stack']}: {d['status']} {d['reason']}", highlight=False, markup=False)
    for r in report["still_paid"]:
        console.print(f"[red]still paid:[/red] {r['id']} ({r['stack']}, {r['region']}): {r['reason']}", highlight=False)
    for e in report["errors"]:
        console.print(f"[red]error:[/red] {e}", highlight=False)
    console.print(
        f"expired {s['expired']}, would delete {s['would_delete']}, deleted {s['deleted']}, failed {s['failed']}, kept "
        f"{s['kept']}, still paid {s['still_paid']}",
        highlight=False,
    )


def main(
    argv: list[str] | None = None, *, clients: ClientFactory | None = None, destroyer: AutomationDestroyer | None = None
) -> int:
    try:
        args = make_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) if exc.code in (0, None) else 2
    try:
        now = parse_time(args.now) if args.now else datetime.now(UTC).replace(microsecond=0)
    except ValueError:
        print(f"error: --now {args.now!r} is not an ISO 8601 time (e.g. 2026-12-01T00:00:00Z)", file=sys.stderr)
        return 2
    if not 0 <= args.wait_seconds <= 86_400:  # also rejects nan
        print(f"error: --wait-seconds: {args.wait_seconds:g} must be between 0 and 86400 seconds", file=sys.stderr)
        return 2
    regions = args.region or default_regions()
    for region in regions:
        if not REGION_RE.match(region):
            where = "--region" if args.region else "region (from AWS_REGION, AWS_DEFAULT_REGION or a stack's aws:region)"
            print(f"error: {where}: {region!r} is not an AWS region name (e.g. us-east-1)", file=sys.stderr)
            return 2
    if destroyer is None and args.destroy and not args.no_pulumi:
        destroyer = AutomationDestroyer()
    if args.no_pulumi:
        destroyer = None
    log = (lambda msg: print(msg, file=sys.stderr)) if not args.json else (lambda msg: None)
    sweeper = Sweeper(
        clients or default_client_factory,
        regions,
        now,
        destroy=args.destroy,
        destroyer=destroyer,
        wait_seconds=args.wait_seconds,
        log=log,
    )
    try:
        report = sweeper.run()
        for note in SESSION_NOTES:
            print(f"note: {note}", file=sys.stderr)
    except Exception as err:  # noqa: BLE001
        if _is_credentials_error(err):
            print(f"error: no usable AWS credentials ({_one_line(err)}); configure them or set AWS_ENDPOINT_URL", file=sys.stderr)
            return 2
        raise
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        render_table(report)
    return report["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
