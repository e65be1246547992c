#!/usr/bin/env python3
"""Offline plan diff: what a change does to a stack, with no cloud account and no secret.

``scripts/plan.py --stack S --diff-against GIT_REF`` calls ``main_diff``: the stack is rendered
at GIT_REF (in a temporary ``git worktree``, by that commit's own ``scripts/plan.py`` in an
isolated interpreter, so only the old program renders the old plan) and in the working tree, both
with the same clock, and the two plan documents are compared. When the base cannot be rendered
(no scripts/plan.py there, or old code that fails on the stack) the whole new plan is shown as
added under a banner ``base could not be rendered at REF: <reason>`` (JSON ``base_error``):

- resources keyed by (type, name): added, removed, changed with each changed input as a dotted
  path (``rootBlockDevice.volumeSize``, ``spec.template.spec.containers[0].image``) and its old
  and new value;
- a change that forces the provider to replace the resource (delete and create: data on it is
  lost, a GPU node is gone for the load time) is marked from ``REPLACE_ON_CHANGE``; a change
  that updates in place but disrupts (stop/start of an instance wipes its NVMe; node groups
  recycle their nodes) is marked from ``DISRUPTIVE_ON_CHANGE``;
- the serving side: vLLM image, each role's flags and environment, sizing, cost, expiry,
  outputs and warnings.

``render_markdown`` makes a pull-request comment (summary line, a table per change kind,
collapsible details, ⚠ on replacements). Inputs in plan documents are already masked
(``[secret]``); values that look like credentials are redacted again here as a second fence.

Run directly: ``python scripts/plan_diff.py --stack b300 --against origin/main``.
Exit codes: 0 ok (with or without changes, also when the base could not be rendered); 1 the new
plan has a secret leak; 2 usage, git or config error (or the working tree's plan fails).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: its folder is on sys.path, the project may not be installed here
    import _cli  # noqa: F401  first: a missing package (or the project itself) prints `make setup`, not a traceback

from components.spec.credentials import redact_credentials  # standard library only
from scripts._cli import CliParser  # standard library only

REPO_ROOT = Path(__file__).resolve().parents[1]

NOW_ENV = "KIMI_DEPLOY_NOW"  # components.program.NOW_ENV (not imported: this module needs no Pulumi)
FORMATS = ("markdown", "json", "table")
# GitHub rejects issue comments over 65,536 characters; leave room for the other stacks' headers.
MARKDOWN_LIMIT_CHARS = 60_000
# Document keys that are not part of what gets deployed (never diffed).
IGNORED_DOC_KEYS = frozenset({"generated_at", "resources", "vllm", "warnings", "secret_leaks", "stack"})


class PlanDiffError(Exception):
    """Git or the plan at a ref failed: one line for the user (exit 2)."""


# ---------------------------------------------------------------------------------------------
# Which input changes replace a resource
# ---------------------------------------------------------------------------------------------

Predicate = Callable[[Any, Any, Mapping[str, Any], Mapping[str, Any]], bool]


@dataclass(frozen=True)
class FieldRule:
    """One input path (fnmatch pattern over dotted paths, list indices written ``[*]``).

    Attributes:
        pattern: e.g. ``ami``, ``vpcConfig.subnetIds``, ``spec.*``.
        note: why, shown next to the change.
        when: optional ``(old, new, old_inputs, new_inputs) -> bool``; the rule applies only
            when it returns True (e.g. FSx capacity replaces only when it shrinks).
    """

    pattern: str
    note: str = ""
    when: Predicate | None = None

    def matches(self, path: str, old: Any, new: Any, old_inputs: Mapping[str, Any], new_inputs: Mapping[str, Any]) -> bool:
        norm = re.sub(r"\[\d+\]", "[*]", path)
        hit = (
            fnmatch.fnmatchcase(norm, self.pattern) or norm.startswith(self.pattern + ".") or norm.startswith(self.pattern + "[")
        )
        return hit and (self.when is None or bool(self.when(old, new, old_inputs, new_inputs)))


def _user_data_replaces(old, new, old_inputs, new_inputs) -> bool:
    return bool(new_inputs.get("userDataReplaceOnChange") or old_inputs.get("userDataReplaceOnChange"))


def _shrinks(old, new, old_inputs, new_inputs) -> bool:
    try:
        return new is not None and old is not None and float(new) < float(old)
    except (TypeError, ValueError):
        return False


_K8S_NAME = (
    FieldRule("metadata.name", "Kubernetes objects are identified by name"),
    FieldRule("metadata.namespace", "namespace is part of the identity"),
)

# Replace-on-change inputs per type token. Sources: the Terraform AWS provider schemas that
# pulumi-aws 7 bridges (ForceNew attributes), the AWS API references (what Update* accepts),
# and Kubernetes immutability rules (pulumi-kubernetes replaces on a change to an immutable field).
REPLACE_ON_CHANGE: Mapping[str, tuple[FieldRule, ...]] = {
    "aws:ec2/instance:Instance": (
        FieldRule("ami", "a new AMI means a new instance"),
        FieldRule("availabilityZone"),
        FieldRule("subnetId"),
        FieldRule("placementGroup"),
        FieldRule("keyName"),
        FieldRule("privateIp"),
        FieldRule("networkInterfaces"),
        FieldRule("ebsBlockDevices"),
        FieldRule("ephemeralBlockDevices"),
        FieldRule("hostId"),
        FieldRule("tenancy"),
        FieldRule("userData", "userDataReplaceOnChange is set", _user_data_replaces),
        FieldRule("userDataBase64", "userDataReplaceOnChange is set", _user_data_replaces),
        FieldRule("rootBlockDevice.encrypted"),
        FieldRule("rootBlockDevice.kmsKeyId"),
        FieldRule("launchTemplate.id", "launched from another launch template"),
        FieldRule("launchTemplate.name", "launched from another launch template"),
        # terraform-provider-aws forces a new aws_instance when its launch template version changes.
        FieldRule("launchTemplate.version", "a new launch-template version: the instance is recreated"),
    ),
    "aws:ec2/launchTemplate:LaunchTemplate": (FieldRule("name"), FieldRule("namePrefix")),
    "aws:ec2/securityGroup:SecurityGroup": (
        FieldRule("name"),
        FieldRule("namePrefix"),
        FieldRule("vpcId"),
        FieldRule("description"),
    ),
    "aws:ec2/securityGroupRule:SecurityGroupRule": (FieldRule("*", "security group rules cannot be modified in place"),),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": (FieldRule("securityGroupId"),),
    "aws:ec2/subnet:Subnet": (
        FieldRule("cidrBlock"),
        FieldRule("vpcId"),
        FieldRule("availabilityZone"),
        FieldRule("availabilityZoneId"),
    ),
    "aws:ec2/vpc:Vpc": (FieldRule("cidrBlock"), FieldRule("instanceTenancy")),
    "aws:ebs/volume:Volume": (
        FieldRule("availabilityZone"),
        FieldRule("encrypted"),
        FieldRule("kmsKeyId"),
        FieldRule("snapshotId"),
        FieldRule("outpostArn"),
    ),
    "aws:fsx/lustreFileSystem:LustreFileSystem": (
        FieldRule("deploymentType", "the file system is recreated: its imported weights are lost"),
        FieldRule("storageType"),
        FieldRule("subnetIds"),
        FieldRule("securityGroupIds"),
        FieldRule("kmsKeyId"),
        FieldRule("efaEnabled"),
        FieldRule("driveCacheType"),
        FieldRule("importPath"),
        FieldRule("exportPath"),
        FieldRule("importedFileChunkSize"),
        FieldRule("fileSystemTypeVersion"),
        FieldRule("backupId"),
        FieldRule("copyTagsToBackups"),
        FieldRule("storageCapacity", "FSx capacity can only grow in place", _shrinks),
    ),
    "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation": (
        FieldRule("fileSystemId"),
        FieldRule("fileSystemPath"),
        FieldRule("dataRepositoryPath"),
        FieldRule("batchImportMetaDataOnCreate"),
    ),
    "aws:eks/cluster:Cluster": (
        FieldRule("name"),
        FieldRule("roleArn"),
        FieldRule("vpcConfig.subnetIds", "cluster subnets are fixed at creation"),
        FieldRule("vpcConfig.securityGroupIds"),
        FieldRule("kubernetesNetworkConfig"),
        FieldRule("encryptionConfig"),
        FieldRule("bootstrapSelfManagedAddons"),
        FieldRule("outpostConfig"),
    ),
    "aws:eks/nodeGroup:NodeGroup": (
        FieldRule("clusterName"),
        FieldRule("nodeGroupName"),
        FieldRule("nodeGroupNamePrefix"),
        FieldRule("nodeRoleArn"),
        FieldRule("subnetIds"),
        FieldRule("amiType"),
        FieldRule("capacityType"),
        FieldRule("diskSize"),
        FieldRule("instanceTypes"),
        FieldRule("remoteAccess"),
        FieldRule("launchTemplate.id", "another launch template (a new version updates in place)"),
        FieldRule("launchTemplate.name", "another launch template (a new version updates in place)"),
    ),
    "aws:eks/addon:Addon": (FieldRule("clusterName"), FieldRule("addonName")),
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": (
        FieldRule("clusterName"),
        FieldRule("namespace"),
        FieldRule("serviceAccount"),
    ),
    "aws:s3/bucket:Bucket": (
        FieldRule("bucket", "a new bucket: the mirrored weights stay in the old one"),
        FieldRule("bucketPrefix"),
        FieldRule("objectLockEnabled"),
    ),
    "aws:s3/bucketV2:BucketV2": (FieldRule("bucket"), FieldRule("bucketPrefix"), FieldRule("objectLockEnabled")),
    "aws:lb/loadBalancer:LoadBalancer": (
        FieldRule("name"),
        FieldRule("namePrefix"),
        FieldRule("internal"),
        FieldRule("loadBalancerType"),
    ),
    "aws:lb/targetGroup:TargetGroup": (
        FieldRule("name"),
        FieldRule("port"),
        FieldRule("protocol"),
        FieldRule("vpcId"),
        FieldRule("targetType"),
    ),
    "aws:iam/role:Role": (FieldRule("name"), FieldRule("namePrefix"), FieldRule("path")),
    "aws:iam/instanceProfile:InstanceProfile": (FieldRule("name"), FieldRule("path")),
    "aws:ssm/parameter:Parameter": (FieldRule("name"),),
    "aws:ec2/capacityReservation:CapacityReservation": (
        FieldRule("instanceType"),
        FieldRule("availabilityZone"),
        FieldRule("instancePlatform"),
        FieldRule("tenancy"),
    ),
    "kubernetes:batch/v1:Job": (*_K8S_NAME, FieldRule("spec", "a Job's pod template is immutable: the Job is recreated")),
    "kubernetes:apps/v1:StatefulSet": (
        *_K8S_NAME,
        FieldRule("spec.selector"),
        FieldRule("spec.serviceName"),
        FieldRule("spec.volumeClaimTemplates"),
        FieldRule("spec.podManagementPolicy"),
    ),
    "kubernetes:apps/v1:Deployment": (*_K8S_NAME, FieldRule("spec.selector")),
    "kubernetes:apps/v1:DaemonSet": (*_K8S_NAME, FieldRule("spec.selector")),
    "kubernetes:core/v1:Service": (*_K8S_NAME, FieldRule("spec.clusterIP"), FieldRule("spec.clusterIPs")),
    "kubernetes:core/v1:PersistentVolumeClaim": (
        *_K8S_NAME,
        FieldRule("spec.accessModes"),
        FieldRule("spec.storageClassName"),
        FieldRule("spec.volumeName"),
        FieldRule("spec.selector"),
        FieldRule("spec.volumeMode"),
        FieldRule("spec.dataSource"),
    ),
    "kubernetes:core/v1:PersistentVolume": (
        *_K8S_NAME,
        FieldRule("spec.csi"),
        FieldRule("spec.hostPath"),
        FieldRule("spec.local"),
    ),
}

# In-place changes that still interrupt serving (shown with ⚠, not counted as replacements).
DISRUPTIVE_ON_CHANGE: Mapping[str, tuple[FieldRule, ...]] = {
    "aws:ec2/instance:Instance": (
        FieldRule("instanceType", "stop/start: instance-store NVMe is wiped, weights are synced and loaded again"),
        FieldRule("userData", "applied by a stop/start; NVMe is wiped"),
        FieldRule("userDataBase64", "applied by a stop/start; NVMe is wiped"),
        FieldRule("capacityReservationSpecification", "stop/start to move the instance"),
    ),
    "aws:ec2/launchTemplate:LaunchTemplate": tuple(
        FieldRule(
            f, "a new template version: instances and node groups launched from it are recreated or recycled on the next up"
        )
        for f in (
            "userData",
            "imageId",
            "instanceType",
            "blockDeviceMappings",
            "metadataOptions",
            "networkInterfaces",
            "instanceMarketOptions",
            "capacityReservationSpecification",
            "placement",
            "tagSpecifications",
        )
    ),
    "aws:eks/nodeGroup:NodeGroup": (
        FieldRule("launchTemplate.version", "every node is recycled: pods drain, weights load again"),
        FieldRule("releaseVersion", "every node is recycled"),
        FieldRule("version", "every node is recycled"),
    ),
    "aws:fsx/lustreFileSystem:LustreFileSystem": (
        FieldRule("perUnitStorageThroughput", "in place; the file system optimizes for hours"),
        FieldRule("storageCapacity", "in place; the file system optimizes for hours"),
    ),
    "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet": (
        FieldRule("spec", "the group's pods are recreated: weights load again"),
    ),
    "kubernetes:apps/v1:Deployment": (FieldRule("spec.template", "rolling restart"),),
    "kubernetes:apps/v1:StatefulSet": (FieldRule("spec.template", "pods are recreated"),),
}


LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
# Launch-template inputs that do NOT make a new template version (terraform-provider-aws
# aws_launch_template: tags are set with CreateTags; the default-version settings and the
# name are the template's, not a version's). Every other input is part of the version.
LAUNCH_TEMPLATE_UNVERSIONED: tuple[str, ...] = ("tags", "tagsAll", "defaultVersion", "updateDefaultVersion", "name", "namePrefix")
# What follows a template's latest version, and what a new version does to it: an
# ``aws_instance`` is replaced (the provider forces a new instance when the launch template's
# version changes); a managed node group rolls (recycles) every node.
TEMPLATE_FOLLOWERS: Mapping[str, tuple[str, str]] = {
    "aws:ec2/instance:Instance": ("replace", "a new launch-template version: the instance is recreated (NVMe copy lost)"),
    "aws:eks/nodeGroup:NodeGroup": ("disrupt", "a new launch-template version: every node is recycled, weights load again"),
}


def _template_versioned_change(fields: list[dict[str, Any]]) -> bool:
    """Whether a launch template's changed ``fields`` make a new template version."""
    return any(f["path"].split(".")[0].split("[")[0] not in LAUNCH_TEMPLATE_UNVERSIONED for f in fields)


