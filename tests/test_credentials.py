"""One list of credential shapes (components/core/credentials.py), and every consumer flags every
shape: the config check, the plan diff's redaction and the guardrails (ModelScope included: the
diff and the policy used to miss it)."""

from __future__ import annotations

import pytest

from components.core import credentials
from components.core.errors import ConfigError
from components.core.load import parse_spec
from policy import rules
from scripts.ops import plan_diff
from tests.conftest import FIXED_NOW, TEST_SECRETS
from tests.test_config import base

# One realistic sample per shape (fake values).
SAMPLES = {
    "huggingface-token": "hf_abcdefghijklmnopqrstuvwxyz0123",
    "modelscope-token": "ms-2f1c7d3e-9a4b-4c5d-8e6f-0123456789ab",
    "github-token": "ghp_abcdefghijklmnopqrstuvwxyz0123",
    "openai-style-api-key": "sk-abcdefghijklmnopqrstu",
    "aws-access-key-id": "AKIAABCDEFGHIJKLMNOP",
    "pem-private-key": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0123456789\n-----END RSA PRIVATE KEY-----",
    "kubeconfig-client-key": "client-key-data: LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQo=",
}
CLI_CTX = rules.RuleContext(secrets_masked=False)


def test_every_shape_has_a_sample():
    assert set(SAMPLES) == {s.name for s in credentials.SHAPES}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_the_core_finds_each_shape_by_name(name):
    text = f"some text {SAMPLES[name]} more"
    shape = credentials.find_credential(text)
    assert shape is not None and shape.name == name
    assert credentials.looks_like_credential(text)


@pytest.mark.parametrize(
    "text",
    [
        "kimi-k3.1-pro",
        "items-abcdefghijklmnopqrstuvwxyz",
        "ghost_rider",
        "sk-short",
        "AKIA-not-a-key",
        "client-key-data:",
        "moonshotai/Kimi-K3.1-Pro",
        "us-east-1-dfw-2a",
    ],
)
def test_ordinary_values_are_not_credentials(text):
    assert credentials.find_credential(text) is None and not credentials.looks_like_credential(text)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_config_rejects_each_shape_in_plain_config(name):
    cfg = base()
    cfg["model"] = {
        **cfg["model"],
        "servedModelName": SAMPLES[name].splitlines()[0] if name != "pem-private-key" else SAMPLES[name],
    }
    with pytest.raises(ConfigError) as info:
        parse_spec(cfg, stack="test", now=FIXED_NOW)
    message = str(info.value)
    assert message.startswith("kimi-deploy:model.servedModelName:") and "credentials in plain config" in message
    assert SAMPLES[name].splitlines()[0] not in message
    expected_key = credentials.find_credential(SAMPLES[name]).secret_key
    if expected_key:
        assert f"kimi-deploy:{expected_key}" in message
    else:  # no secret key holds this kind (AWS access key, GitHub token): none is named
        assert "which no kimi-deploy key holds; remove it" in message and "--secret" not in message


def test_a_modelscope_token_points_at_its_own_secret_key():
    cfg = base()
    cfg["owner"] = SAMPLES["modelscope-token"]
    with pytest.raises(ConfigError, match=r"kimi-deploy:modelscopeToken"):
        parse_spec(cfg, stack="test", now=FIXED_NOW)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_plan_diff_redacts_each_shape(name):
    out = plan_diff.redact(f"value: {SAMPLES[name]} end")
    for line in SAMPLES[name].splitlines():
        if len(line) > 12:
            assert line not in out
    assert "[redacted]" in out


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_policy_flags_each_shape_when_secrets_arrive_unwrapped(name):
    leaked = {"instanceType": "t3.micro", "tags": {"note": SAMPLES[name]}}
    assert rules.no_plain_secrets("aws:ec2/instance:Instance", leaked, "gpu", CLI_CTX)


def test_the_test_secrets_are_each_one_shape():
    """The secrets every plan test sets are recognised by shape (ModelScope's included), so the
    no-leak checks that rely on shapes cover each of them."""
    for key in ("hfToken", "modelscopeToken", "apiKey"):
        shape = credentials.find_credential(TEST_SECRETS[key])
        assert shape is not None and shape.secret_key == key, key
