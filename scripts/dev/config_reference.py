#!/usr/bin/env python3
"""Write the configuration reference (docs/configuration.md) from the typed config model.

Every key of ``RawConfig`` (``components/core/config/raw.py``) gets a row: its full key, its type
in words, its default as a user writes it in YAML (or what it is derived from), the values allowed
(``Literal`` choices, ``Field`` bounds, and the rules of the checks modules where they are short
enough to state), its description (the field's docstring) and what a change forces.

That last column is derived, not written: for each key a ``Probe`` changes it to another valid
value on the stacks where it applies (``stacks/``, with a ``base`` overlay where the key only
matters in some setting, e.g. the FSx keys under ``storage.kind: nvme-from-fsx``), renders the real
program under the mock engine (``scripts/ops/plan.py build_plan_document``, the overlay as
``KIMI_DEPLOY_CONFIG_OVERLAY``) and compares it with the unchanged render through the plan-diff
engine (``scripts/ops/diff``: which input changes replace or disrupt which resource types, from the
providers' schemas). One render per case is too slow for every test run, so the results live in
``docs/configuration-forces.json`` (``--derive`` writes it); ``--check`` compares the cheap parts
and that every key has a row, and ``tests/test_config_reference.py`` re-derives ``CHECKED_KEYS``.

Run: ``python scripts/dev/config_reference.py`` (write the page from the model and the stored
derivation), ``--derive [KEY ...]`` (derive again: every key, or the ones named; then write),
``--check`` (exit 1 with one line when the page or the stored derivation is stale).
Exit codes: 0 ok; 1 ``--check`` found something stale; 2 usage error or a probe that cannot run.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: the project may not be installed here; scripts/ops/_cli.py's hook
    # first (a missing package, or the project itself, prints `make setup`, not a traceback)
    import os
    import runpy

    runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ops", "_cli.py"), run_name="_cli")

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from components.core import naming
from components.core.config import CONFIG_OVERLAY_ENV, SECRETS, RawConfig, format_utc, stack_names
from components.core.config.raw import range_text
from components.core.errors import NAMESPACE, ConfigError
from components.core.load import load_stack
from scripts.ops._cli import EXIT_CHECK_FAILED, EXIT_OK, CliParser, UsageError, prog_name, run_cli

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC_PATH = REPO_ROOT / "docs" / "configuration.md"
FORCES_PATH = REPO_ROOT / "docs" / "configuration-forces.json"
COMMAND = "python scripts/dev/config_reference.py"
# The clock of every render (the docs' plan examples use the same): the derivation is reproducible.
NOW = datetime(2026, 12, 1, tzinfo=UTC)
# Keys the test derives again on every run (the ones users change most); the rest are checked to
# have a stored row. A key the model does not have (``phase`` before it exists) is left out.
CHECKED_KEYS: tuple[str, ...] = (
    "compute.instanceType",
    "compute.capacity.type",
    "storage.kind",
    "storage.fsx.throughputPerTib",
    "storage.fsx.capacityGib",
    "vllm.image",
    "network.vpcCidr",
    "phase",
)
# Keys of other namespaces the reference lists (the program reads them; config.reader checks names).
AWS_REGION = "aws:region"
# A 40-hex commit that is not a real one (test data): a pinned model revision, an engine build.
SAMPLE_COMMIT = "0123456789abcdef0123456789abcdef01234567"
ROLE_ARN = "arn:aws:iam::123456789012:role/platform-admins"


# --- the model, walked ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigKey:
    """One row of the reference.

    Attributes:
        key: the full key as written under ``kimi-deploy:`` (``storage.fsx.throughputPerTib``;
            items of a list of maps as ``autoscaling.schedule[].start``).
        section: the table it belongs to (``storage.fsx``; ``""`` for the top level).
        info: the pydantic field.
        model_name, field_name: where it is declared (``FsxConfig``, ``throughput_per_tib`` in
            components/core/config/raw.py).
    """

    key: str
    section: str
    info: FieldInfo
    model_name: str = ""
    field_name: str = ""

    @property
    def description(self) -> str:
        """The field's docstring as one line."""
        return " ".join((self.info.description or "").split())

    @property
    def derived(self) -> str | None:
        """What an unset value is computed from (``json_schema_extra["derived"]``), or None."""
        extra = self.info.json_schema_extra
        return str(extra["derived"]) if isinstance(extra, dict) and "derived" in extra else None


def _optional_inner(annotation: Any) -> Any:
    """``X`` of ``X | None`` (and of ``Annotated[X, ...]``), else the annotation itself."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _optional_inner(args[0]) if len(args) == 1 else annotation
    if origin is typing.Annotated:
        return _optional_inner(typing.get_args(annotation)[0])
    return annotation


def _model_of(annotation: Any) -> type[BaseModel] | None:
    inner = _optional_inner(annotation)
    return inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None


def _item_model_of(annotation: Any) -> type[BaseModel] | None:
    """The model of a ``tuple[Model, ...]`` field's items, else None."""
    inner = _optional_inner(annotation)
    if typing.get_origin(inner) is tuple:
        return _model_of(typing.get_args(inner)[0])
    return None


def config_keys(model: type[BaseModel] = RawConfig, prefix: str = "") -> list[ConfigKey]:
    """Every key of ``model`` (default: the whole ``kimi-deploy`` namespace) in model order,
    sections depth first. A nested model is a section, not a row; a list of maps is a row and its
    items a section (``autoscaling.schedule[]``). ``region`` is left out: it is ``aws:region``."""
    rows: list[ConfigKey] = []
    nested: list[tuple[str, type[BaseModel]]] = []
    section = prefix.removesuffix(".")
    for name, info in model.model_fields.items():
        if model is RawConfig and name == "region":
            continue
        key = prefix + (info.alias or name)
        sub = _model_of(info.annotation)
        if sub is not None:
            nested.append((key, sub))
            continue
        rows.append(ConfigKey(key, section, info, model.__name__, name))
        items = _item_model_of(info.annotation)
        if items is not None:
            nested.append((key + "[]", items))
    for key, sub in nested:
        rows.extend(config_keys(sub, key + "."))
    return rows


def section_descriptions(model: type[BaseModel] = RawConfig, prefix: str = "") -> dict[str, str]:
    """``{section: description}`` in model order, ``""`` for the top level: the nested model's
    field docstring (the list-of-maps item sections: the item model's class docstring)."""
    out: dict[str, str] = {prefix.removesuffix("."): ""} if not prefix else {}
    for name, info in model.model_fields.items():
        key = prefix + (info.alias or name)
        sub = _model_of(info.annotation)
        items = _item_model_of(info.annotation)
        if sub is not None:
            out[key] = " ".join((info.description or "").split())
            out.update(section_descriptions(sub, key + "."))
        elif items is not None:
            out[key + "[]"] = "One item of " + key + "."
            out.update(section_descriptions(items, key + "[]."))
    return out


def type_words(annotation: Any) -> str:
    """A field's type as a user reads it: ``integer``, ``number``, ``boolean``, ``string``,
    ``ISO 8601 time``, ``list of strings``, ``list of maps``, ``map of string to string``, ``one of``."""
    inner = _optional_inner(annotation)
    origin = typing.get_origin(inner)
    if origin is typing.Literal:
        return "one of"
    if origin is tuple:
        item = typing.get_args(inner)[0]
        return "list of strings" if item is str else "list of maps"
    if origin is dict:
        key_type, value_type = typing.get_args(inner)
        value = "string" if value_type is str else "any value"
        return f"map of {'string' if key_type is str else 'any'} to {value}"
    words = {bool: "boolean", int: "integer", float: "number", str: "string", datetime: "ISO 8601 time"}
    if inner in words:
        return words[inner]
    raise TypeError(f"no words for the type {annotation!r}: add it to type_words")