def _propagate_template_versions(changed: list[dict[str, Any]], n_idx: Mapping[tuple[str, str], Mapping[str, Any]]) -> None:
    """Mark what launches from a launch template whose change makes a new version: the offline
    plan shows the template's ``latestVersion`` as unchanged (the mock cannot know the next
    number), so the follower's own inputs do not change. Adds a synthetic field
    ``launchTemplate.version`` (old ``latest``, new ``latest+1``) to the follower, marked replace
    (instances) or disruptive (node groups). Mutates ``changed`` in place."""
    # In plan documents a resource's id is ``<name>-id`` (components/plan_engine.py mocks), which
    # is what a follower's ``launchTemplate.id`` holds.
    new_versions = {
        f"{c['name']}-id" for c in changed if c["type"] == LAUNCH_TEMPLATE and _template_versioned_change(c["fields"])
    }
    if not new_versions:
        return
    by_key = {(c["type"], c["name"]): c for c in changed}
    for (rtype, name), res in n_idx.items():
        follow = TEMPLATE_FOLLOWERS.get(rtype)
        lt = (res.get("inputs") or {}).get("launchTemplate") or {}
        if follow is None or lt.get("id") not in new_versions:
            continue
        action, note = follow
        entry = by_key.get((rtype, name))
        if entry is None:
            entry = {"type": rtype, "name": name, "action": "update", "disruptive": False, "fields": []}
            changed.append(entry)
            by_key[(rtype, name)] = entry
        entry["fields"].append(
            {
                "path": "launchTemplate.version",
                "old": "latest",
                "new": "latest+1",
                "replaces": action == "replace",
                "disrupts": action != "replace",
                "note": note,
            }
        )
        if action == "replace":
            entry["action"] = "replace"
        entry["disruptive"] = True


