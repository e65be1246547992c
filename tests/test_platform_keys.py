"""One rule for keys a platform does not read (components/core/config/platform_keys.py): every key
of the model, set on a stack of every platform, is refused exactly where the table says nothing
reads it, naming the platforms that do; and the table agrees with what the program does (the
stored derivation of what each key's change forces, docs/configuration-forces.json: a key accepted
on a stack changes a resource there, or only the plan's figures, for a stated reason)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from components.core.config import RawConfig, namespace_config, read_stack_config
from components.core.config.platform_keys import ANY_VALUE, KEY_READERS, explicit_settings, readers_of, setting
from components.core.errors import ConfigError
from components.core.load import parse_spec
from components.core.platforms import PLATFORM_PROFILES, PlatformProfile
from scripts.dev import config_reference as ref
from tests.conftest import FIXED_NOW

# A stack file of each platform (stacks/).
PLATFORM_STACKS = {"aws-ec2": "b300", "aws-eks": "b300-prod", "kubernetes": "mi355x"}
STACK_PLATFORMS = {"b300": "aws-ec2", "b300-prod": "aws-eks", "gb300": "aws-eks", "mi355x": "kubernetes"}
KEYS = [row.key for row in ref.config_keys()]
# Values for the keys the configuration reference has no probe for (one valid value only).
OTHER_VALUES: dict[str, Any] = {
    "model.profile": "kimi-k3.1-pro", "model.licenseAcknowledged": True, "compute.amiArchitecture": "x86_64",
    "compute.instanceType": None,
}
# Keys whose change moves only the plan's figures (time to ready, cost, expiry, warnings), never a
# resource input: a stored case of them may force nothing. Each with where the plan shows it.
FIGURES_ONLY: dict[str, str] = {
    "trialTtlHours": "the expiry, fixed at the first `pulumi up` (the expires-at tag ignores later changes)",
    "protect": "Pulumi's protect option on the data resources, not an input the diff compares",
    "compute.replicas": "with autoscaling, the initial count: the scaler owns the replica count afterwards",
    "compute.usdPerHour": "the plan's and cost's price per node-hour",
    "compute.capacity.usdPerHour": "the plan's and cost's price per node-hour",
    "prices": "the plan's and cost's unit prices (components/core/prices.py)",
    "compute.capacity.endsAt": "the plan's capacity-block warning and cost",
    "compute.capacity.blockInstances": "the plan's UltraServer block price and idle-tray warning",
    "storage.readGBps": "the plan's weight-load time (the startup budget stays the recipe's 3,600 s floor)",
    "timeToReady.infrastructureSeconds": "the plan's time to ready",
    "timeToReady.instanceBootSeconds": "the plan's time to ready",
    "timeToReady.imagePullSeconds": "the plan's time to ready",
    "timeToReady.copyGBps": "the plan's time to ready",
    "timeToReady.engineInitCachedSeconds": "the plan's time to ready",
    "timeToReady.stagerBootSeconds": "the plan's stage-then-serve figures",
    "vllm.kvCacheTokens": "the plan's KV cache capacity (a measured count replaces the engine-layout estimate)",
}


def base(stack: str) -> dict:
    ns, _ = namespace_config(read_stack_config(stack))
    return copy.deepcopy(ns)


# A section whose leaves are only valid beside a required sibling: a probe of one leaf sets the sibling too,
# so the config is well-formed and only the platform decides.
REQUIRED_SIBLINGS: dict[str, tuple[str, Any]] = {"kubernetes.mirrorCredentials.secret": ("name", "mirror-keys")}


def put(config: dict, key: str, value: Any) -> dict:
    node = config
    *parents, last = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    sibling = REQUIRED_SIBLINGS.get(".".join(parents))
    if sibling is not None:
        node.setdefault(*sibling)
    return config


def platform_error(config: dict) -> ConfigError | None:
    """The platform rule's error for ``config`` (None when parse_spec accepts it or refuses it for
    another reason)."""
    try:
        parse_spec(config, stack="test", now=FIXED_NOW)
    except ConfigError as err:
        text = str(err)
        return err if (" is read only on " in text or " is read only with " in text or " needs aws-" in text
                       or " needs kubernetes" in text) else None
    return None


def probe_value(key: str, stack: str) -> Any:
    """A valid other value of ``key`` (the configuration reference's first probe candidate)."""
    if key in OTHER_VALUES:
        return OTHER_VALUES[key]
    probe = ref.PROBES[key][0]
    candidate = probe.candidates[0]
    if callable(candidate):
        return candidate(copy.deepcopy(setting(_raw(stack), key.replace("[]", ""))) if "[]" not in key else None)
    return candidate


def _raw(stack: str) -> RawConfig:
    return RawConfig.model_validate(base(stack))


# --- the table ------------------------------------------------------------------------------------


def test_every_row_names_a_key_or_section_of_the_model_and_profile_fields():
    sections = {".".join(k.split(".")[:n]) for k in KEYS for n in range(1, k.count(".") + 1)}
    bools = {name for name, f in PlatformProfile.__dataclass_fields__.items() if f.type in (bool, "bool")}
    for rule in KEY_READERS:
        assert rule.key in set(KEYS) | sections, rule.key
        assert set(rule.reads) <= bools, rule
        assert all(other in KEYS for other, _ in rule.when), rule
        assert rule.platforms() or not rule.reads, f"{rule.key}: no platform reads it"


def test_the_issues_examples_are_refused_naming_the_platforms_that_read_them():
    cases = [
        ("mi355x", "kubernetes.serviceType", "internal-nlb", "needs aws-eks", "may make a public one"),
        ("b300-prod", "compute.weightsRetry.attempts", 5, "is read only on aws-ec2", "not aws-eks"),
        ("mi355x", "compute.weightsRetry.delaySeconds", 60, "is read only on aws-ec2", "not kubernetes"),
        ("b300", "kubernetes.adminRoleArns", ["arn:aws:iam::123456789012:role/a"], "is read only on aws-eks", "aws-ec2"),
        ("mi355x", "kubernetes.eksSupportType", "EXTENDED", "is read only on aws-eks", "not kubernetes"),
        ("b300", "kubernetes.nodeSelector", {"pool": "gpu"}, "is read only on aws-eks, kubernetes", "not aws-ec2"),
        ("mi355x", "network.allowedCidrs", ["10.0.0.0/8"], "is read only on aws-ec2, aws-eks", "kubernetes.allowedCidrs"),
        ("b300", "storage.mirror.endpointUrl", "http://minio:9000", "is read only on aws-eks, kubernetes", "not aws-ec2"),
        ("gb300", "storage.fsx.throughputPerTib", 500, "is read only with storage.kind fsx or nvme-from-fsx",
         "storage.kind is nvme"),
        ("b300", "storage.kind", "fsx", "needs aws-eks", "the EC2 boot mounts no file system"),
        ("b300", "storage.kind", "nvme-from-fsx", "needs aws-eks", "not aws-ec2"),
        ("mi355x", "compute.capacity.type", "odcr", "is read only on aws-ec2, aws-eks", "not kubernetes"),
        ("mi355x", "compute.capacity.type", "on-demand", None, None),  # the default: changes nothing, misleads no one
        ("b300", "timeToReady.stagerBootSeconds", 1.0, None, None),  # read there
        ("gb300", "timeToReady.stagerBootSeconds", 300.0, "is read only on aws-ec2", "stager"),
        ("b300-prod", "kubernetes.clusterCidrs", ["10.244.0.0/16"], "is read only on kubernetes", "not aws-eks"),
        ("gb300", "autoscaling.maxReplicas", 3, "is read only with autoscaling.enabled true", "is false"),
    ]
    for stack, key, value, *fragments in cases:
        cfg = put(base(stack), key, value)
        err = platform_error(cfg)
        if fragments[0] is None:
            assert err is None, err
            continue
        assert err is not None and err.key == f"kimi-deploy:{key}", (stack, key, err)
        for fragment in fragments:
            assert fragment in str(err), str(err)


@pytest.mark.parametrize("key", [k for k in KEYS if "[]" not in k])
def test_every_key_on_a_stack_of_every_platform(key):
    """Each key, set to a valid value on each platform's stack: the platform rule refuses it exactly
    where its row says no setting makes the platform read it, with the key and the readers named;
    where the platform reads it, the rule is silent (other checks may still have their say)."""
    for platform, stack in PLATFORM_STACKS.items():
        value = probe_value(key, stack)
        if value is None:
            continue
        rule = readers_of(key, value)
        cfg = put(base(stack), key, value)
        err = platform_error(cfg)
        reads = rule is None or rule.read_by(PLATFORM_PROFILES[platform])
        if reads:
            if err is not None and err.key == f"kimi-deploy:{key}":
                assert " is read only with " in str(err), str(err)  # read here, with another setting
                assert rule is not None and rule.when
            continue
        assert err is not None, f"{key}={value!r} on {stack} ({platform}) was accepted; the table says nothing reads it"
        section = key.rsplit(".", 1)[0]
        sibling = [f"kimi-deploy:{section}.{REQUIRED_SIBLINGS[section][0]}"] if section in REQUIRED_SIBLINGS else []
        assert err.key in [f"kimi-deploy:{key}", *sibling], str(err)  # the first leaf of the section set, in field order
        assert all(name in str(err) for name in rule.platforms()), str(err)  # type: ignore[union-attr]


def test_a_section_is_walked_to_its_leaves_and_empty_values_are_not_settings():
    raw = RawConfig.model_validate({**base("b300"), "compute": {"capacity": {}, "weightsRetry": {"attempts": 2}},
                                    "kubernetes": {"allowedCidrs": [], "serviceType": "ClusterIP"}})
    keys = dict(explicit_settings(raw))
    assert keys["compute.weightsRetry.attempts"] == 2
    assert "kubernetes.allowedCidrs" not in keys and not any(k.startswith("compute.capacity") for k in keys)
    assert "kubernetes.serviceType" not in keys  # its default: no setting
    assert readers_of("compute.capacity.reservationId") is readers_of("compute.capacity")
    assert readers_of("kubernetes.serviceType", "ClusterIP").key == "kubernetes"  # type: ignore[union-attr]
    assert readers_of("kubernetes.serviceType", "internal-nlb").value == "internal-nlb"  # type: ignore[union-attr]
    assert readers_of("vllm.port") is None and ANY_VALUE is not None


# --- the table against what the program does -------------------------------------------------------


def _stored_cases() -> list[tuple[str, dict[str, Any]]]:
    derived, _ = ref.read_forces()
    return [(key, case) for key, cases in derived.items() if isinstance(cases, list) for case in cases]


def test_every_stored_change_is_accepted_on_its_platform_and_shows_an_effect():
    """The stored derivation (docs/configuration-forces.json) holds, per key, a change made on each
    stack where the program accepted it and what `pulumi up` would then do. A change that forces
    nothing there is a key that stack's platform (or setting) does not read, unless it only moves the
    plan's figures (``FIGURES_ONLY``, each with its reason); and no stored change is one the
    platform rule now refuses (the derivation is current)."""
    silent = []
    for key, case in _stored_cases():
        if not case["forces"] and key not in FIGURES_ONLY:
            silent.append(f"{key} on {case['stack']}: {json.dumps(case['change'])}")
        cfg = base(case["stack"])
        for other, value in {**ref.SETTINGS.get(case.get("base") or "", {}), **case["change"]}.items():
            if ":" not in other and value is not None:
                put(cfg, other, value)
        err = platform_error(cfg)
        assert err is None, f"stored {key} on {case['stack']} is refused now ({err}): re-derive it"
    assert not silent, f"accepted changes that force nothing (add a row to KEY_READERS or a reason): {silent}"
    assert {STACK_PLATFORMS[case["stack"]] for _, case in _stored_cases()} == set(PLATFORM_STACKS)