def yaml_value(value: Any) -> str:
    """``value`` as written in a stack file (flow style): ``true``, ``0.1``, ``[]``,
    ``{release: kube-prometheus-stack}``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, datetime):
        return format_utc(value)
    return str(value)


def default_text(row: ConfigKey) -> str:
    """The default column: ``required``, ``derived: <rule>``, ``none`` or the YAML value."""
    if row.info.is_required():
        return "required"
    if row.derived:
        return f"derived: {row.derived}"
    value = row.info.get_default(call_default_factory=True)
    return "none" if value is None else f"`{yaml_value(value)}`"


def _literal_choices(annotation: Any) -> tuple[Any, ...]:
    inner = _optional_inner(annotation)
    return typing.get_args(inner) if typing.get_origin(inner) is typing.Literal else ()


def allowed_text(row: ConfigKey, rules: Mapping[str, str], *, readers: bool = True) -> str:
    """What a key allows: ``Literal`` choices, ``Field`` bounds (the words of the range errors),
    the checks modules' rule for the key (``RULES``) and, with ``readers``, the platforms (and
    settings) that read it (``readers_text``)."""
    parts = []
    choices = _literal_choices(row.info.annotation)
    if choices:
        parts.append(", ".join(f"`{c}`" for c in choices))
    bounds = range_text(row.info)
    if bounds:
        parts.append(bounds)
    if row.key in rules:
        parts.append(rules[row.key])
    where = readers_text(row.key.replace("[]", "")) if readers else ""
    if where:
        parts.append(where)
    return "; ".join(parts)


def readers_text(key: str) -> str:
    """Where ``key`` is read, from the one table (config/platform_keys.py ``KEY_READERS``): the
    rule about any value and those about single values; ``""`` when every platform reads it."""
    from components.core.config.platform_keys import ANY_VALUE, KEY_READERS, readers_of

    out = []
    rule = readers_of(key)
    if rule is not None and (rule.reads or rule.when):
        where = f"read on {', '.join(rule.platforms())}" if rule.reads else "read"
        when = " and ".join(f"{other} {' or '.join(str(v).lower() for v in values)}" for other, values in rule.when)
        out.append(where + (f" with {when}" if when else ""))
    for value_rule in (r for r in KEY_READERS if r.key == key and r.value is not ANY_VALUE):
        values = value_rule.value if isinstance(value_rule.value, tuple) else (value_rule.value,)
        out.append(f"{' and '.join(f'`{v}`' for v in values)} on {', '.join(value_rule.platforms())} only")
    return "; ".join(out) + " (config/platform_keys.py)" if out else ""


# --- rules the checks modules enforce (choice lists from the constants the checks read) ------------


def rules() -> dict[str, str]:
    """``{key: rule}``: what the checks modules (``components/core/config/*.py``) allow beyond the
    model's types and bounds, where short enough to state; each names its module."""
    from components.core import fsx
    from components.core.config.lifecycle import ENVIRONMENTS, MAX_TRIAL_HOURS
    from components.core.config.network import MIN_CLIENT_PREFIX_LENGTH, MIN_PUBLIC_CLIENT_PREFIX_LENGTH
    from components.core.config.target import supported_targets
    from components.core.kv_layout import mxfp4_indexer_supported
    from components.core.model import MODELS
    from components.core.naming import TOOLS_PREFIX
    from components.core.targets import PLATFORMS, TARGETS, instance_types_of
    from components.core.versions import EKS_VERSIONS, KNOWN_ADDONS
    from components.core.vllm_options import INERT_DESTS, MAX_EXTRA_ARGS, OWNED_DESTS, REFUSED_VALUES

    model = MODELS[RawConfig.model_fields["model"].get_default().profile]
    supported = supported_targets(model)
    tiers = "; ".join(
        f"{kind}: {', '.join(map(str, fsx.THROUGHPUT_PER_TIB_MBPS[kind]))}" if kind != "SCRATCH_2" else f"{kind}: any"
        for kind in fsx.DEPLOYMENT_TYPES
    )
    block_only = ", ".join(name for name in supported if TARGETS[name].aws_capacity_types)
    client = (f"CIDR blocks no broader than /{MIN_CLIENT_PREFIX_LENGTH}, public ones no broader than "
              f"/{MIN_PUBLIC_CLIENT_PREFIX_LENGTH[4]} (IPv6 /{MIN_PUBLIC_CLIENT_PREFIX_LENGTH[6]}); no loopback, "
              "link-local or multicast block")
    first_sizes = ", ".join(map(str, fsx.FIRST_CAPACITIES_GIB))
    iops = ", ".join(map(str, fsx.METADATA_IOPS_SMALL))
    return {
        "target": f"a target that holds {model.display_name}: {', '.join(supported)} (config/target.py)",
        "platform": f"{', '.join(PLATFORMS)}; per target: "
        + "; ".join(f"{name}: {', '.join(TARGETS[name].platforms)}" for name in supported) + " (config/target.py)",
        "environment": f"{', '.join(ENVIRONMENTS)} (config/lifecycle.py)",
        "owner": "1-63 letters, digits, '-', '_' or '.', starting and ending alphanumeric (config/tags.py)",
        "phase": "stage needs storage.mirror.enabled, and on the kubernetes platform an existing bucket "
        "(storage.mirror.bucketName, create false) (config/phase.py)",
        "expiresAt": f"in the future; a trial: at most {MAX_TRIAL_HOURS} h away; not on prod (config/lifecycle.py)",
        "model.profile": f"{', '.join(MODELS)} (config/model.py)",
        "model.revision": "a lower-case 40-hex commit; a branch or tag only in a trial (config/model.py)",
        "model.licenseAcknowledged": "`true` (config/model.py)",
        "model.servedModelName": "1-128 letters, digits, '.', '_', ':', '/', '-', starting with a letter or digit; not "
        "empty (config/model.py)",
        "compute.instanceType": "the target's GPU model, GPU count and memory: "
        + "; ".join(f"{name}: {', '.join(instance_types_of(TARGETS[name]))}" for name in supported)
        + " (config/compute.py)",
        "compute.availabilityZone": "an AZ of aws:region that offers the instance type; with a reservation, its AZ "
        "(config/compute.py)",
        "compute.replicas": "1 on aws-ec2; with autoscaling within minReplicas..maxReplicas (config/compute.py, "
        "config/scaling.py)",
        "compute.efa": "an instance type with EFA interfaces and a vllm.image that is not the stock one (config/compute.py)",
        "compute.capacity.type": f"{block_only}: capacity-block only "
        "(config/compute.py)",
        "compute.capacity.reservationId": "cr- and 8 to 17 hex digits; required for odcr and capacity-block, refused "
        "for on-demand (config/compute.py)",
        "compute.capacity.availabilityZone": "in aws:region; required for odcr and capacity-block (config/compute.py)",
        "compute.capacity.endsAt": "capacity-block: its instances still running at the run's clock (config/compute.py)",
        "compute.capacity.blockInstances": "UltraServer capacity blocks only: whole UltraServers, at least the GPU "
        "nodes (config/compute.py)",
        "compute.amiId": "ami- and 8 to 17 hex digits (config/compute.py)",
        "compute.amiArchitecture": "the instance type's; required with amiId (config/compute.py)",
        "network.vpcCidr": "a private (RFC 1918) /16 to /22 block (config/network.py)",
        "network.allowedCidrs": f"{client} (config/network.py)",
        "network.apiServerAccess": "aws-eks: public-cidrs needs apiServerPublicCidrs; private needs vpcId and "
        "apiServerPrivateCidrs or apiServerPrivateSecurityGroupIds, and no apiServerPublicCidrs (config/network.py)",
        "network.apiServerPublicCidrs": "aws-eks: public IPv4 blocks (no private, shared or reserved range; a documentation "
        "range blocks `pulumi up`), no broader than /8, at most 40 (config/network.py)",
        "network.apiServerPrivateCidrs": "IPv4 blocks no broader than /8 (config/network.py)",
        "network.apiServerPrivateSecurityGroupIds": "security group ids, sg- and 8 or 17 hex digits (config/network.py)",
        "network.vpcId": "vpc- and 8 or 17 hex digits (config/network.py)",
        "network.privateSubnetIds": "subnet- and 8 or 17 hex digits, each once; required with vpcId, and only with it "
        "(config/network.py)",
        "network.allowedSecurityGroupIds": "sg- and 8 or 17 hex digits, each once (config/network.py)",
        "storage.kind": "fsx and nvme-from-fsx need an AWS platform that mounts them (aws-eks), pvc a Kubernetes one and "
        "existingClaim, nvme local NVMe that holds the weights (config/storage.py)",
        "storage.readGBps": "at most what storage.kind delivers to one node (config/storage.py read_gbps_ceiling)",
        "storage.existingClaim": "a PersistentVolumeClaim name; required with kind pvc (config/storage.py)",
        "storage.mirror.enabled": "true on aws-ec2 and with the FSx kinds (config/storage.py)",
        "storage.mirror.bucketName": "an S3 bucket name (3-63 lowercase letters, digits, dots, hyphens); required with "
        "create false (config/storage.py)",
        "storage.mirror.prefix": f"relative, without '.' or '..' segments, not under {TOOLS_PREFIX}/ (the toolkit's "
        "programs) (config/storage.py)",
        "storage.mirror.endpointUrl": "http(s)://host[:port][/path], no credentials, query or fragment (config/storage.py)",
        "storage.fsx.deploymentType": f"{', '.join(fsx.DEPLOYMENT_TYPES)} (config/storage.py)",
        "storage.fsx.throughputPerTib": f"per deployment type: {tiers} (config/storage.py)",
        "storage.fsx.capacityGib": f"{first_sizes}, then multiples of {fsx.CAPACITY_STEP_GIB}; holds the weights "
        "(config/storage.py)",
        "storage.fsx.efa": "PERSISTENT_2 only (config/storage.py)",
        "storage.fsx.metadataIops": f"{iops}, then multiples of {fsx.METADATA_IOPS_STEP}; PERSISTENT_2 only "
        "(config/storage.py)",
        "vllm.imageTag": "letters, digits, '_', '.', '-', at most 128; not with vllm.image (config/vllm.py)",
        "vllm.image": "name:tag or name@sha256:digest of the target's image family; a build known not to serve the "
        "model is refused (engine.py)",
        "vllm.decodeContextParallelSize": "divides the tensor-parallel size (config/vllm.py)",
        "vllm.maxModelLen": "at most the model's context (config/vllm.py)",
        "vllm.kvCacheDtype": "ROCm targets: auto or bfloat16; CUDA targets: a dtype a sparse MLA backend stores "
        "(not fp8_e5m2) (config/vllm.py, kv_layout.py)",
        "vllm.indexerCacheDtype": "mxfp4 on NVIDIA SM10x GPUs only ("
        + ", ".join(name for name in supported if mxfp4_indexer_supported(TARGETS[name].gpu))
        + ") (config/vllm.py, kv_layout.py)",
        "vllm.gpuMemoryUtilization": "leaves memory for the KV cache after the weights and the engine's buffers "
        "(sizing.py, engine_memory.py)",
        "vllm.extraArgs": "no spelling vLLM's parser reads as an option the toolkit sets (aliases, `_` for `-`, "
        f"`=value`, unique prefixes): {', '.join(OWNED_DESTS[dest].options[0] for dest in sorted(OWNED_DESTS))}; no "
        "indexer_kv_dtype (vllm.indexerCacheDtype); with indexerCacheDtype mxfp4 every --attention-config a JSON object; "
        "--max-num-seqs, --max-num-batched-tokens, --performance-mode and chunked prefill as vLLM's SchedulerConfig "
        "accepts them (the plan sizes with them); on CUDA a --block-size a sparse MLA backend takes; every item as "
        "vLLM 0.34.0's parser reads it (its recorded option table: known options, no positional, values, choices, "
        "the config classes' bounds); not " + ", ".join(
            f"--{d.replace('_', '-')}" + ("" if r.values is None or r.values == {"true"} else " " + "/".join(sorted(r.values)))
            + (f" other than {'/'.join(sorted(r.allowed))}" if r.allowed else "")
            + (f" field {'/'.join(sorted(r.json_keys))}" if r.json_keys else "")
            for d, r in sorted(REFUSED_VALUES.items()))
        + " (logs prompts or keys, changes what was sized, bypasses the API guard, imports code from outside the "
        "image, reads files or repos the node does not have, or connects out); no port option on "
        f"vllm.port; at most {MAX_EXTRA_ARGS} items; "
        + ", ".join(f"--{d.replace('_', '-')}" for d in sorted(INERT_DESTS))
        + " warned (no effect with the synced weights and the hub offline) (vllm_options.py, config/vllm.py, "
        "scheduler_limits.py, attention_backend.py)",
        "kubernetes.namespace": "a DNS label (config/kubernetes.py)",
        "kubernetes.installedAddons": f"each one of {', '.join(KNOWN_ADDONS)} (config/kubernetes.py)",
        "kubernetes.nodeSelector": "Kubernetes labels; hardware labels must name the target's hardware "
        "(config/kubernetes.py, k8s_schema.py)",
        "kubernetes.tolerations": "Kubernetes Toleration objects, each with a key (an empty key with Exists tolerates "
        "every taint) (k8s_schema.py, config/kubernetes.py)",
        "kubernetes.allowedNamespaces": "DNS labels (config/kubernetes.py)",
        "kubernetes.allowedCidrs": f"{client}; on the kubernetes platform with clusterCidrs (config/network.py)",
        "kubernetes.clusterCidrs": "CIDR blocks; required with kubernetes.allowedCidrs (config/network.py)",
        "kubernetes.nvmeHostPath": "absolute, without '..', outside the node's own state (kubelet, runtime, logs) "
        "(config/kubernetes.py)",
        "kubernetes.adminRoleArns": "IAM role or user ARNs, each once; aws-eks only (config/kubernetes.py)",
        "kubernetes.eksVersion": f"one of {', '.join(EKS_VERSIONS)} still supported at the run's clock and new enough "
        "for DRA; past standard support only with eksSupportType EXTENDED; aws-eks only (config/kubernetes.py)",
        "autoscaling.enabled": "aws-eks and kubernetes only; needs a Prometheus (observability.prometheusNamespace or "
        "prometheusUrl) (config/scaling.py)",
        "autoscaling.minReplicas": "0 needs autoscaling.schedule (config/scaling.py)",
        "autoscaling.maxReplicas": "at least minReplicas and compute.replicas (config/scaling.py)",
        "autoscaling.controller": "hpa needs prometheus-adapter in kubernetes.installedAddons (config/scaling.py)",
        "autoscaling.schedule": "controller keda only (config/scaling.py)",
        "autoscaling.schedule[].start": "5 cron fields (config/scaling.py)",
        "autoscaling.schedule[].end": "5 cron fields (config/scaling.py)",
        "autoscaling.schedule[].timezone": "an IANA time zone (config/scaling.py)",
        "autoscaling.scaleDownDelaySeconds": "more than the modelled scale-up time (scaling.py)",
        "observability.prometheusNamespace": "a DNS label; aws-eks and kubernetes only (config/scaling.py)",
        "observability.grafanaNamespace": "a DNS label; aws-eks and kubernetes only (config/scaling.py)",
        "observability.prometheusUrl": "an http(s) URL without credentials (config/scaling.py)",
        "observability.prometheusPodLabels": "Kubernetes labels (config/scaling.py)",
        "observability.monitorLabels": "Kubernetes labels (config/scaling.py)",
    }


# --- probes: a change per key, on the stacks where it applies --------------------------------------

# A candidate value, or a function of the stack's current value that returns one.
Candidate = Any | Callable[[Any], Any]


@dataclass(frozen=True)
class Probe:
    """How to change one key to derive what the change forces.

    Attributes:
        candidates: values tried in order on each stack; the first that differs from the stack's
            value (under ``base``) and is valid is used. A callable gets the current value.
        also: other keys set with it (``{"compute.capacity.reservationId": "cr-..."}``) when the
            key cannot change alone.
        base: the name of the ``SETTINGS`` entry set in both renders, to put the stack where the
            key applies (None: the stack as it is).
        stacks: where to try it (default every stack in ``stacks/``).
        change_key: the key the candidates set, when not the row's own (a list item's field is
            changed through the whole list).
    """

    candidates: tuple[Candidate, ...]
    also: Mapping[str, Any] = field(default_factory=dict)
    base: str | None = None
    stacks: tuple[str, ...] | None = None
    change_key: str | None = None


def _add(item: Any) -> Callable[[Any], Any]:
    """A candidate: the current list with ``item`` appended."""
    def add(current: Any) -> Any:
        return [*(current or ()), item]
    return add


def _merge(entries: Mapping[str, Any]) -> Callable[[Any], Any]:
    """A candidate: the current map with ``entries`` set."""
    def merge(current: Any) -> Any:
        return {**(current or {}), **entries}
    return merge


_WINDOW = {"start": "0 8 * * 1-5", "end": "0 20 * * 1-5", "timezone": "Europe/Berlin"}
_OPERATOR = {"observability.prometheusNamespace": "monitoring", "kubernetes.installedAddons": ["prometheus-operator"]}
_SCALING = {**_OPERATOR, "autoscaling.enabled": True, "autoscaling.maxReplicas": 4}
_MI355X_ADDONS = ["amd-gpu-operator", "prometheus-operator"]
_SUBNETS = ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"]
_AWS = ("b300", "b300-prod", "gb300")
_EKS = ("b300-prod", "gb300")
_ENGINE_IMAGES = ("vllm/vllm-openai:nightly-" + SAMPLE_COMMIT, "vllm/vllm-openai-rocm:nightly-" + SAMPLE_COMMIT)
_CUSTOM_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/vllm-efa:nightly-" + SAMPLE_COMMIT

_EXISTING_MIRROR = {"storage.mirror.enabled": True, "storage.mirror.create": False,
                    "storage.mirror.bucketName": "team-weight-mirror", "storage.mirror.region": "us-east-1"}
_IRSA = {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/kimi-mirror"}

# Settings a probe's change is made in (set in both renders), by the name the page shows.
SETTINGS: Mapping[str, Mapping[str, Any]] = {
    "pinned": {"model.revision": SAMPLE_COMMIT},
    "custom image": {"vllm.image": _CUSTOM_IMAGE},
    "existing VPC": {"network.vpcId": "vpc-0123456789abcdef0", "network.privateSubnetIds": _SUBNETS},
    "FSx": {"storage.kind": "nvme-from-fsx"},
    "FSx 4800": {"storage.kind": "nvme-from-fsx", "storage.fsx.capacityGib": 4800},
    "PVC": {"storage.kind": "pvc", "storage.existingClaim": "kimi-weights", "storage.readGBps": 5.0},
    "EKS 1.34": {"kubernetes.eksVersion": "1.34"},
    "cluster CIDRs": {"kubernetes.allowedCidrs": ["10.0.0.0/8"], "kubernetes.clusterCidrs": ["10.244.0.0/16"]},
    "operator": _OPERATOR,
    "autoscaling": _SCALING,
    "autoscaling + adapter": {**_SCALING, "kubernetes.installedAddons": ["prometheus-operator", "prometheus-adapter"]},
    "adapter": {"kubernetes.installedAddons": [*_MI355X_ADDONS, "prometheus-adapter"]},
    "window": {**_SCALING, "autoscaling.schedule": [_WINDOW]},
    "existing mirror": {**_EXISTING_MIRROR, "kubernetes.mirrorCredentials.secret.name": "mirror-keys"},
    "existing mirror, IRSA": {**_EXISTING_MIRROR, "kubernetes.mirrorCredentials.serviceAccountAnnotations": _IRSA},
}

# Keys with no other valid value on any stack here: what a change forces cannot be derived.
NOT_DERIVABLE: Mapping[str, str] = {
    "model.profile": "one model profile exists",
    "model.licenseAcknowledged": "true is the only valid value",
    "compute.instanceType": "each target has one instance type",
    "compute.amiArchitecture": "the only valid value is the instance type's architecture",
}

PROBES: Mapping[str, tuple[Probe, ...]] = {
    "target": (Probe(("b200", "gb300"), also={"compute.capacity.type": "capacity-block"}, stacks=("b300-prod",)),),
    "platform": (Probe(("aws-eks",), also={"network.apiServerPublicCidrs": ["1.2.3.4/32"]}, stacks=("b300",)),),
    "environment": (Probe(("staging", "trial"), base="pinned"),),
    "owner": (Probe(("ml-research",)),),
    "expiresAt": (Probe(("2026-12-03T00:00:00Z",)),),
    "trialTtlHours": (Probe((48, 72)),),
    "protect": (Probe((True, False)),),
    "phase": (Probe(("stage", "serve")),),
    "model.source": (Probe(("modelscope",)),),
    "model.revision": (Probe((SAMPLE_COMMIT, SAMPLE_COMMIT[::-1])),),
    "model.servedModelName": (Probe(("kimi-k3",)),),
    "compute.availabilityZone": (Probe(("us-east-1c", "us-east-1a"), stacks=("b300",)),),
    "compute.replicas": (Probe((2, 1)),),
    "compute.efa": (Probe((True,), base="custom image"),),
    "compute.capacity.type": (
        Probe(("odcr",), also={"compute.capacity.reservationId": "cr-0123456789abcdef0",
                               "compute.capacity.availabilityZone": "us-east-1a"}, stacks=("b300",)),
        Probe(("on-demand",), also={"compute.capacity.reservationId": None}, stacks=("b300-prod",)),
    ),
    "compute.capacity.reservationId": (Probe(("cr-0fedcba9876543210",), stacks=_EKS),),
    "compute.capacity.availabilityZone": (
        Probe(("us-east-1a",), also={"compute.availabilityZone": "us-east-1a"}, stacks=("b300-prod",)),
        Probe(("us-east-1c",), stacks=("gb300",)),
    ),
    "compute.capacity.endsAt": (Probe(("2026-12-10T00:00:00Z",), stacks=("gb300",)),),
    "compute.capacity.usdPerHour": (Probe((100.0,)),),
    "compute.capacity.blockInstances": (Probe((36,)),),
    "compute.rootVolumeGib": (Probe((600,)),),
    "compute.weightsRetry.attempts": (Probe((5,), stacks=("b300",)),),
    "compute.weightsRetry.delaySeconds": (Probe((300,), stacks=("b300",)),),
    "compute.amiId": (
        Probe(("ami-0123456789abcdef0",), also={"compute.amiArchitecture": "x86_64"}, stacks=("b300", "b300-prod")),
        Probe(("ami-0123456789abcdef0",), also={"compute.amiArchitecture": "arm64"}, stacks=("gb300",)),
    ),
    "compute.usdPerHour": (Probe((150.0,)),),
    "prices": (Probe(({"natGatewayHour": 0.059},)),),
    "network.vpcId": (
        Probe(("vpc-0123456789abcdef0",), also={"network.privateSubnetIds": _SUBNETS}),
    ),
    "network.privateSubnetIds": (
        Probe((["subnet-0aaaaaaaaaaaaaaa0", "subnet-0bbbbbbbbbbbbbbb0"],),
              base="existing VPC"),
    ),
    "network.vpcCidr": (Probe(("10.50.0.0/16",)),),
    "network.allowedCidrs": (Probe((_add("192.168.0.0/16"),)),),
    "network.allowedSecurityGroupIds": (Probe((["sg-0123456789abcdef0"],)),),
    "network.s3GatewayEndpoint": (Probe((False,)),),
    "network.apiServerAccess": (
        Probe(("private",), also={"network.apiServerPublicCidrs": [], "network.apiServerPrivateCidrs": ["10.8.0.0/16"]},
              base="existing VPC", stacks=_EKS),
    ),
    "network.apiServerPublicCidrs": (Probe((["1.2.3.4/32"],), stacks=_EKS),),
    "network.apiServerPrivateCidrs": (Probe((["10.8.0.0/16"],), stacks=_EKS),),
    "network.apiServerPrivateSecurityGroupIds": (Probe((["sg-0123456789abcdef0"],), stacks=_EKS),),
    "storage.kind": (
        Probe(("fsx", "nvme"), stacks=_AWS),
        Probe(("pvc",), also={"storage.existingClaim": "kimi-weights", "storage.readGBps": 5.0}, stacks=("mi355x",)),
    ),
    "storage.readGBps": (Probe((1.0,)),),
    "storage.existingClaim": (
        Probe(("kimi-weights-2",), base="PVC"),
    ),
    "storage.mirror.enabled": (Probe((False, True)),),
    "storage.mirror.bucketName": (Probe(("kimi-weights-mirror-example",)),),
    "storage.mirror.create": (Probe((False,), also={"storage.mirror.bucketName": "kimi-weights-mirror-example"}),),
    "storage.mirror.prefix": (Probe(("weights",)),),
    "storage.mirror.endpointUrl": (Probe(("http://minio.storage.svc:9000",)),),
    "storage.mirror.region": (Probe(("eu-west-1",), base="existing mirror", stacks=("mi355x",)),),
    "kubernetes.mirrorCredentials.secret.name": (Probe(("team-mirror-keys",), base="existing mirror", stacks=("mi355x",)),),
    "kubernetes.mirrorCredentials.secret.accessKeyIdKey": (Probe(("id",), base="existing mirror", stacks=("mi355x",)),),
    "kubernetes.mirrorCredentials.secret.secretAccessKeyKey": (
        Probe(("secret",), base="existing mirror", stacks=("mi355x",)),),
    "kubernetes.mirrorCredentials.secret.sessionTokenKey": (Probe(("token",), base="existing mirror", stacks=("mi355x",)),),
    "kubernetes.mirrorCredentials.serviceAccountAnnotations": (
        Probe(({"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/kimi-mirror-2"},),
              base="existing mirror, IRSA", stacks=("mi355x",)),),
    "kubernetes.mirrorCredentials.serviceAccountName": (
        Probe(("team-mirror-reader",), also={"kubernetes.mirrorCredentials.serviceAccountAnnotations": {}},
              base="existing mirror, IRSA", stacks=("mi355x",)),),
    "storage.fsx.deploymentType": (Probe(("SCRATCH_2",), base="FSx"),),
    "storage.fsx.throughputPerTib": (Probe((500,), base="FSx"),),
    "storage.fsx.capacityGib": (
        Probe((4800,), base="FSx"),
        Probe((2400,), base="FSx 4800"),
    ),
    "storage.fsx.headroomFraction": (Probe((1.0,), base="FSx"),),
    "storage.fsx.efa": (Probe((True,), base="FSx"),),
    "storage.fsx.metadataIops": (Probe((12000,), base="FSx"),),
    "storage.fsx.importWaitSeconds": (Probe((3600,), base="FSx"),),
    "vllm.imageTag": (Probe(("nightly-" + SAMPLE_COMMIT,)),),
    "vllm.image": (Probe(_ENGINE_IMAGES),),
    "vllm.port": (Probe((8080,)),),
    "vllm.decodeContextParallelSize": (Probe((8, 1)),),
    "vllm.maxModelLen": (Probe((262144,)),),
    "vllm.kvCacheDtype": (Probe(("fp8_e4m3", "bfloat16")),),
    "vllm.indexerCacheDtype": (Probe(("mxfp4",), stacks=("b300", "b300-prod", "gb300")),),
    "vllm.kvCacheTokens": (Probe((2_250_000,)),),
    "vllm.gpuMemoryUtilization": (Probe((0.9,)),),
    "vllm.enablePrefixCaching": (Probe((False,)),),
    "vllm.extraArgs": (Probe((["--max-num-seqs", "64"],)),),
    "kubernetes.namespace": (Probe(("kimi-prod",)),),
    "kubernetes.installedAddons": (
        Probe((_add("nvidia-device-plugin"),), stacks=_EKS),
        Probe((_add("keda"),), stacks=("mi355x",)),
    ),
    "kubernetes.nodeSelector": (Probe((_merge({"pool": "gpu"}),)),),
    "kubernetes.tolerations": (
        Probe((_add({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}),)),
    ),
    "kubernetes.serviceType": (Probe(("internal-nlb", "ClusterIP")),),
    "kubernetes.allowedNamespaces": (Probe((_add("batch"),)),),
    "kubernetes.allowedCidrs": (
        Probe((["10.30.0.0/16"],), stacks=_EKS),
        Probe((["10.30.0.0/16"],), also={"kubernetes.clusterCidrs": ["10.244.0.0/16"]}, stacks=("mi355x",)),
    ),
    "kubernetes.clusterCidrs": (
        Probe((["10.244.0.0/16", "10.96.0.0/12"],),
              base="cluster CIDRs"),
    ),
    "kubernetes.nvmeHostPath": (Probe(("/mnt/nvme1",)),),
    "kubernetes.context": (Probe(("mi355x-admin",)),),
    "kubernetes.adminRoleArns": (Probe(([ROLE_ARN],)),),
    "kubernetes.eksVersion": (Probe(("1.35",), base="EKS 1.34"),),
    "kubernetes.eksSupportType": (Probe(("EXTENDED",)),),
    "autoscaling.enabled": (
        Probe((True,), base="operator", stacks=_EKS),
        Probe((False,), stacks=("mi355x",)),
    ),
    "autoscaling.minReplicas": (
        Probe((2,), base="autoscaling", stacks=_EKS),
        Probe((0,), base="window"),
    ),
    "autoscaling.maxReplicas": (Probe((3,), base="autoscaling"),),
    "autoscaling.controller": (
        Probe(("hpa",), base="autoscaling + adapter",
              stacks=_EKS),
        Probe(("hpa",), base="adapter", stacks=("mi355x",)),
    ),
    "autoscaling.schedule": (Probe(([_WINDOW],), base="autoscaling"),),
    "autoscaling.schedule[].start": (
        Probe(([{**_WINDOW, "start": "0 7 * * 1-5"}],), base="window", change_key="autoscaling.schedule"),
    ),
    "autoscaling.schedule[].end": (
        Probe(([{**_WINDOW, "end": "0 22 * * 1-5"}],), base="window", change_key="autoscaling.schedule"),
    ),
    "autoscaling.schedule[].timezone": (
        Probe(([{**_WINDOW, "timezone": "Asia/Shanghai"}],), base="window", change_key="autoscaling.schedule"),
    ),
    "autoscaling.queuePerReplica": (Probe((8.0,), base="autoscaling"),),
    "autoscaling.kvCacheUsageTarget": (Probe((0.9,), base="autoscaling"),),
    "autoscaling.scaleDownDelaySeconds": (Probe((86_400,), base="autoscaling"),),
    "observability.prometheusNamespace": (Probe(("observability",)),),
    "observability.prometheusUrl": (Probe(("http://prometheus.monitoring.svc:9090",)),),
    "observability.grafanaNamespace": (Probe(("grafana",)),),
    "observability.alerts": (Probe((False,), base="operator"),),
    "observability.gpuExporter": (Probe((False,), base="operator"),),
    "observability.prometheusPodLabels": (Probe(({"app": "prometheus"},), base="operator"),),
    "observability.monitorLabels": (Probe(({"release": "prometheus"},), base="operator"),),
    "observability.queueAlertMinutes": (Probe((20,), base="operator"),),
    "observability.kvCacheAlertFraction": (Probe((0.9,), base="operator"),),
    "timeToReady.infrastructureSeconds": (Probe((900.0,)),),
    "timeToReady.instanceBootSeconds": (Probe((300.0,)),),
    "timeToReady.imagePullSeconds": (Probe((200.0,)),),
    "timeToReady.hubDownloadGBps": (Probe((1.0,)),),
    "timeToReady.copyGBps": (Probe((2.0,)),),
    "timeToReady.engineInitSeconds": (Probe((3600.0,)),),
    "timeToReady.engineInitCachedSeconds": (Probe((300.0,)),),
    "timeToReady.stagerBootSeconds": (Probe((300.0,)),),
    AWS_REGION: (Probe(("us-west-2",), also={"compute.availabilityZone": "us-west-2a"}, stacks=("b300",)),),
}


# --- deriving: render, change, diff --------------------------------------------------------------


def overlay_of(values: Mapping[str, Any]) -> dict[str, Any]:
    """``{"compute.capacity.type": "odcr"}`` as a config overlay of full keys
    (``{"kimi-deploy:compute": {"capacity": {"type": "odcr"}}}``); keys with a namespace stay whole."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if ":" in key:
            out[key] = value
            continue
        head, *rest = key.split(".")
        if not rest:
            out[f"{NAMESPACE}:{head}"] = value
            continue
        node = out.setdefault(f"{NAMESPACE}:{head}", {})
        for part in rest[:-1]:
            node = node.setdefault(part, {})
        node[rest[-1]] = value
    return out


@contextmanager
def _overlay(values: Mapping[str, Any]) -> Iterator[None]:
    """``KIMI_DEPLOY_CONFIG_OVERLAY`` set to ``values`` (an overlay the caller's environment may
    hold is replaced, so every render sees the stack file and ``values`` only)."""
    previous = os.environ.get(CONFIG_OVERLAY_ENV)
    os.environ[CONFIG_OVERLAY_ENV] = json.dumps(overlay_of(values))
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(CONFIG_OVERLAY_ENV, None)
        else:
            os.environ[CONFIG_OVERLAY_ENV] = previous


def current_value(stack: str, base: Mapping[str, Any], key: str) -> Any:
    """The value of ``key`` on ``stack`` under ``base`` (JSON-like: lists, maps, scalars).

    Raises:
        ConfigError: the stack under ``base`` is not valid.
    """
    with _overlay(base):
        spec = load_stack(stack, now=NOW)
    if key == AWS_REGION:
        return spec.config.region
    node: Any = spec.config.model_dump(by_alias=True, mode="json")
    for part in key.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


class Deriver:
    """Renders stacks (cached by stack and overlay: the unchanged renders are shared between keys)
    and diffs them; ``renders`` counts the renders made."""

    def __init__(self) -> None:
        self._docs: dict[tuple[str, str], dict[str, Any] | ConfigError] = {}
        self.renders = 0

    def render(self, stack: str, values: Mapping[str, Any]) -> dict[str, Any]:
        """The plan document of ``stack`` with ``values`` set.

        Raises:
            ConfigError: the program refuses the config.
        """
        from scripts.ops.plan import build_plan_document

        cache_key = (stack, json.dumps(values, sort_keys=True))
        if cache_key not in self._docs:
            self.renders += 1
            try:
                with _overlay(values):
                    self._docs[cache_key] = build_plan_document(stack, now=NOW)
            except ConfigError as err:
                self._docs[cache_key] = err
        doc = self._docs[cache_key]
        if isinstance(doc, ConfigError):
            raise doc
        return doc

    def case(self, stack: str, key: str, probe: Probe) -> dict[str, Any]:
        """One stack's result for ``probe`` of ``key``: ``{stack, base?, change, forces}`` or, where
        the key does not apply, ``{stack, base?, refused: <the error>}`` (not stored)."""
        from scripts.ops.diff.engine import diff_documents

        entry: dict[str, Any] = {"stack": stack}
        base = SETTINGS[probe.base] if probe.base else {}
        if probe.base:
            entry["base"] = probe.base
        try:
            base_doc = self.render(stack, base)
            current = current_value(stack, base, probe.change_key or key)
        except ConfigError as err:
            return {**entry, "refused": f"base: {err}"}
        last = "no candidate differs from the stack's value"
        for candidate in probe.candidates:
            value = candidate(current) if callable(candidate) else candidate
            if value == current:
                continue
            change = {probe.change_key or key: value, **probe.also}
            try:
                doc = self.render(stack, {**base, **change})
            except ConfigError as err:
                last = str(err)
                continue
            return {**entry, "change": change, "forces": forces_of(diff_documents(base_doc, doc))}
        return {**entry, "refused": last}


FORCE_KINDS: tuple[str, ...] = ("replaces", "recycles", "disrupts", "adds", "removes", "updates")


def forces_of(diff: Mapping[str, Any]) -> dict[str, Any]:
    """What ``pulumi up`` does to the resources in a plan diff (``scripts.ops.diff.engine``), empty
    kinds left out: ``replaces``, ``recycles`` (node groups rolled), ``disrupts`` (other
    disruptive in-place updates: stop/start, pods recreated, a new launch-template version) as
    sorted ``"<type token> <name>"``; ``adds``, ``removes`` and ``updates`` (quiet in-place
    updates) as counts."""
    from scripts.ops.diff.rules import RECYCLED_ON_UPDATE

    def name(entry: Mapping[str, Any]) -> str:
        return f"{entry['type']} {entry['name']}"

    changed = diff["changed"]
    found = {
        "replaces": sorted(name(c) for c in changed if c["action"] == "replace"),
        "recycles": sorted(name(c) for c in changed if c["action"] != "replace" and c["disruptive"]
                           and c["type"] in RECYCLED_ON_UPDATE),
        "disrupts": sorted(name(c) for c in changed if c["action"] != "replace" and c["disruptive"]
                           and c["type"] not in RECYCLED_ON_UPDATE),
        "adds": len(diff["added"]),
        "removes": len(diff["removed"]),
        "updates": sum(1 for c in changed if not c["disruptive"]),
    }
    return {kind: value for kind, value in found.items() if value}


def derivable_keys() -> list[str]:
    """Every key the reference has a row for: the model's and ``aws:region``."""
    return [row.key for row in config_keys()] + [AWS_REGION]


def derive(
    keys: Sequence[str], stacks: Sequence[str] | None = None, deriver: Deriver | None = None
) -> tuple[dict[str, Any], Deriver]:
    """``{key: [case, ...]}`` for ``keys`` (``Deriver.case`` on each probe's stacks, the cases
    where the key applies; keys in ``NOT_DERIVABLE`` as ``{"not_derived": why}``) and the
    ``Deriver`` (a new one unless given: pass one to share its renders).

    Raises:
        UsageError: a key with no probe and no reason, or a probe refused on every stack.
    """
    stacks = list(stacks or stack_names())
    deriver = deriver or Deriver()
    out: dict[str, Any] = {}
    broken: list[str] = []
    for key in keys:
        if key in NOT_DERIVABLE:
            out[key] = {"not_derived": NOT_DERIVABLE[key]}
            continue
        if key not in PROBES:
            broken.append(f"{key}: no probe (add one to PROBES, or a reason to NOT_DERIVABLE)")
            continue
        cases = [deriver.case(stack, key, probe) for probe in PROBES[key] for stack in (probe.stacks or stacks)]
        applied = [c for c in cases if "forces" in c]
        if not applied:
            broken.append(f"{key}: every probe was refused ({cases[-1]['refused']})")
        out[key] = applied
    if broken:
        raise UsageError(f"{len(broken)} key(s) cannot be derived, fix scripts/dev/config_reference.py: " + "; ".join(broken))
    return out, deriver


# --- the derivation file ---------------------------------------------------------------------------


def forces_document(derived: Mapping[str, Any]) -> str:
    """The derivation file's text (``{generated_by, now, settings, keys}``): one key per block, one
    case per line (small diffs). ``settings``: the ``SETTINGS`` the cases name."""
    lines = [
        "{",
        f'  "generated_by": {json.dumps(COMMAND + " --derive")},',
        f'  "now": "{format_utc(NOW)}",',
        f'  "settings": {json.dumps(SETTINGS, sort_keys=True)},',
        '  "keys": {',
    ]
    keys = list(derived)
    for i, key in enumerate(keys):
        value = derived[key]
        end = "," if i < len(keys) - 1 else ""
        if isinstance(value, Mapping):
            lines.append(f"    {json.dumps(key)}: {json.dumps(value, sort_keys=True)}{end}")
            continue
        lines.append(f"    {json.dumps(key)}: [")
        lines.extend(f"      {json.dumps(case, sort_keys=True)}{',' if j < len(value) - 1 else ''}"
                     for j, case in enumerate(value))
        lines.append(f"    ]{end}")
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def read_forces(path: Path | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The stored derivation (default ``FORCES_PATH``): ``({key: cases}, settings)`` (empty when the
    file does not exist)."""
    path = path or FORCES_PATH
    if not path.is_file():
        return {}, {}
    doc = json.loads(path.read_text())
    return dict(doc["keys"]), dict(doc.get("settings", {}))


# --- one key in words: the page's detail blocks and `kimi-deploy config explain KEY` ---------------

# The page's prose and lists are wrapped at this many characters, its table rows kept under
# TABLE_WIDTH where the cells allow (a terminal's width; the tables were up to 1,217 wide).
PAGE_WIDTH = 110
TABLE_WIDTH = 118
# How `config explain` is typed (scripts/cli.py dispatches `config` to scripts/ops/config_explain.py).
EXPLAIN_COMMAND = "kimi-deploy config explain"
RAW_MODULE = "components/core/config/raw.py"


def _code(text: str, md: bool) -> str:
    """``text`` as inline code on the page, as it is in a terminal."""
    return f"`{text}`" if md else text


def short_name(resource: str) -> str:
    """``"aws:ec2/instance:Instance gpu-instance"`` -> ``"Instance gpu-instance"`` (the page's form)."""
    token, _, name = resource.partition(" ")
    return f"{token.rsplit(':', 1)[-1]} {name}"


def effect_text(forces: Mapping[str, Any], md: bool = True) -> str:
    """One stack's effect in words: ``**replaces** `Instance gpu-instance`; updates 2 in place``
    (``md`` false: without the page's marks)."""
    parts = []
    for kind in ("replaces", "recycles", "disrupts"):
        if forces.get(kind):
            verb = f"**{kind}**" if kind != "disrupts" and md else kind
            parts.append(f"{verb} " + ", ".join(_code(short_name(r), md) for r in forces[kind]))
    for kind in ("adds", "removes"):
        if forces.get(kind):
            parts.append(f"{kind} {forces[kind]} resource{'s' if forces[kind] > 1 else ''}")
    if forces.get("updates"):
        parts.append(f"updates {forces['updates']} in place")
    return "; ".join(parts) or "no resource change"


def _change_label(key: str, case: Mapping[str, Any], md: bool = True) -> str:
    """The change a case made, as YAML: the row's own value first (``500``), then the other keys
    set with it in key order (``key: value``); ``in *<setting>*`` for its base."""
    change = case["change"]
    parts = [_code(yaml_value(change[key]), md)] if key in change else []
    parts += [_code(f"{k}: {yaml_value(change[k])}", md) for k in sorted(change) if k != key]
    label = ", ".join(parts)
    if case.get("base"):
        label += f" in *{case['base']}*" if md else f" in setting '{case['base']}'"
    return label


def forces_lines(key: str, cases: Any, md: bool = True) -> list[str]:
    """What a change of ``key`` forces, one line per change tried: the stacks with the same effect
    together; ``not derived: why`` where no other value is valid."""
    if cases is None:
        return [f"not derived yet (run {COMMAND} --derive {key})"]
    if isinstance(cases, Mapping):
        return [f"not derived: {cases['not_derived']}"]
    by_label: dict[str, dict[str, list[str]]] = {}
    for case in cases:
        effects = by_label.setdefault(_change_label(key, case, md), {})
        effects.setdefault(effect_text(case["forces"], md), []).append(case["stack"])
    if not md:  # a terminal: the change, then one indented line per group of stacks
        return [line for label, effects in by_label.items()
                for line in (f"{label}:", *(f"  {', '.join(stacks)}: {effect}" for effect, stacks in effects.items()))]
    return [f"{label}: " + "; ".join(f"{', '.join(stacks)}: {effect}" for effect, stacks in effects.items())
            for label, effects in by_label.items()]


def forces_text(key: str, cases: Any) -> str:
    """``forces_lines`` of ``key`` as one text (``<br>`` between the changes)."""
    return "<br>".join(forces_lines(key, cases))


def replacing_keys(derived: Mapping[str, Any]) -> list[str]:
    """Keys whose derived change replaces a resource on some stack."""
    return [k for k, cases in derived.items() if isinstance(cases, list) and any(c["forces"].get("replaces") for c in cases)]


def default_short(row: ConfigKey) -> str:
    """The narrow table's default: ``required``, ``derived`` (the rule is in the key's block),
    ``none`` or the value as YAML."""
    if row.info.is_required():
        return "required"
    if row.derived:
        return "derived"
    value = row.info.get_default(call_default_factory=True)
    return "none" if value is None else yaml_value(value)


def summary(text: str, width: int) -> str:
    """The first sentence of ``text``, cut to ``width`` characters (ending ``...``) when longer; a cut
    never splits a quoted title (``README "License of the model"``): it falls before the reference."""
    import re

    first = re.split(r"(?<!e\.g)(?<!i\.e)\.\s+(?=[A-Z])", text, maxsplit=1)[0].rstrip(".")
    if len(first) <= width:
        return first
    cut = first[: max(width - 3, 1)]
    if cut.count('"') % 2:  # inside a quoted title: drop the reference it opens, with its parenthesis
        cut = cut[: cut.rindex('"')]
        cut = cut[: cut.rindex("(")] if "(" in cut else cut
    return cut.rstrip(" ,;:(") + "..."


@dataclass(frozen=True)
class StackConfig:
    """One stack file as ``config explain`` reads it: ``full`` (its ``config:`` map), ``values``
    (the ``kimi-deploy`` namespace decoded as the program reads it) and ``raw`` (validated by type),
    or ``error`` (one line) when the file does not read."""

    stack: str
    full: Mapping[str, Any] = field(default_factory=dict)
    values: Mapping[str, Any] = field(default_factory=dict)
    raw: RawConfig | None = None
    error: str | None = None


def stack_configs(names: Sequence[str] | None = None) -> list[StackConfig]:
    """The stacks ``names`` (default: every stack file in ``stacks/``, a user's own too) as their files
    say (an offline overlay in the environment is left out)."""
    from components.core.config import namespace_config, read_stack_config
    from components.core.config.raw import validate_raw

    out = []
    with _overlay({}):
        for stack in names if names is not None else stack_names():
            try:
                full = read_stack_config(stack)
                values, _ = namespace_config(full)
                raw, _ = validate_raw(values)
            except ConfigError as err:
                out.append(StackConfig(stack, error=" ".join(str(err).split())))
                continue
            out.append(StackConfig(stack, full, values, raw))
    return out


_UNSET = object()


def _lookup(node: Any, parts: Sequence[str]) -> Any:
    """The value at ``parts`` (``["autoscaling", "schedule[]", "start"]``) in decoded config, a list
    for the items of a list of maps; ``_UNSET`` when not set."""
    if not parts:
        return node
    head, rest = parts[0], parts[1:]
    if not isinstance(node, Mapping):
        return _UNSET
    if head.endswith("[]"):
        items = node.get(head[:-2])
        found = [v for v in (_lookup(item, rest) for item in items) if v is not _UNSET] if isinstance(items, list) else []
        return found or _UNSET
    return _lookup(node[head], rest) if head in node else _UNSET


def _unread_reason(key: str, config: StackConfig) -> str | None:
    """Why ``config``'s stack does not read ``key`` (its platform, or another key's value), or None."""
    from components.core.config.platform_keys import readers_of, setting
    from components.core.platforms import PLATFORM_PROFILES

    if config.raw is None:
        return None
    profile = PLATFORM_PROFILES.get(config.raw.platform)
    if key == AWS_REGION and profile is not None and not profile.provisions_aws:
        return f"not read on {config.raw.platform}"
    if ":" in key:
        return None
    rule = readers_of(key.replace("[]", ""))
    if rule is None or profile is None:
        return None
    if not rule.read_by(profile):
        return f"not read on {config.raw.platform}"
    for other, values in rule.when:
        current = setting(config.raw, other)
        if current not in values:
            return f"not read with {other} {yaml_value(current)}"
    return None


def stack_value_lines(key: str, configs: Sequence[StackConfig], md: bool = True) -> list[str]:
    """One line per stack: the value its file sets for ``key`` (``b300: 10.0.0.0/8 (stack file)``)
    or the default (``mi355x: kimi (default)``), and why the stack does not read it where so."""
    from components.core.config.raw import SECRET_KEYS

    rows = {row.key: row for row in config_keys()}
    out = []
    for config in configs:
        if config.error is not None:
            out.append(f"{config.stack}: the stack file does not read ({config.error})")
            continue
        if key in SECRET_KEYS:
            set_here = isinstance(config.full.get(f"{NAMESPACE}:{key}"), Mapping)
            out.append(f"{config.stack}: {'set (secure: ciphertext in the stack file)' if set_here else 'unset'}")
            continue
        if ":" in key:
            value = config.full.get(key, _UNSET)
        else:
            value = _lookup(config.values, key.split("."))
        if value is not _UNSET and value is not None:
            text = f"{_code(yaml_value(value), md)} (stack file)"
        elif key in rows:
            text = f"{_code(default_short(rows[key]), md)} (default)" if not rows[key].info.is_required() else "unset"
        else:
            text = "unset"
        why = _unread_reason(key, config)
        out.append(f"{config.stack}: {text}" + (f"; {why}" if why else ""))
    return out


def example_value(key: str, configs: Sequence[StackConfig] = ()) -> Any:
    """A valid value of ``key`` to show in its example: the first change its probe tries (the value
    the derivation set), else a ``Literal`` choice, the default, or a stack file's value."""
    for probe in PROBES.get(key, ()):
        for candidate in probe.candidates:
            value = candidate(None) if callable(candidate) else candidate
            if probe.change_key:  # a list item's field, changed through the whole list
                return value[0][key.rsplit(".", 1)[1]]
            return value
    row = next((r for r in config_keys() if r.key == key), None)
    if row is not None:
        choices = _literal_choices(row.info.annotation)
        if choices:
            return choices[0]
        default = None if row.info.is_required() else row.info.get_default(call_default_factory=True)
        if default not in (None, (), {}, []):
            return default
    for config in configs:
        value = _lookup(config.values, key.split(".")) if ":" not in key else config.full.get(key, _UNSET)
        if value is not _UNSET and value is not None:
            return value
    return "<value>"


def _path_part(name: str) -> str:
    """A map key in a ``pulumi config set --path`` path: ``.name``, or ``["amd.com/gpu"]``."""
    import re

    return f".{name}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else f'["{name}"]'


def _leaves_of(path: str, value: Any) -> list[tuple[str, Any]]:
    """``(path, scalar)`` of every leaf of ``value`` under ``path`` as Pulumi paths name them."""
    if isinstance(value, (list, tuple)):
        return [leaf for i, item in enumerate(value) for leaf in _leaves_of(f"{path}[{i}]", item)]
    if isinstance(value, Mapping):
        return [leaf for k, item in value.items() for leaf in _leaves_of(path + _path_part(str(k)), item)]
    return [(path, value)]


def set_commands(key: str, value: Any) -> list[str]:
    """The ``pulumi config set`` lines that set ``key`` to ``value``: a top-level scalar as it is,
    anything nested with ``--path`` (a list item's key at index 0), one line per leaf (``--path`` writes
    a decimal as text, which the config reads as its number)."""
    import shlex

    def text(leaf: Any) -> str:
        if isinstance(leaf, float):  # a whole one as an integer, which --path stores as a number
            return str(int(leaf)) if leaf.is_integer() else json.dumps(leaf)
        return yaml_value(leaf)

    if ":" in key:
        return [f"pulumi config set {key} {shlex.quote(text(value))}"]
    full = f"{NAMESPACE}:{key.replace('[]', '[0]')}"
    if "." not in key and not isinstance(value, (list, tuple, Mapping)):
        return [f"pulumi config set {full} {shlex.quote(text(value))}"]
    return [f"pulumi config set --path {shlex.quote(path)} {shlex.quote(text(leaf))}"
            for path, leaf in _leaves_of(full, value)]


def _check_modules(rule: str) -> str:
    """The modules a ``rules()`` text names at its end (``config/storage.py``), or ``""``."""
    import re

    found = re.search(r"\(([^()]*\.py[^()]*)\)\s*$", rule)
    return found.group(1) if found else ""


@dataclass(frozen=True)
class KeyDetail:
    """Everything the page's block and ``config explain`` say about one key.

    Attributes:
        key: the key as ``config explain`` takes it (``storage.fsx.throughputPerTib``, ``aws:region``,
            ``hfToken``).
        section: the page's section title (``kimi-deploy:storage.fsx``).
        description: the field's docstring as one line.
        items: ``(label, lines)`` in order: type, default, allowed, applies to, stacks, a change
            forces, source, example.
    """

    key: str
    section: str
    description: str
    items: tuple[tuple[str, tuple[str, ...]], ...]


def _section_title(section: str) -> str:
    return f"{NAMESPACE}:{section}" if section else f"{NAMESPACE} (top level)"


def key_detail(key: str, *, derived: Mapping[str, Any], rule_text: Mapping[str, str],
               configs: Sequence[StackConfig], md: bool = True) -> KeyDetail:
    """The detail of ``key`` (a model key, ``aws:region`` or a secret key) from the model, the
    checks' rules, the platform table, the stack files and the stored derivation.

    Raises:
        KeyError: ``key`` is none of those (``resolve_key`` says which keys exist).
    """
    from components.core.config.raw import SECRET_KEYS

    stacks = tuple(stack_value_lines(key, configs, md))
    if key in SECRET_KEYS:
        return KeyDetail(key, "Secrets", " ".join(SECRETS[key].split()), (
            ("type", ("secret string: `pulumi config set --secret` asks for the value (never in argv or shell "
                      "history) and the stack file holds its ciphertext" if md else
                      "secret string: pulumi config set --secret asks for the value (never in argv or shell history) "
                      "and the stack file holds its ciphertext",)),
            ("default", ("unset",)),
            ("stacks", stacks),
            ("source", (f"{RAW_MODULE} SECRETS",)),
            ("example", (_code(f"pulumi config set --secret {NAMESPACE}:{key}"
                               + (" < ~/.kube/config" if key == "kubeconfig" else ""), md),)),
        ))
    example = tuple(_code(line, md) for line in set_commands(key, example_value(key, configs)))
    forces = tuple(forces_lines(key, derived.get(key), md))
    if key == AWS_REGION:
        region = RawConfig.model_fields["region"]
        return KeyDetail(key, "Other namespaces", " ".join((region.description or "").split()), (
            ("type", ("string",)),
            ("default", ("required on aws-ec2 and aws-eks",)),
            ("allowed", ("an AWS region name that offers the instance type (targets.py offering facts; preflight asks AWS)",)),
            ("applies to", ("read on aws-ec2, aws-eks",)),
            ("stacks", stacks),
            ("a change forces", forces),
            ("source", ("components/core/config/reader.py (read_config_strings), components/core/config/compute.py",)),
            ("example", example),
        ))
    row = next(r for r in config_keys() if r.key == key)
    default = default_text(row)
    allowed = allowed_text(row, rule_text, readers=False)
    readers = readers_text(key.replace("[]", ""))
    checks = _check_modules(rule_text.get(key, ""))
    source = f"{RAW_MODULE} ({row.model_name}.{row.field_name})" + (f"; checks in components/core/: {checks}" if checks else "")
    items: list[tuple[str, tuple[str, ...]]] = [
        ("type", (type_words(row.info.annotation),)),
        ("default", (default if md else default.replace("`", ""),)),
    ]
    if allowed:
        items.append(("allowed", (allowed if md else allowed.replace("`", ""),)))
    items += [
        ("applies to", ((readers if md else readers.replace("`", "")) or "every platform",)),
        ("stacks", stacks),
        ("a change forces", forces),
        ("source", (source,)),
        ("example", example),
    ]
    return KeyDetail(key, _section_title(row.section), row.description, tuple(items))


def detail_block(detail: KeyDetail) -> list[str]:
    """The page's block of one key (Markdown, lines wrapped at ``PAGE_WIDTH``)."""
    out = [f"### `{detail.key}`", "", *_wrap(detail.description), ""]
    for label, lines in detail.items:
        wrap = (lambda text, indent: [text]) if label == "example" else (lambda text, indent: _wrap(text, indent=indent))
        if len(lines) == 1:
            out += wrap(f"- **{label}:** {lines[0]}", "  ")
            continue
        out.append(f"- **{label}:**")
        for line in lines:
            out += wrap(f"  - {line}", "    ")
    return [*out, ""]


def explain_text(detail: KeyDetail, width: int = 100) -> str:
    """``config explain KEY``'s text: the key and its section, the description, then one labelled
    paragraph per item, wrapped to ``width`` columns."""
    label_width = max(len(label) for label, _ in detail.items) + 2
    out = [f"{detail.key}  ({detail.section})", *_wrap(detail.description, width, indent="  ", first="  "), ""]
    for label, lines in detail.items:
        for i, line in enumerate(lines):
            head = f"  {label if i == 0 else '':<{label_width}}"
            # An example stays one line, to be copied whole; an indented line keeps its indent when wrapped.
            inner = " " * (len(line) - len(line.lstrip()))
            out += ([head + line] if label == "example"
                    else _wrap(line.lstrip(), width, indent=" " * len(head) + inner + "  ", first=head + inner))
    return "\n".join(out) + "\n"


def _wrap(text: str, width: int = PAGE_WIDTH, *, indent: str = "", first: str = "") -> list[str]:
    """``text`` wrapped at ``width`` (words kept whole: a long URL or image name overflows)."""
    return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False) or [first.rstrip()]


def key_index(section: str | None = None, width: int = 100) -> str:
    """``config explain`` without a key (or with a section's name): the keys by section, each with
    its one-line summary, then the secrets and the other namespaces."""
    from components.core.config.raw import SECRET_KEYS

    rows = config_keys()
    sections = section_descriptions()
    chosen = [section] if section is not None else list(sections)
    out = [] if section is not None else [*_wrap(
        f"Config keys of {NAMESPACE}, by section (stacks/Pulumi.<stack>.yaml; docs/configuration.md). "
        f"`{EXPLAIN_COMMAND} KEY` explains one: type, default, allowed values, the stacks' values, what a change "
        "forces, an example.", width), ""]
    for name in chosen:
        keys = [r for r in rows if r.section == name]
        column = min(max(len(r.key) for r in keys) + 2, 42)
        out += _wrap(_section_title(name) + (f": {sections[name]}" if sections[name] else ""), width, indent="  ")
        for r in keys:
            head = f"  {r.key:<{column}}"
            line = summary(r.description, width - len(head))
            out.append(head + line if len(r.key) < column else f"  {r.key}\n  {'':<{column}}{line}")
        out.append("")
    if section is None:
        out.append("Secrets (pulumi config set --secret)")
        out += [f"  {key:<18}{summary(' '.join(SECRETS[key].split()), width - 20)}" for key in SECRET_KEYS]
        out += ["", "Other namespaces", f"  {AWS_REGION:<18}the AWS region (aws-ec2, aws-eks)", ""]
    return "\n".join(out)


def resolve_key(text: str) -> tuple[str, str]:
    """``("key", key)`` or ``("section", section)`` for what a user typed: ``vllm.port``,
    ``kimi-deploy:vllm.port``, ``autoscaling.schedule[0].start`` and ``autoscaling.schedule.start``
    (a list item's key), any letter case; a section's name (``vllm``, ``storage.fsx``).

    Raises:
        UsageError: nothing of that name, one line with the nearest key.
    """
    import re

    from components.core.config.raw import SECRET_KEYS
    from components.core.errors import did_you_mean

    name = text.strip().removeprefix(f"{NAMESPACE}:")
    name = re.sub(r"\[\d*\]", "[]", name)
    keys = [*derivable_keys(), *SECRET_KEYS]
    sections = [s for s in section_descriptions() if s]
    for candidates, kind in ((keys, "key"), (sections, "section")):
        by_form = {form: k for k in candidates for form in (k, k.replace("[]", ""), k.lower(), k.replace("[]", "").lower())}
        if name in by_form or name.lower() in by_form:
            return kind, by_form.get(name, by_form.get(name.lower(), name))
    if name == "region":
        return "key", AWS_REGION
    hint = did_you_mean(name, [*keys, *sections]) or f"; list them with `{EXPLAIN_COMMAND}`"
    raise UsageError(f"config explain: {text!r} is not a config key or section{hint}")


def explain(text: str | None, *, md: bool = False, width: int = 100) -> str:
    """What ``kimi-deploy config explain [KEY]`` prints: the key's detail, a section's keys, or
    (``text`` None) every key by section.

    Raises:
        UsageError: ``text`` names no key or section (``resolve_key``).
    """
    if text is None:
        return key_index(width=width)
    kind, name = resolve_key(text)
    if kind == "section":
        return key_index(name, width=width)
    derived, _ = read_forces()
    detail = key_detail(name, derived=derived, rule_text=rules(), configs=stack_configs(), md=md)
    return "\n".join(detail_block(detail)) if md else explain_text(detail, width)


# --- the page --------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _anchor(title: str) -> str:
    return "".join(ch for ch in title.lower().replace(" ", "-") if ch.isalnum() or ch in "-_")


def narrow_table(rows: Sequence[ConfigKey]) -> list[str]:
    """A section's table: key, type, default, the description's first sentence (cut so that a row
    stays under ``TABLE_WIDTH`` where the other cells allow)."""
    out = ["| key | type | default | summary |", "|---|---|---|---|"]
    for row in rows:
        cells = [f"`{row.key}`", type_words(row.info.annotation), f"`{default_short(row)}`"
                 if default_short(row) not in ("required", "derived", "none") else default_short(row)]
        used = len("| " + " | ".join(_cell(c) for c in cells) + " |  |")
        out.append("| " + " | ".join(_cell(c) for c in (*cells, summary(row.description, max(TABLE_WIDTH - used, 24))))
                   + " |")
    return out


def render_page(derived: Mapping[str, Any]) -> str:
    """docs/configuration.md for the model, the stack files and the stored derivation ``derived``."""
    from components.core.config.raw import SECRET_KEYS
    from components.core.config.reader import PROVIDER_NAMESPACES

    rule_text = rules()
    rows = config_keys()
    sections = section_descriptions()
    # The shipped stacks, the ones the derivation rendered (a stack file of one's own changes no page).
    shipped = sorted({case["stack"] for cases in derived.values() if isinstance(cases, list) for case in cases})
    configs = stack_configs(shipped or None)
    checked = ", ".join(f"`{k}`" for k in CHECKED_KEYS if k in derivable_keys())
    intro = [
        f"Generated from the typed config model (`components/core/config/raw.py`) by `{COMMAND}`; do not edit it "
        "by hand: `tests/test_config_reference.py` fails when it is stale.",
        "Keys live under `kimi-deploy:` in `stacks/Pulumi.<stack>.yaml`, or are set with `pulumi config set --path "
        "kimi-deploy:<key> <value>` (e.g. `kimi-deploy:storage.fsx.throughputPerTib 500`; a decimal needs `--type "
        "float`, since `--path` writes it as text). Every value is checked before anything is declared: a bad one "
        "stops the plan and `pulumi up` with one line naming the key, the value and what is allowed.",
        f"Each section has a table (key, type, default, summary) and then one block per key: its type, default, "
        "allowed values, the platforms and settings that read it, the value each stack of `stacks/` has (from its "
        "file or the default), what a change forces, where it is declared and checked, and an example. "
        f"`{EXPLAIN_COMMAND} KEY` prints the same block in a terminal; `{EXPLAIN_COMMAND}` lists the keys.",
        "**A change forces** is derived, not written by hand. For each key, the value shown was set on each stack of "
        "`stacks/` where it applies (grouped by effect; `in *setting*`: within one of the settings below, which put the "
        "stack where the key matters); the real program was rendered under the mock engine before and after "
        "(`scripts/ops/plan.py`), and the plan-diff engine (`scripts/ops/diff/`: the providers' replace-on-change rules) named "
        "what `pulumi up` then replaces, recycles (node groups rolled), disrupts in place (a stop/start, pods "
        "recreated, a new launch-template version), adds, removes or updates quietly. Changes `pulumi up` ignores "
        "(`ignore_changes`) are left out. Resources are named `Type name`; the full type tokens are in "
        f"`docs/configuration-forces.json`, which `{COMMAND} --derive` writes (a render per stack and change: too "
        f"slow for every test run). The test derives {checked} again on every run and checks that every key has a "
        "row in that file.",
        "Settings some changes were made in (*name*: keys set before and after the change):",
    ]
    out = ["# Configuration reference", ""]
    for paragraph in intro:
        out += [*_wrap(paragraph), ""]
    for name, values in SETTINGS.items():
        out += _wrap(f"- *{name}*: " + ", ".join(f"`{k}: {yaml_value(v)}`" for k, v in values.items()), indent="  ")
    out += ["", "## Contents", ""]
    titled = [(s, _section_title(s)) for s in sections]
    out += [f"- [{title}](#{_anchor(title)})" for _, title in titled]
    out += ["- [Secrets](#secrets)", "- [Other namespaces](#other-namespaces)", ""]

    def block(key: str) -> list[str]:
        return detail_block(key_detail(key, derived=derived, rule_text=rule_text, configs=configs))

    for section, title in titled:
        out += [f"## {title}", ""]
        if sections[section]:
            out += [*_wrap(sections[section]), ""]
        section_rows = [r for r in rows if r.section == section]
        out += [*narrow_table(section_rows), ""]
        for row in section_rows:
            out += block(row.key)
    out += [
        "## Secrets",
        "",
        *_wrap("Set with `pulumi config set --secret kimi-deploy:<key>` (the stack file holds only their ciphertext, "
               "`secure:`); never written in plain text in a stack file (the plan refuses it). The plan, its JSON and "
               "the diff show `[secret]` in their place."),
        "",
    ]
    for key in SECRET_KEYS:
        out += block(key)
    out += [
        "## Other namespaces",
        "",
        *_wrap("A stack file may also set these (`components/core/config/reader.py` checks the names; an unknown "
               "namespace or provider key is refused with a suggestion)."),
        "",
        *block(AWS_REGION),
    ]
    for namespace, keys in PROVIDER_NAMESPACES.items():
        if namespace == "pulumi":
            text = "the engine's own settings (`pulumi:tags`, ...): not checked."
        elif not keys:
            text = f"the {namespace} provider: no keys."
        else:
            text = f"the {namespace} provider's own settings: " + ", ".join(f"`{k}`" for k in keys) + "."
            if namespace == "aws":
                text += (" `aws:defaultTags` count against AWS's 50 tags per resource with the program's own, "
                         "and may not set a tag key the toolkit owns (" + ", ".join(f"`{k}`" for k in naming.TOOLKIT_TAG_KEYS)
                         + ": the sweeper and the expiry read them; components/core/naming.py). "
                         "`aws:insecure: true` and an `aws:endpoints` entry outside AWS's own hosts are warned in "
                         "the plan (config/reader.py provider_warnings).")
        out += _wrap(f"- `{namespace}:*`: {text}", indent="  ")
    return "\n".join(out) + "\n"


# --- the command ---------------------------------------------------------------------------------


def _shown(path: Path) -> str:
    """``path`` relative to the checkout when inside it (``docs/configuration.md``)."""
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def stale_reason(derived: Mapping[str, Any], settings: Mapping[str, Any], page: str | None) -> str | None:
    """Why the committed page or derivation is stale (one line), or None.

    - the derivation's settings are not ``SETTINGS``;
    - a key of the model (or ``aws:region``) has no row in the derivation, or a row names a key
      the model no longer has;
    - the page differs from ``render_page(derived)`` (keys, types, defaults, ranges, descriptions).
    """
    if json.loads(json.dumps(SETTINGS)) != settings:
        return f"{_shown(FORCES_PATH)} was derived with other settings than SETTINGS (run {COMMAND} --derive)"
    keys = derivable_keys()
    missing = [k for k in keys if k not in derived]
    if missing:
        return (f"{_shown(FORCES_PATH)} has no row for {', '.join(missing)} "
                f"(run {COMMAND} --derive {' '.join(missing)})")
    extra = [k for k in derived if k not in keys]
    if extra:
        return (f"{_shown(FORCES_PATH)} has rows for keys the model lacks: {', '.join(extra)} "
                f"(run {COMMAND} --derive)")
    if page != render_page(derived):
        return f"{_shown(DOC_PATH)} is stale (run {COMMAND})"
    return None


def make_parser() -> CliParser:
    """The command line (one-line usage errors, exit 2)."""
    parser = CliParser(
        prog=prog_name("scripts/dev/config_reference.py"),
        description="Write docs/configuration.md from the typed config model (components/core/config/raw.py) and the "
        "stored derivation of what each key's change forces (docs/configuration-forces.json).",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--derive", nargs="*", metavar="KEY",
        help="derive what a change forces again (a mock render per stack and change; it prints how many and the CPU "
        "time), for every key or the KEYs named, store it in docs/configuration-forces.json, then write the page",
    )
    mode.add_argument(
        "--check", action="store_true",
        help="write nothing; exit 1 with one line when the page or the stored derivation is stale",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Write, derive or check (see the module docstring). Returns the exit code."""
    args = make_parser().parse_args(argv)
    derived, settings = read_forces()
    if args.check:
        reason = stale_reason(derived, settings, DOC_PATH.read_text() if DOC_PATH.is_file() else None)
        if reason:
            print(f"stale: {reason}", file=sys.stderr)
            return EXIT_CHECK_FAILED
        return EXIT_OK
    if args.derive is not None:
        keys = args.derive or derivable_keys()
        unknown = [k for k in keys if k not in derivable_keys()]
        if unknown:
            raise UsageError(f"--derive: {', '.join(unknown)} is not a key of the model (keys: see {DOC_PATH.name})")
        start = time.process_time()
        fresh, deriver = derive(keys)
        cpu = time.process_time() - start
        derived = {k: (fresh[k] if k in fresh else derived[k]) for k in derivable_keys() if k in fresh or k in derived}
        FORCES_PATH.write_text(forces_document(derived))
        print(f"derived {len(keys)} keys with {deriver.renders} renders in {cpu:.1f} s CPU; "
              f"wrote {_shown(FORCES_PATH)}", file=sys.stderr)
    DOC_PATH.write_text(render_page(derived))
    rows = derivable_keys()
    print(f"wrote {_shown(DOC_PATH)}: {len(rows)} keys, {len(replacing_keys(derived))} whose change "
          f"replaces a resource, {len(SECRETS)} secrets", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(run_cli(main))