def _first_rule(
    rules: Iterable[FieldRule], path: str, old: Any, new: Any, oi: Mapping[str, Any], ni: Mapping[str, Any]
) -> FieldRule | None:
    for rule in rules:
        if rule.matches(path, old, new, oi, ni):
            return rule
    return None


# ---------------------------------------------------------------------------------------------
# Diffing plan documents
# ---------------------------------------------------------------------------------------------

_MISSING = "<absent>"


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted-path leaves of ``value``. Lists of scalars are one leaf (subnet ids, instance
    types); lists of objects are indexed (``containers[0].image``); empty containers are leaves."""
    out: dict[str, Any] = {}
    if isinstance(value, Mapping):
        if not value and prefix:
            out[prefix] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, list) and value and any(isinstance(v, (Mapping, list)) for v in value):
        for i, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{i}]"))
    else:
        out[prefix] = value
    return out


def diff_values(old: Any, new: Any, prefix: str = "") -> list[dict[str, Any]]:
    """``[{path, old, new}]`` for every leaf that differs (absent leaves as ``<absent>``)."""
    a, b = flatten(old, prefix), flatten(new, prefix)
    changes = []
    for path in sorted(set(a) | set(b), key=_path_key):
        va, vb = a.get(path, _MISSING), b.get(path, _MISSING)
        if va != vb:
            changes.append({"path": path, "old": va, "new": vb})
    return changes


def _path_key(path: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"[.\[\]]+", path) if p]


def _resource_index(doc: Mapping[str, Any]) -> dict[tuple[str, str], Mapping[str, Any]]:
    return {(r["type"], r["name"]): r for r in doc.get("resources", [])}


def _argv_flags(argv: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``(positionals before the first flag, {flag: [values]})``; a flag may repeat."""
    head: list[str] = []
    flags: dict[str, list[str]] = {}
    current: str | None = None
    for token in argv:
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            current = name
            flags.setdefault(current, [])
            if eq:
                flags[current].append(value)
        elif current is None:
            head.append(token)
        else:
            flags[current].append(token)
    return head, flags


