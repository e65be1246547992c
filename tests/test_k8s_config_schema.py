"""kubernetes.tolerations and kubernetes.nodeSelector are validated at config time against the
Kubernetes schema (the shipped fragment is the pinned kubernetes-validate schema) and the API
server's rules, naming the key; label, name and tag limits are checked before anything is declared."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest

from components.core import k8s_schema
from components.core.config import namespace_config, read_stack_config
from components.core.errors import ConfigError
from components.core.load import load_stack, parse_spec
from components.core.versions import KUBERNETES_VERSION
from tests.conftest import FIXED_NOW


def _parse(k8s_overrides: dict, stack: str = "b300-prod", stack_name: str | None = None):
    full = read_stack_config(stack)
    k8s = {**full.get("kimi-deploy:kubernetes", {}), **k8s_overrides}
    ns, secrets = namespace_config({**full, "kimi-deploy:kubernetes": k8s})
    return parse_spec(ns, stack=stack_name or stack, now=FIXED_NOW, secrets_set=secrets)


def _without_descriptions(value):
    if isinstance(value, dict):
        return {k: _without_descriptions(v) for k, v in value.items() if k not in ("description", "$schema", "$id")}
    if isinstance(value, list):
        return [_without_descriptions(v) for v in value]
    return value


def test_shipped_fragment_is_the_pinned_schema():
    """The fragment equals kubernetes-validate's schema (descriptions aside) for every version it
    lists, and those include the Kubernetes version the program deploys."""
    shipped = k8s_schema.scheduling_schema()
    assert KUBERNETES_VERSION in shipped["kubernetesVersions"]
    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    for version in shipped["kubernetesVersions"]:
        base = root / f"v{version}.0-local-strict"
        podspec = json.loads((base / "podspec-v1.json").read_text())
        tol = json.loads((base / "toleration-v1.json").read_text())
        assert shipped["nodeSelector"] == _without_descriptions(podspec["properties"]["nodeSelector"]), version
        assert shipped["toleration"] == _without_descriptions(tol), version
    assert shipped["toleration"]["additionalProperties"] is False
    assert "kubernetes-validate" in shipped["source"]


def test_valid_fields_pass_and_reach_the_pods():
    spec = _parse(
        {
            "tolerations": [
                {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
                {"key": "amd.com/gpu", "operator": "Exists"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ],
            "nodeSelector": {"example.com/pool": "gpu-a", "zone": ""},
        }
    )
    assert spec.config.kubernetes.tolerations[2]["tolerationSeconds"] == 300


@pytest.mark.parametrize(
    "field,value,key,needle",
    [
        (
            "tolerations",
            [{"key": "a", "tolerationSecond": 5}],
            "kubernetes.tolerations[0]",
            "Additional properties are not allowed ('tolerationSecond'",
        ),
        (
            "tolerations",
            [{"key": "a", "tolerationSeconds": "5", "effect": "NoExecute"}],
            "kubernetes.tolerations[0].tolerationSeconds",
            "is not of type 'integer', 'null'",
        ),
        ("tolerations", [{"key": "a", "operator": "In"}], "kubernetes.tolerations[0].operator", "allowed: Equal, Exists"),
        ("tolerations", [{"value": "x"}], "kubernetes.tolerations[0].operator", "must be Exists when the key is empty"),
        (
            "tolerations",
            [{"key": "a", "operator": "Exists", "value": "x"}],
            "kubernetes.tolerations[0].value",
            "must be empty when operator is Exists",
        ),
        (
            "tolerations",
            [{"key": "a", "effect": "NoScheduled"}],
            "kubernetes.tolerations[0].effect",
            "allowed: NoSchedule, PreferNoSchedule, NoExecute",
        ),
        (
            "tolerations",
            [{"key": "a", "effect": "NoSchedule", "tolerationSeconds": 5}],
            "kubernetes.tolerations[0].tolerationSeconds",
            "only allowed with effect NoExecute",
        ),
        ("tolerations", [{"key": "bad key!"}], "kubernetes.tolerations[0].key", "is not a label key"),
        (
            "tolerations",
            [{"key": "a", "value": "v" * 64}],
            "kubernetes.tolerations[0].value",
            "is 64 characters; a Kubernetes label value has at most 63",
        ),
        ("nodeSelector", {"pool": "x" * 64}, "kubernetes.nodeSelector.pool", "at most 63"),
        (
            "nodeSelector",
            {"Example.COM/pool": "a"},
            "kubernetes.nodeSelector.Example.COM/pool",
            "has a prefix that is not a DNS-1123 subdomain",
        ),
        ("nodeSelector", {"pool": 1}, "kubernetes.nodeSelector.pool", "is a number, not a string"),
    ],
)
def test_bad_fields_name_the_key(field, value, key, needle):
    with pytest.raises(ConfigError) as info:
        _parse({field: value})
    msg = str(info.value)
    assert msg.startswith(f"kimi-deploy:{key}: "), msg
    assert needle in msg and "\n" not in msg


def test_stack_name_longer_than_a_label_value_is_rejected():
    with pytest.raises(ConfigError, match=r"^--stack: 'x{64}' is 64 characters; a Kubernetes label value has at most 63"):
        _parse({}, stack_name="x" * 64)


def test_shipped_stacks_pass_every_limit():
    for name in ("b300", "b300-prod", "gb300", "mi355x"):
        assert load_stack(name, now=FIXED_NOW).stack == name


def test_tag_limits():
    from components.core.limits import AWS_TAGS_PER_RESOURCE, tags_problem

    assert tags_problem({f"k{i}": "v" for i in range(AWS_TAGS_PER_RESOURCE)}, reserved=1)[2].endswith(
        "exceed AWS's 50 tags per resource"
    )
    assert tags_problem({"k" * 129: "v"})[2] == "tag key is 129 characters; AWS allows 128"
    assert tags_problem({"k": "v" * 257})[2] == "tag value is 257 characters; AWS allows 256"
    assert tags_problem({"k" * 128: "v" * 256}) is None
