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
anything tagged ``kimi-deploy:retain`` with any value but false/no/0/off (``=true``, ``=yes``), the weight
mirror (``kimi-deploy:role=weights-mirror``)
and S3 buckets in general (reported, never deleted). Capacity reservations and capacity blocks
are reported while they are still paid for: destroying a stack does not cancel them.

With ``--destroy``: first ``pulumi destroy`` of each expired stack through the Automation API
when the ``pulumi`` CLI is on PATH (skipped, and said so, when any resource tagged to be retained
in that stack's state lacks ``retainOnDelete``), then delete what is left, in dependency order.
An ``aws-eks`` stack's destroy deletes its Kubernetes objects through its cluster's API, which
must answer from where the sweeper runs (docs/aws.md, "How pulumi reaches the cluster"): the
endpoint is tried first (TCP 443, ``api_endpoint_probe``); when it does not answer, the destroy
runs with ``PULUMI_K8S_DELETE_UNREACHABLE=true`` (pulumi-kubernetes drops those objects from the
state instead of failing; they go with the cluster, which this destroy deletes), and the report
says so; the load balancers Kubernetes made are then removed by the AWS pass below.
The kinds live in a registry (``scripts/ops/sweeping/kinds.py``: each declares discover, delete,
gone and the kinds it is deleted after); ``DELETE_ORDER`` is the registry's topological sort:
instances and their volumes, node groups before their cluster, load balancers after the
cluster (while it runs, its service controller would create a deleted one again), file
systems after their clients, and network interfaces and security groups last.

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
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: its folder is on sys.path, the project may not be installed here
    import _cli  # noqa: F401  first: a missing package (or the project itself) prints `make setup`, not a traceback

from components.core.config import format_utc as _utc
from components.core.config import parse_clock
from components.core.naming import (  # one place for tag keys
    ROLE_WEIGHTS_MIRROR,
    TAG_ENVIRONMENT,
    TAG_OWNER,
    TAG_PROJECT,
    TAG_RETAIN,
    TAG_ROLE,
    TAG_STACK,
)
from components.core.naming import TAG_EXPIRES_AT as TAG_EXPIRES
from scripts.ops._cli import CliParser, aws_session, print_note, prog_name, terminal_width
from scripts.ops.sweeping.found import (
    Found,
    classify,
    error_code,
    is_connection_error,
    is_credentials_error,
    is_unparsable_response,
    one_line,
    parse_time,
    public,
    retained_by,
)
from scripts.ops.sweeping.kinds import (
    CLUSTER_TAG_PREFIX,
    CNI_CLUSTER_TAG,
    LBC_CLUSTER_TAG,
    REGISTRY,
    DiscoveryContext,
    cluster_leftovers,
    discover_cluster_leftovers,
)
from scripts.ops.sweeping.registry import Kind

__all__ = [
    "CLUSTER_TAG_PREFIX",
    "CNI_CLUSTER_TAG",
    "DELETE_ORDER",
    "LBC_CLUSTER_TAG",
    "REGISTRY",
    "REPORT_ONLY_KINDS",
    "ROLE_WEIGHTS_MIRROR",
    "TAG_ENVIRONMENT",
    "TAG_EXPIRES",
    "TAG_OWNER",
    "TAG_PROJECT",
    "TAG_RETAIN",
    "TAG_ROLE",
    "TAG_STACK",
    "AutomationDestroyer",
    "DestroyOutcome",
    "EndpointUnreachable",
    "Found",
    "Sweeper",
    "classify",
    "cluster_leftovers",
    "default_client_factory",
    "discover",
    "main",
    "parse_time",
    "unsafe_retained_in_state",
]

REPO_ROOT = Path(__file__).resolve().parents[2]

# AWS region names: us-east-1, us-gov-west-1, ap-southeast-2, eu-central-1 ...
REGION_RE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d{1,2}$")
# Botocore client settings: an endpoint that does not answer fails in seconds, not minutes
# (a connect timeout of 5 s and 3 attempts; the first refused or timed-out connection of a
# region stops that region's discovery, see ``EndpointUnreachable``).
CLIENT_CONFIG = {"connect_timeout": 5, "read_timeout": 30, "retries": {"max_attempts": 3, "mode": "standard"}}

# Kinds in the order they are deleted (consumers before what they consume), built from the
# registry's dependencies; and the kinds that are only reported, never deleted.
DELETE_ORDER: tuple[str, ...] = REGISTRY.delete_order()
REPORT_ONLY_KINDS: tuple[str, ...] = REGISTRY.report_only()
# The gone check's AWS error codes: the resource no longer exists (deleted) ...
GONE_CODES = frozenset({
    "ResourceNotFoundException",
    "LoadBalancerNotFound",
    "FileSystemNotFound",
    "InvalidNetworkInterfaceID.NotFound",
    "InvalidGroup.NotFound",
    "InvalidVolume.NotFound",
    "InvalidInstanceID.NotFound",
})
# ... or something it depends on is still going away (checked again until the deadline).
WAIT_CODES = frozenset(
    {"DependencyViolation", "InvalidNetworkInterface.InUse", "VolumeInUse", "IncorrectState", "InvalidParameterValue"}
)


class UsageError(Exception):
    """A user's mistake (exit 2, one line, no traceback)."""


# ---------------------------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------------------------

ClientFactory = Callable[[str, str], Any]


_SESSIONS: list[Any] = []  # one boto3 session per process (scripts.ops._cli.aws_session)
SESSION_NOTES: list[str] = []


def default_client_factory(service: str, region: str) -> Any:
    """A boto3 client from ``scripts.ops._cli.aws_session``, the same session preflight uses:
    ``AWS_ENDPOINT_URL`` and boto3's per-service variants are read by botocore itself, and a
    local endpoint without credentials gets dummy ones (noted in ``SESSION_NOTES``)."""
    from botocore.config import Config

    if not _SESSIONS:
        _SESSIONS.append(aws_session(SESSION_NOTES))
    return _SESSIONS[0].client(service, region_name=region, config=Config(**CLIENT_CONFIG))


class EndpointUnreachable(Exception):
    """The AWS endpoint of a region cannot be reached (refused, DNS, timeout); ``str(err)`` is
    one line with the region and the reason."""


@dataclass
class Discovery:
    """What ``discover`` found in one region.

    Attributes:
        found: everything of ours that could be listed.
        errors: one line per deletable kind that could not be listed (the run fails: something
            expired could be hidden there).
        unknown: report-only kinds that could not be listed, ``{"region", "kind", "reason"}``
            (reported, the run does not fail: the sweeper deletes nothing of those kinds).
    """

    found: list[Found]
    errors: list[str]
    unknown: list[dict[str, str]]


def discover(clients: ClientFactory, region: str, now: datetime) -> Discovery:
    """Everything of ours in ``region``, and the kinds that could not be listed.

    Runs each registered kind's ``discover`` in registration order, then ``cluster_leftovers``
    (what Kubernetes created for our clusters). A kind that cannot be listed does not stop the
    others: a deletable kind adds one line to ``errors``, a report-only kind (capacity
    reservations, S3 buckets) one entry to ``unknown``.

    Raises:
        EndpointUnreachable: the first call that cannot connect (the other kinds would only
            wait for the same timeout again).
        Exception: a credentials error (``main`` turns it into exit 2).
    """
    ctx = DiscoveryContext(client=lambda service: clients(service, region), region=region, now=now)
    result = Discovery(ctx.found, [], [])

    def attempt(what: str, fn: Callable[[DiscoveryContext], list[Found]], kind: Kind | None = None) -> None:
        try:
            ctx.found.extend(fn(ctx))
        except Exception as err:  # noqa: BLE001 - one unlistable kind must not hide the others
            if is_credentials_error(err):
                raise
            if is_connection_error(err):
                raise EndpointUnreachable(
                    f"{region}: cannot reach the AWS endpoint while listing {what}: {one_line(err)}"
                ) from None
            reason = one_line(err)
            if is_unparsable_response(err):
                calls = " / ".join(kind.calls) if kind and kind.calls else "the call"
                reason = f"the endpoint's answer to {calls} is not an AWS API response (invalid XML: does it implement the call?)"
            if kind is not None and kind.report_only:
                result.unknown.append({"region": region, "kind": kind.name, "reason": f"{what} could not be listed: {reason}"})
            else:
                result.errors.append(f"{region}: could not list {what}: {reason}")

    for kind in REGISTRY:
        attempt(kind.label, kind.discover, kind)
    attempt("what Kubernetes created for our clusters", discover_cluster_leftovers)
    return result


# ---------------------------------------------------------------------------------------------
# Pulumi destroy (Automation API)
# ---------------------------------------------------------------------------------------------


# pulumi-kubernetes reads it at destroy: an unreachable cluster's objects leave the state instead of
# failing the destroy (pulumi/pulumi-kubernetes#2037, #2489).
DELETE_UNREACHABLE_ENV = "PULUMI_K8S_DELETE_UNREACHABLE"
# A working path answers at once; this only bounds a black-holed one.
API_PROBE_TIMEOUT_SECONDS = 5.0

ApiProbe = Callable[[str], tuple[bool, str]]


def api_endpoint_probe(endpoint: str) -> tuple[bool, str]:
    """Whether an EKS API endpoint (``https://<host>``) answers a TCP connection on 443 from here
    within ``API_PROBE_TIMEOUT_SECONDS``: ``(ok, one line)``. With a local AWS stand-in
    (``AWS_ENDPOINT_URL`` on this machine) its clusters have no API server: not tried."""
    import socket
    from urllib.parse import urlsplit

    from scripts.ops._cli import local_aws_endpoint

    if local_aws_endpoint():
        return False, "the AWS endpoint is a local stand-in (AWS_ENDPOINT_URL): its clusters have no API server"
    parts = urlsplit(endpoint)
    if not parts.hostname:
        return False, f"no API endpoint ({endpoint!r})"
    port = parts.port or 443
    try:
        with socket.create_connection((parts.hostname, port), timeout=API_PROBE_TIMEOUT_SECONDS):
            return True, f"{parts.hostname}:{port} answers"
    except TimeoutError:
        return False, f"{parts.hostname}:{port} did not answer within {API_PROBE_TIMEOUT_SECONDS:g} s"
    except OSError as err:
        return False, f"{parts.hostname}:{port}: {err.strerror or one_line(err)}"


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
        if retained_by(tags) is not None:
            if not res.get("retainOnDelete") and not res.get("protect"):
                unsafe.append(res.get("urn", "?"))
    return unsafe


class AutomationDestroyer:
    """``pulumi destroy`` of a stack through ``pulumi.automation`` (needs the CLI on PATH)."""

    def __init__(self, work_dir: Path = REPO_ROOT):
        self.work_dir = work_dir

    def available(self) -> bool:
        return shutil.which("pulumi") is not None

    def destroy(self, stack: str, *, delete_unreachable: bool = False, why: str = "") -> DestroyOutcome:
        """``pulumi destroy`` of ``stack``; ``delete_unreachable``: its cluster's API does not answer
        from here (``why``), so pulumi-kubernetes is told to drop its objects from the state
        (``DELETE_UNREACHABLE_ENV``) instead of failing on the first one."""
        from pulumi import automation as auto

        env = {DELETE_UNREACHABLE_ENV: "true"} if delete_unreachable else {}
        note = (f"its Kubernetes API did not answer from here ({why}): destroyed with {DELETE_UNREACHABLE_ENV}=true, so "
                "its Kubernetes objects left the state and go with the cluster" if delete_unreachable else "")
        try:
            st = auto.select_stack(stack_name=stack, work_dir=str(self.work_dir), opts=auto.LocalWorkspaceOptions(env_vars=env))
            state = st.export_stack().deployment or {}
            unsafe = unsafe_retained_in_state(state)
            if unsafe:
                return DestroyOutcome(
                    stack,
                    "skipped",
                    f"state holds resources tagged to be retained without retainOnDelete: {', '.join(unsafe[:3])}",
                )
            st.destroy(exclude_protected=True, continue_on_error=True, on_output=lambda line: print(line, file=sys.stderr))
            return DestroyOutcome(stack, "destroyed", note)
        except Exception as err:  # noqa: BLE001 - the API cleanup below still runs
            return DestroyOutcome(stack, "failed", "; ".join(x for x in (one_line(err), note) if x))


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
        probe: ApiProbe = api_endpoint_probe,
    ):
        self.clients, self.regions, self.now = clients, regions, now
        self.destroy, self.destroyer = destroy, destroyer
        self.probe = probe
        self.wait_seconds, self.poll_seconds = wait_seconds, poll_seconds
        self.log = log or (lambda msg: None)

    def run(self) -> dict[str, Any]:
        """Sweep every region; returns the report (see ``report``)."""
        items: list[Found] = []
        errors: list[str] = []
        unknown: list[dict[str, str]] = []
        destroys: list[DestroyOutcome] = []
        for region in self.regions:
            try:
                seen = discover(self.clients, region, self.now)
            except EndpointUnreachable as err:
                errors.append(str(err))  # nothing of this region is known: the run fails (exit 1)
                continue
            found, region_unknown = seen.found, seen.unknown
            errors += seen.errors
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
                        destroys.append(self._pulumi_destroy(stack, found))
                    seen = discover(self.clients, region, self.now)  # what destroy left behind
                    found, region_unknown = seen.found, seen.unknown
            for f in found:
                self._mark(f)
            if self.destroy:
                self._delete_region(region, [f for f in found if f.status == "would-delete"])
            items += found
            unknown += region_unknown
        return self.report(items, errors, destroys, unknown)

    def _pulumi_destroy(self, stack: str, found: list[Found]) -> DestroyOutcome:
        """``pulumi destroy`` of ``stack`` the way its Kubernetes objects can be reached: through
        its EKS cluster's API when that answers from here (``probe``), else with the objects
        dropped from the state (``AutomationDestroyer.destroy(delete_unreachable=True)``). A stack
        without a cluster of its own (found by its stack tag) is destroyed plainly."""
        assert self.destroyer is not None  # run() calls this only with a destroyer
        endpoints = [f.detail.get("endpoint") for f in found if f.kind == "eks-cluster" and f.stack == stack]
        if not endpoints:
            return self.destroyer.destroy(stack)
        unreachable = [why for ok, why in (self.probe(str(e or "")) for e in endpoints) if not ok]
        if not unreachable:
            return self.destroyer.destroy(stack)
        self.log(f"{stack}: the Kubernetes API does not answer from here ({unreachable[0]})")
        return self.destroyer.destroy(stack, delete_unreachable=True, why=unreachable[0])

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
            f.status, f.reason = "kept", retained_by(f.tags) or "retained"
        elif f.kind in REPORT_ONLY_KINDS:
            f.status, f.reason = "kept", "S3 buckets are never deleted by the sweeper"
        else:
            f.status = "would-delete"
            f.reason = (f"expired: expires-at {f.expires_at} is at or before {self.now.isoformat()}"
                        if f.expires_at else "expired with its cluster (its expires-at)")

    # Each deleter starts the deletion; ``_gone`` tells when it is complete.
    # Each kind's ``delete`` starts the deletion; its ``gone`` tells when it is complete.
    def _delete_region(self, region: str, targets: list[Found]) -> None:
        by_kind: dict[str, list[Found]] = {k: [] for k in DELETE_ORDER}
        for f in targets:
            by_kind[f.kind].append(f)

        def client(service: str) -> Any:
            return self.clients(service, region)

        for name in DELETE_ORDER:
            batch = by_kind[name]
            if not batch:
                continue
            kind = REGISTRY[name]
            assert kind.delete is not None  # registration guarantees it for every deletable kind
            self.log(f"{region}: deleting {len(batch)} {name}")
            for f in batch:
                try:
                    kind.delete(client, f)
                except Exception as err:  # noqa: BLE001
                    if is_credentials_error(err):
                        raise
                    f.status, f.reason = "failed", one_line(err)
            self._wait(client, [f for f in batch if f.status == "would-delete"])

    def _wait(self, client: Callable[[str], Any], pending: list[Found]) -> None:
        deadline = time.monotonic() + self.wait_seconds
        while pending:
            still = []
            for f in pending:
                try:
                    done = self._gone(client, f)
                except Exception as err:  # noqa: BLE001
                    f.status, f.reason = "failed", one_line(err)
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

    @staticmethod
    def _gone(client: Callable[[str], Any], f: Found) -> bool:
        """Whether ``f`` is deleted (its kind's ``gone``): a not-found error means gone, an error
        of something still in the way (``WAIT_CODES``) means not yet."""
        from botocore.exceptions import ClientError

        gone = REGISTRY[f.kind].gone
        assert gone is not None  # registration guarantees it for every deletable kind
        try:
            return gone(client, f)
        except ClientError as err:
            code = error_code(err)
            if code in GONE_CODES:
                return True
            if code in WAIT_CODES:
                return False  # something it depends on is still going away: retry until the deadline
            raise

    # -- report ------------------------------------------------------------------------------

    def report(
        self, items: list[Found], errors: list[str], destroys: list[DestroyOutcome], unknown: list[dict[str, str]] | None = None
    ) -> dict[str, Any]:
        """The JSON report::

            {"now", "regions", "mode": "dry-run"|"destroy",
             "stacks": {stack: {"expired", "expires_at", "owner", "environment", "resources": [Found]}},
             "pulumi_destroy": [{stack, status, reason}], "still_paid": [Found], "errors": [str],
             "unknown": [{region, kind, reason}],
             "summary": {"expired", "would_delete", "deleted", "failed", "kept", "still_paid", "invalid_expiry",
                         "unknown"},
             "exit_code"}

        ``unknown``: report-only kinds that could not be listed (e.g. capacity reservations where
        the endpoint lacks ``DescribeCapacityReservations``); they do not change the exit code.
        """
        unknown = unknown or []
        stacks: dict[str, dict[str, Any]] = {}
        for f in items:
            if f.kind == "capacity-reservation":
                continue
            s = stacks.setdefault(
                f.stack, {"expired": False, "expires_at": None, "owner": f.owner, "environment": f.environment, "resources": []}
            )
            s["expired"] = s["expired"] or f.expired
            s["expires_at"] = s["expires_at"] or f.expires_at
            s["resources"].append(public(f))
        still_paid = [public(f) for f in items if f.status == "still-paid"]
        count = lambda status: sum(1 for f in items if f.status == status)  # noqa: E731
        summary = {
            "expired": sum(1 for f in items if f.expired and f.kind != "capacity-reservation"),
            "would_delete": count("would-delete"),
            "deleted": count("deleted"),
            "failed": count("failed"),
            "kept": count("kept"),
            "still_paid": len(still_paid),
            "invalid_expiry": sum(1 for f in items if f.reason.startswith("expires-at")),
            "unknown": len(unknown),
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
            "unknown": unknown,
            "summary": summary,
            "exit_code": 1 if remaining or errors else 0,
        }



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
        prog=prog_name("scripts/ops/sweep.py"),
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
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=terminal_width(sys.stdout, default=160))
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
        console.print(f"[red]error:[/red] {escape(e)}", highlight=False)
    for u in report["unknown"]:
        console.print(f"[cyan]unknown:[/cyan] {u['region']}: {escape(u['reason'])}", highlight=False)
    console.print(
        f"expired {s['expired']}, would delete {s['would_delete']}, deleted {s['deleted']}, failed {s['failed']}, kept "
        f"{s['kept']}, still paid {s['still_paid']}" + (f", unknown {s['unknown']}" if s["unknown"] else ""),
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
        now = parse_clock(args.now, "--now") if args.now is not None else datetime.now(UTC).replace(microsecond=0)
    except ValueError as err:  # ConfigError: not a time, or out of range
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not 0 <= args.wait_seconds <= 86_400:  # also rejects nan
        print(f"error: --wait-seconds: {args.wait_seconds:g} must be between 0 and 86400 seconds", file=sys.stderr)
        return 2
    if args.no_pulumi and not args.destroy:
        print("error: --no-pulumi is read only with --destroy (a dry run never runs `pulumi destroy`): add --destroy or "
              "leave --no-pulumi out", file=sys.stderr)
        return 2
    regions = list(dict.fromkeys(args.region)) if args.region else default_regions()  # a region given twice is swept once
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
            print_note(note)  # wrapped to the terminal's width, like the report
    except Exception as err:  # noqa: BLE001
        if is_credentials_error(err):
            print(f"error: no usable AWS credentials ({one_line(err)}); configure them or set AWS_ENDPOINT_URL", file=sys.stderr)
            return 2
        raise
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        render_table(report)
    return report["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