def _diff_argv(old: list[str], new: list[str]) -> list[dict[str, Any]]:
    """Flag-level changes of a command line: ``[{flag, old, new}]`` (None = absent, "" = bare flag)."""
    oh, of = _argv_flags(old)
    nh, nf = _argv_flags(new)
    out: list[dict[str, Any]] = []
    if oh != nh:
        out.append({"flag": "(command)", "old": " ".join(oh), "new": " ".join(nh)})
    for flag in list(dict.fromkeys([*of, *nf])):
        a = " ".join(of[flag]) if flag in of else None
        b = " ".join(nf[flag]) if flag in nf else None
        if a != b:
            out.append({"flag": flag, "old": a, "new": b})
    return out


def _diff_vllm(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {"fields": [], "roles": []}
    scalar_old = {k: v for k, v in (old or {}).items() if k != "roles"}
    scalar_new = {k: v for k, v in (new or {}).items() if k != "roles"}
    result["fields"] = diff_values(scalar_old, scalar_new)
    o_roles = {r["name"]: r for r in (old or {}).get("roles", [])}
    n_roles = {r["name"]: r for r in (new or {}).get("roles", [])}
    for name in list(dict.fromkeys([*o_roles, *n_roles])):
        a, b = o_roles.get(name), n_roles.get(name)
        if a is None or b is None:
            result["roles"].append(
                {"name": name, "status": "added" if a is None else "removed", "argv": [], "env": [], "nodes": None}
            )
            continue
        argv = _diff_argv(a.get("argv", []), b.get("argv", []))
        env = diff_values(
            {"env": a.get("env", {}), "secret_env": a.get("secret_env", {})},
            {"env": b.get("env", {}), "secret_env": b.get("secret_env", {})},
        )
        nodes = (a.get("nodes"), b.get("nodes")) if a.get("nodes") != b.get("nodes") else None
        if argv or env or nodes:
            result["roles"].append({"name": name, "status": "changed", "argv": argv, "env": env, "nodes": nodes})
    return result


def diff_documents(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Compare two plan documents (``scripts/plan.py build_plan_document``; ``{}`` = nothing).

    Returns a JSON-serializable dict::

        {"summary": {"added", "removed", "changed", "replaced", "disruptive"},
         "added": [{type, name, inputs}], "removed": [{type, name, inputs}],
         "changed": [{type, name, action: "replace"|"update", disruptive: bool,
                      fields: [{path, old, new, replaces, disrupts, note}]}],
         "vllm": {fields: [{path, old, new}], roles: [{name, status, nodes, argv: [{flag, old, new}], env}]},
         "plan": [{path, old, new}]      # target, sizing, model, nodes, expiry, outputs ...
         "warnings": {"added": [...], "removed": [...]},
         "secret_leaks": [...]}          # of the new document (must be empty)

    Absent values are ``"<absent>"``.
    """
    old, new = old or {}, new or {}
    o_idx, n_idx = _resource_index(old), _resource_index(new)
    added = [dict(n_idx[k]) for k in n_idx if k not in o_idx]
    removed = [dict(o_idx[k]) for k in o_idx if k not in n_idx]
    changed = []
    for key in n_idx:
        if key not in o_idx:
            continue
        oi, ni = o_idx[key].get("inputs", {}) or {}, n_idx[key].get("inputs", {}) or {}
        fields = diff_values(oi, ni)
        if not fields:
            continue
        rtype = key[0]
        for f in fields:
            rep = _first_rule(REPLACE_ON_CHANGE.get(rtype, ()), f["path"], f["old"], f["new"], oi, ni)
            dis = None if rep else _first_rule(DISRUPTIVE_ON_CHANGE.get(rtype, ()), f["path"], f["old"], f["new"], oi, ni)
            f["replaces"] = rep is not None
            f["disrupts"] = dis is not None
            rule = rep or dis
            f["note"] = rule.note if rule else ""
        replace = any(f["replaces"] for f in fields)
        changed.append(
            {
                "type": rtype,
                "name": key[1],
                "action": "replace" if replace else "update",
                "disruptive": replace or any(f["disrupts"] for f in fields),
                "fields": fields,
            }
        )
    _propagate_template_versions(changed, n_idx)
    plan_old = {k: v for k, v in old.items() if k not in IGNORED_DOC_KEYS}
    plan_new = {k: v for k, v in new.items() if k not in IGNORED_DOC_KEYS}
    ow, nw = list(old.get("warnings", [])), list(new.get("warnings", []))
    return {
        "summary": {
            "added": len(added),
            "removed": len(removed),
            "changed": len(changed),
            "replaced": sum(1 for c in changed if c["action"] == "replace"),
            "disruptive": sum(1 for c in changed if c["disruptive"] and c["action"] != "replace"),
        },
        "added": added,
        "removed": removed,
        "changed": changed,
        "vllm": _diff_vllm(old.get("vllm", {}), new.get("vllm", {})),
        "plan": diff_values(plan_old, plan_new),
        "warnings": {"added": [w for w in nw if w not in ow], "removed": [w for w in ow if w not in nw]},
        "secret_leaks": list(new.get("secret_leaks", [])),
    }


def has_changes(diff: Mapping[str, Any]) -> bool:
    """Whether anything at all differs."""
    s = diff["summary"]
    return bool(
        s["added"] or s["removed"] or s["changed"] or diff["plan"] or diff["vllm"]["fields"] or diff["vllm"]["roles"]
        or diff["warnings"]["added"] or diff["warnings"]["removed"]
    )


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------

# Second fence: values shaped like credentials never reach a comment even if one slipped past
# the plan's masking (the shapes of components/spec/credentials.py), and values after a
# credential-like name (`password: ...`).
_NAMED_SECRET_RE = re.compile(r"(?i)((?:token|password|passwd|secret|api[_-]?key)\s*[=:]\s*)(?!\[secret\])[^\s\"',;]{6,}")


def redact(text: str) -> str:
    """``text`` with anything shaped like a credential replaced by ``[redacted]``."""
    text = redact_credentials(text)
    return _NAMED_SECRET_RE.sub(lambda m: m.group(1) + "[redacted]", text)


def redact_tree(value: Any) -> Any:
    """``value`` (JSON data) with ``redact`` applied to every string in it, keys included.

    Redact the data, never its serialized text: a pattern matching across JSON's escapes (a
    ``token = ...`` inside an embedded script) would cut an escaped quote and break the document.
    """
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k): redact_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_tree(v) for v in value]
    return value


# Before/after cells: values up to this many characters are shown whole; longer ones are cut to
# a window of this size around the first difference, so the change itself is always visible.
VALUE_CHARS = 100
_CONTEXT_CHARS = 24  # characters shown before the first difference


def _plain(value: Any) -> str | None:
    """One-line redacted text of a value (newlines as ``\\n``); None for an absent value."""
    if value is None or value == _MISSING:
        return None
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return redact(text).replace("\r", "").replace("\n", "\\n")


def value_pair(old: Any, new: Any, limit: int = VALUE_CHARS) -> tuple[str | None, str | None]:
    """``old`` and ``new`` as plain one-line texts for a before/after table (None = absent).

    Short values stay whole. A longer one is cut to ``limit`` characters starting a little
    before the first character where the two differ, with ``…`` where text was left out, so
    ``vllm/vllm-openai:v0.33.0`` -> ``v0.34.0`` stays visible inside a long command line.
    """
    a, b = _plain(old), _plain(new)
    start = 0
    if a is not None and b is not None and max(len(a), len(b)) > limit:
        common = 0
        while common < min(len(a), len(b)) and a[common] == b[common]:
            common += 1
        start = max(0, common - _CONTEXT_CHARS)
    return _window(a, start, limit), _window(b, start, limit)


def _window(text: str | None, start: int, limit: int) -> str | None:
    """At most ``limit`` characters of ``text`` from about ``start``, ``…`` marking cuts."""
    if text is None or len(text) <= limit:
        return text
    start = max(0, min(start, len(text) - (limit - 1)))  # never start later than a full tail needs
    if start == 0:
        return text[: limit - 1] + "…"
    if start + limit - 1 >= len(text):
        return "…" + text[start:]
    return "…" + text[start : start + limit - 2] + "…"


def fmt_pair(old: Any, new: Any, limit: int = VALUE_CHARS) -> tuple[str, str]:
    """Markdown cells for a before/after pair (``value_pair`` in inline code; ``*absent*``)."""
    cells = []
    for text in value_pair(old, new, limit):
        if text is None:
            cells.append("*absent*")
        else:
            cells.append(f"`{_cell(text)}`" if text else '`""`')
    return cells[0], cells[1]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'").replace("\n", " ")


def _maybe_base64(value: Any) -> Any:
    """Base64 text (launch-template user data) decoded for reading; anything else unchanged."""
    import base64
    import binascii

    if not isinstance(value, str) or len(value) < 16 or "\n" in value or not re.fullmatch(r"[A-Za-z0-9+/=]+", value):
        return value
    try:
        text = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return value
    return text if "\n" in text else value


def _long_text_diffs(diff: Mapping[str, Any]) -> list[str]:
    """Unified diffs of multi-line inputs (user data, scripts), for the details block."""
    import difflib

    out: list[str] = []
    for c in diff["changed"]:
        for f in c["fields"]:
            a, b = _maybe_base64(f["old"]), _maybe_base64(f["new"])
            if isinstance(a, str) and isinstance(b, str) and ("\n" in a or "\n" in b):
                lines = list(
                    difflib.unified_diff(
                        redact(a).splitlines(),
                        redact(b).splitlines(),
                        f"{c['name']}.{f['path']} (base)",
                        f"{c['name']}.{f['path']} (this change)",
                        lineterm="",
                        n=2,
                    )
                )
                out += [
                    f"`{c['name']}` `{f['path']}`:",
                    "```diff",
                    *lines[:200],
                    *(["… (truncated)"] if len(lines) > 200 else []),
                    "```",
                ]
    return out


def render_markdown(diff: Mapping[str, Any], stack: str, ref: str | None = None) -> str:
    """A pull-request comment section for one stack's diff (GitHub-flavoured Markdown).

    Starts with a summary line with counts, lists ⚠ replacements first, then one table per
    change kind, collapsible details of every changed field and of added/removed inputs, the
    vLLM command and sizing changes. No secret: inputs are masked in the plan and ``redact``
    runs over every value.
    """
    s = diff["summary"]
    against = f" vs `{_cell(ref)}`" if ref else ""
    lines: list[str] = []
    banner = []
    if diff.get("base_error"):
        banner = [f"> ⚠ **{_cell(redact(diff['base_error']))}** — everything below is the whole new plan, shown as added", ""]
    if not has_changes(diff):
        lines.append(f"#### `{stack}`{against}: no changes")
        lines += [""] + banner if banner else []
        return "\n".join(lines).rstrip("\n") + "\n"
    counts = f"{s['added']} to add, {s['removed']} to remove, {s['changed']} to change"
    if s["replaced"]:
        counts += f" (**⚠ {s['replaced']} replaced**)"
    if s["disruptive"]:
        counts += f", {s['disruptive']} disruptive in place"
    lines.append(f"#### `{stack}`{against}: {counts}")
    lines.append("")
    lines += banner
    if diff["secret_leaks"]:
        for leak in diff["secret_leaks"]:
            lines.append(
                f"> ❌ secret `kimi-deploy:{leak.get('secret')}` appears in the plain input "
                f"`{leak.get('resource')}.{leak.get('path')}`"
            )
        lines.append("")
    for c in diff["changed"]:
        if c["action"] == "replace":
            why = ", ".join(f"`{f['path']}`" for f in c["fields"] if f["replaces"])
            notes = "; ".join(dict.fromkeys(f["note"] for f in c["fields"] if f["replaces"] and f["note"]))
            lines.append(f"> ⚠ **replace** `{c['name']}` ({c['type']}): {why}" + (f" — {notes}" if notes else ""))
    for c in diff["changed"]:
        if c["action"] != "replace" and c["disruptive"]:
            why = ", ".join(f"`{f['path']}`" for f in c["fields"] if f["disrupts"])
            notes = "; ".join(dict.fromkeys(f["note"] for f in c["fields"] if f["disrupts"] and f["note"]))
            lines.append(f"> ⚠ disruptive update `{c['name']}` ({c['type']}): {why}" + (f" — {notes}" if notes else ""))
    if any(c["disruptive"] for c in diff["changed"]):
        lines.append("")

    if diff["changed"]:
        lines += ["| | resource | type | changed inputs |", "|---|---|---|---|"]
        for c in diff["changed"]:
            mark = "⚠ replace" if c["action"] == "replace" else ("⚠ update" if c["disruptive"] else "~ update")
            paths = ", ".join(("**" + f"`{f['path']}`" + "**") if f["replaces"] else f"`{f['path']}`" for f in c["fields"][:8])
            more = f" +{len(c['fields']) - 8} more" if len(c["fields"]) > 8 else ""
            lines.append(f"| {mark} | `{c['name']}` | `{c['type']}` | {paths}{more} |")
        lines.append("")
    for kind, sign in (("added", "+ add"), ("removed", "- remove")):
        if diff[kind]:
            lines += ["| | resource | type |", "|---|---|---|"]
            for r in diff[kind]:
                lines.append(f"| {sign} | `{r['name']}` | `{r['type']}` |")
            lines.append("")

    vl = diff["vllm"]
    if vl["fields"] or vl["roles"]:
        lines += ["**vLLM**", "", "| role | setting | before | after |", "|---|---|---|---|"]
        for f in vl["fields"]:
            lines.append(f"| all | `{f['path']}` | {' | '.join(fmt_pair(f['old'], f['new']))} |")
        for role in vl["roles"]:
            if role["status"] != "changed":
                lines.append(f"| `{role['name']}` | role {role['status']} | | |")
                continue
            if role["nodes"]:
                lines.append(f"| `{role['name']}` | nodes | `{role['nodes'][0]}` | `{role['nodes'][1]}` |")
            for a in role["argv"]:
                old, new = fmt_pair(
                    None if a["old"] is None else (a["old"] or "(flag)"), None if a["new"] is None else (a["new"] or "(flag)")
                )
                lines.append(f"| `{role['name']}` | `{a['flag']}` | {old} | {new} |")
            for e in role["env"]:
                lines.append(f"| `{role['name']}` | `{e['path']}` | {' | '.join(fmt_pair(e['old'], e['new']))} |")
        lines.append("")
    if diff["plan"]:
        lines += [
            "<details><summary>Plan settings (" + str(len(diff["plan"])) + " changed: sizing, cost, expiry, outputs)</summary>",
            "",
            "| setting | before | after |",
            "|---|---|---|",
        ]
        for f in diff["plan"]:
            lines.append(f"| `{f['path']}` | {' | '.join(fmt_pair(f['old'], f['new']))} |")
        lines += ["", "</details>", ""]
    for w in diff["warnings"]["added"]:
        lines.append(f"> new warning: {_cell(redact(w))}")
    for w in diff["warnings"]["removed"]:
        lines.append(f"> resolved warning: {_cell(redact(w))}")
    if diff["warnings"]["added"] or diff["warnings"]["removed"]:
        lines.append("")

    if diff["changed"]:
        n = sum(len(c["fields"]) for c in diff["changed"])
        lines += [
            f"<details><summary>Changed inputs ({n})</summary>",
            "",
            "| resource | input | before | after | |",
            "|---|---|---|---|---|",
        ]
        for c in diff["changed"]:
            for f in c["fields"]:
                mark = "⚠ replaces" if f["replaces"] else ("⚠ disrupts" if f["disrupts"] else "")
                lines.append(f"| `{c['name']}` | `{f['path']}` | {' | '.join(fmt_pair(f['old'], f['new']))} | {mark} |")
        long_diffs = _long_text_diffs(diff)
        if long_diffs:
            lines += ["", *long_diffs]
        lines += ["", "</details>", ""]
    for kind, title in (("added", "Inputs of added resources"), ("removed", "Inputs of removed resources")):
        if diff[kind]:
            lines += [f"<details><summary>{title} ({len(diff[kind])})</summary>", ""]
            for r in diff[kind]:
                body = json.dumps(redact_tree(r.get("inputs", {})), indent=1, sort_keys=True)
                if len(body) > 4000:
                    body = body[:4000] + "\n… (truncated)"
                lines += [f"`{r['name']}` `{r['type']}`", "```json", body, "```"]
            lines += ["</details>", ""]
    text = "\n".join(lines)
    if len(text) > MARKDOWN_LIMIT_CHARS:
        text = (
            text[: MARKDOWN_LIMIT_CHARS - 200]
            + "\n\n… (truncated: run `python scripts/plan.py --stack "
            + stack
            + " --diff-against <ref> --format json` for the whole diff)\n"
        )
        text += "\n</details>\n" if text.count("<details>") > text.count("</details>") else ""
    return text + "\n"


# ---------------------------------------------------------------------------------------------
# Rendering a stack at a git ref
# ---------------------------------------------------------------------------------------------

class RenderError(PlanDiffError):
    """A tree's own scripts/plan.py is missing or could not render the stack (one line)."""


# Runs a tree's own scripts/plan.py as `python scripts/plan.py ...` would, but isolated: started
# with -I (no PYTHONPATH or other PYTHON* variables, no user site, no cwd or script directory
# added by Python itself), so only that tree and the interpreter's site-packages (the current
# venv: same dependencies) are importable. argv: the tree, then plan.py's arguments.
_ISOLATED_PLAN = r"""
import os, runpy, sys
tree = os.path.abspath(sys.argv[1])
script = os.path.join(tree, "scripts", "plan.py")
sys.path[:0] = [os.path.join(tree, "scripts"), tree]
sys.argv = [script, *sys.argv[2:]]
runpy.run_path(script, run_name="__main__")
"""


def _git(repo_root: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo_root), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise PlanDiffError(
            f"git {' '.join(args)}: "
            f"{(proc.stderr or proc.stdout).strip().splitlines()[-1] if (proc.stderr or proc.stdout).strip() else 'failed'}"
        )
    return proc.stdout


def _resolve_ref(repo_root: Path, ref: str) -> str:
    """The commit ``ref`` names in the git repository at ``repo_root``.

    Raises:
        PlanDiffError: one sentence with the fix: git is not installed, ``repo_root`` is not a
            git clone (a downloaded archive), or ``ref`` names no commit here.
    """
    if shutil.which("git") is None:
        raise PlanDiffError("a plan diff needs git on PATH (install git, e.g. `apt-get install git`)")
    inside = subprocess.run(["git", "-C", str(repo_root), "rev-parse", "--git-dir"], capture_output=True, text=True)
    if inside.returncode != 0:
        raise PlanDiffError(f"a plan diff needs a git clone: {repo_root} is not a git repository "
                            "(clone the repository with git instead of downloading an archive)")
    proc = subprocess.run(["git", "-C", str(repo_root), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                          capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise PlanDiffError(f"git ref {ref!r}: no such commit, branch or tag in {repo_root} (list them with "
                            f"`git branch -a` and `git tag`; a remote branch may need `git fetch origin` first)")
    return proc.stdout.strip()


def _now_iso(now: datetime | None) -> str:
    moment = now or datetime.now(UTC).replace(microsecond=0)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render_tree(stack: str, tree: Path, now: datetime | None = None, python: str | None = None) -> dict[str, Any]:
    """The plan document of ``stack`` as the code and stack files in directory ``tree`` render it.

    Runs ``tree/scripts/plan.py --format json`` in an isolated subprocess (``_ISOLATED_PLAN``:
    cwd ``tree``, ``python -I``, no PYTHONPATH), so that tree's own program is imported and
    nothing of this checkout, with ``--now`` and ``KIMI_DEPLOY_NOW`` fixed. A tree without the
    stack file renders as ``{}`` (the stack is new or deleted).

    Raises:
        RenderError: the tree has no scripts/plan.py, or its plan failed (its last error line).
    """
    if not (tree / "stacks" / f"Pulumi.{stack}.yaml").is_file():
        return {}
    if not (tree / "scripts" / "plan.py").is_file():
        raise RenderError("it has no scripts/plan.py")
    iso = _now_iso(now)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env[NOW_ENV] = iso
    python = python or sys.executable
    cmd = [python, "-I", "-B", "-c", _ISOLATED_PLAN, str(tree), "--stack", stack, "--format", "json", "--now", iso]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    # plan.py exits 1 when the plan holds a secret leak but still prints the document.
    if proc.returncode not in (0, 1) or not proc.stdout.strip():
        last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}, no output"])[-1]
        raise RenderError(f"plan of {stack} failed: {redact(last)}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as err:
        raise RenderError(f"plan of {stack} printed no JSON document ({err})") from None


def render_at_ref(stack: str, ref: str, repo_root: Path = REPO_ROOT, now: datetime | None = None) -> dict[str, Any]:
    """The plan document of ``stack`` at git ``ref`` (``{}`` when the stack file does not exist there).

    Checks ``ref`` out with ``git worktree add --detach`` into a temporary directory, renders
    there (``render_tree``) and removes the worktree again, also on errors.

    Raises:
        PlanDiffError: ``ref`` is unknown or git fails.
        RenderError: the tree at ``ref`` has no scripts/plan.py or its plan fails.
    """
    repo_root = Path(repo_root)
    commit = _resolve_ref(repo_root, ref)
    tmp = Path(tempfile.mkdtemp(prefix="kimi-plan-diff-"))
    tree = tmp / "tree"
    try:
        _git(repo_root, "worktree", "add", "--detach", "--quiet", str(tree), commit)
        try:
            return render_tree(stack, tree, now=now)
        finally:
            subprocess.run(["git", "-C", str(repo_root), "worktree", "remove", "--force", str(tree)], capture_output=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "-C", str(repo_root), "worktree", "prune"], capture_output=True)


def diff_against(stack: str, ref: str, repo_root: Path = REPO_ROOT, now: datetime | None = None) -> dict[str, Any]:
    """``diff_documents(plan at ref, plan of the working tree)`` with ``stack``, ``ref``,
    ``stack_status`` and ``base_error`` added.

    When the base cannot be rendered (no scripts/plan.py at ``ref``, or old code that fails on
    this stack) the diff is against nothing: the whole new plan shows as added, ``base_error``
    says why (``"base could not be rendered at REF: <reason>"``) and ``stack_status`` is
    ``"base-unrendered"``. Otherwise ``base_error`` is None.

    Raises:
        PlanDiffError: git fails, ``ref`` is unknown, or the working tree's own plan fails.
    """
    now = now or datetime.now(UTC).replace(microsecond=0)
    base_error = None
    try:
        old = render_at_ref(stack, ref, repo_root, now)
    except RenderError as err:
        old, base_error = {}, f"base could not be rendered at {ref}: {err}"
    try:
        new = render_tree(stack, Path(repo_root), now)
    except RenderError as err:
        raise PlanDiffError(f"working tree: {err}") from None
    if not old and not new and base_error is None:
        raise PlanDiffError(f"stack {stack!r} exists neither at {ref} nor in the working tree")
    diff = diff_documents(old, new)
    diff["stack"], diff["ref"] = stack, ref
    diff["base_error"] = base_error
    diff["stack_status"] = "base-unrendered" if base_error else ("added" if not old else ("removed" if not new else "present"))
    return diff


def render_table(diff: Mapping[str, Any]) -> None:
    """Print the diff for people (rich)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 150)
    s = diff["summary"]
    console.print(
        f"[bold]{diff.get('stack')}[/bold] vs {diff.get('ref')}: {s['added']} to add, {s['removed']} to remove, {s['changed']} "
        f"to change, {s['replaced']} replaced",
        highlight=False,
    )
    if diff.get("base_error"):
        from rich.markup import escape

        console.print(
            f"[yellow]⚠ {escape(redact(diff['base_error']))}: the whole new plan is shown as added[/yellow]", highlight=False
        )
    table = Table(show_lines=False)
    for col in ("", "resource", "type", "input", "before", "after"):
        table.add_column(col, overflow="fold")
    for r in diff["added"]:
        table.add_row("[green]+[/green]", r["name"], r["type"], "", "", "")
    for r in diff["removed"]:
        table.add_row("[red]-[/red]", r["name"], r["type"], "", "", "")
    for c in diff["changed"]:
        for f in c["fields"]:
            mark = "[red]⚠ replace[/red]" if f["replaces"] else ("[yellow]⚠[/yellow]" if f["disrupts"] else "~")
            table.add_row(
                mark,
                c["name"],
                c["type"],
                f["path"],
                *(t if t is not None else "(absent)" for t in value_pair(f["old"], f["new"])),
            )
    for role in diff["vllm"]["roles"]:
        for a in role["argv"]:
            table.add_row("~", f"vllm {role['name']}", "argv", a["flag"], str(a["old"]), str(a["new"]))
    for f in diff["vllm"]["fields"] + diff["plan"]:
        table.add_row("~", "plan", "", f["path"], *(t if t is not None else "(absent)" for t in value_pair(f["old"], f["new"])))
    console.print(table)


def main_diff(
    stack: str,
    ref: str,
    *,
    fmt: str = "markdown",
    now: datetime | None = None,
    output: str | None = None,
    repo_root: Path = REPO_ROOT,
) -> int:
    """What ``scripts/plan.py --diff-against REF`` runs. Returns the exit code (0, 1 leak, 2 error)."""
    try:
        diff = diff_against(stack, ref, repo_root, now)
    except PlanDiffError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if fmt == "table":
        render_table(diff)
        text = None
    elif fmt == "json":
        text = json.dumps(redact_tree(diff), indent=2) + "\n"
    else:
        text = render_markdown(diff, stack, ref)
    if text is not None:
        if output:
            Path(output).write_text(text)
        else:
            sys.stdout.write(text)
    return 1 if diff["secret_leaks"] else 0


def make_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog="plan_diff.py",
        description="Offline plan diff of kimi-deploy stacks between a git ref and the working tree "
        "(no cloud account, no Pulumi CLI, no secret). Same as `scripts/plan.py --diff-against`.",
    )
    parser.add_argument(
        "--stack", action="append", help="stack name (repeatable; default: every stack in stacks/ at either side)"
    )
    parser.add_argument(
        "--against", required=True, metavar="GIT_REF", help="the base to compare with, e.g. origin/main or a commit"
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="markdown",
        help="markdown for pull-request comments (default), json for machines, table for people",
    )
    parser.add_argument(
        "--now", help="clock for both renders, ISO 8601 (default: now); fixes trial expiries so they do not show as changes"
    )
    parser.add_argument("--output", metavar="FILE", help="write to FILE instead of standard output")
    parser.add_argument("--header", default="", help="markdown only: a first line for the comment (e.g. a title)")
    return parser


def _all_stacks(repo_root: Path, ref: str) -> list[str]:
    names = {p.name[len("Pulumi."):-len(".yaml")] for p in (repo_root / "stacks").glob("Pulumi.*.yaml")}
    listing = _git(repo_root, "ls-tree", "--name-only", f"{ref}^{{commit}}", "stacks/")
    for line in listing.splitlines():
        name = line.rsplit("/", 1)[-1]
        if name.startswith("Pulumi.") and name.endswith(".yaml"):
            names.add(name[len("Pulumi."):-len(".yaml")])
    return sorted(names)


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        now = None
        if args.now:
            try:
                now = datetime.fromisoformat(args.now.replace("Z", "+00:00"))
            except ValueError:
                print(f"error: --now {args.now!r} is not an ISO 8601 time (e.g. 2026-12-01T00:00:00Z)", file=sys.stderr)
                return 2
        now = now or datetime.now(UTC).replace(microsecond=0)
        stacks = args.stack or _all_stacks(REPO_ROOT, args.against)
        diffs = [diff_against(s, args.against, REPO_ROOT, now) for s in stacks]
    except PlanDiffError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.format == "table":
        for d in diffs:
            render_table(d)
        text = None
    elif args.format == "json":
        text = json.dumps(redact_tree(diffs if len(diffs) != 1 else diffs[0]), indent=2) + "\n"
    else:
        parts = [args.header + "\n"] if args.header else []
        parts += [render_markdown(d, d["stack"], args.against) for d in diffs]
        text = "\n".join(parts)
    if text is not None:
        if args.output:
            Path(args.output).write_text(text)
        else:
            sys.stdout.write(text)
    return 1 if any(d["secret_leaks"] for d in diffs) else 0


if __name__ == "__main__":
    sys.exit(main())
