"""The plan says what is real: provider-computed values show as known after `pulumi up`, shipped
example values are flagged until replaced, wording and units are consistent."""

from __future__ import annotations

import json
import re

import pytest

from components.core.config import STACKS_DIR
from components.core.errors import ConfigError
from components.core.examples import SHIPPED_EXAMPLE_VALUES, example_value_blockers
from components.core.load import parse_spec
from components.plan_engine import KNOWN_AFTER_UP, MOCK_ACCOUNT_ID
from scripts.ops import plan as plan_script  # noqa: E402
from tests.conftest import FIXED_NOW, STACKS

# Mock values the engine invents; none may reach the plan document as if real.
MOCK_FRAGMENTS = (
    "10.42.1.10",
    "gpu-instance-id",
    "mirror-bucket-a1b2c3d",
    "ami-0mock",
    "fs-id",
    "net-vpc-id",
    MOCK_ACCOUNT_ID,
    ".fsx.us-east-1.amazonaws.com",
)


@pytest.fixture(scope="module")
def docs():
    return {name: plan_script.build_plan_document(name, now=FIXED_NOW) for name in STACKS}


@pytest.mark.parametrize("name", STACKS)
def test_no_mock_value_is_shown_as_real(docs, name):
    doc = docs[name]
    text = json.dumps({"resources": doc["resources"], "outputs": doc["outputs"], "weight_sync": doc["weight_sync"]})
    for fragment in MOCK_FRAGMENTS:
        assert fragment not in text, f"{name}: mock value {fragment} shown as real"
    assert None not in [v for k, v in doc["outputs"].items() if k not in ("gpuUsdPerHour",)]


def test_computed_outputs_are_marked_and_known_ones_are_not(docs):
    ec2 = docs["b300"]["outputs"]
    assert ec2["privateEndpoint"] == f"http://{KNOWN_AFTER_UP}:8000/v1"
    assert ec2["instanceId"] == KNOWN_AFTER_UP and ec2["mirrorBucket"] == KNOWN_AFTER_UP
    assert f"--target {KNOWN_AFTER_UP} " in ec2["ssmSessionCommand"]
    assert ec2["apiKeyParameter"] == "/kimi-deploy/b300/vllm-api-key" and ec2["availabilityZone"] == "us-east-1a"
    eks = docs["b300-prod"]["outputs"]
    assert eks["loadBalancerHostname"] == KNOWN_AFTER_UP and eks["mirrorBucket"] == KNOWN_AFTER_UP
    assert eks["clusterName"] == "kimi-deploy-b300-prod"  # set by the program: known now


def test_table_shows_the_marker():
    import io

    out = io.StringIO()
    plan_script.render_table(plan_script.build_plan_document("b300", now=FIXED_NOW), file=out, details=True)
    assert f"http://{KNOWN_AFTER_UP}:8000/v1" in out.getvalue() and "10.42.1.10" not in out.getvalue()


def test_every_shipped_example_value_is_in_a_stack_file_and_flagged(monkeypatch):
    from components.core.config.stack_file import CONFIG_OVERLAY_ENV

    monkeypatch.setenv(CONFIG_OVERLAY_ENV, "")  # the stack files as shipped (no stand-ins)
    texts = {p.name: p.read_text() for p in STACKS_DIR.glob("Pulumi.*.yaml")}
    shipped: dict[str, dict] = {}
    for key, examples in SHIPPED_EXAMPLE_VALUES.items():
        for value in examples:
            holders = [n for n, t in texts.items() if value in t]
            assert holders, f"{key} {value} is in no stack file: drop it from SHIPPED_EXAMPLE_VALUES"
            for holder in holders:
                stack = holder[len("Pulumi."):-len(".yaml")]
                if stack not in shipped:
                    shipped[stack] = plan_script.build_plan_document(stack, now=FIXED_NOW)
                # Refused by `pulumi up` in every phase (the plan renders and says so), never only warned about.
                flagged = [b for b in shipped[stack]["blockers"] if value in b and "example value shipped in stacks/" in b]
                assert len(flagged) == 1 and "\n" not in flagged[0], (stack, value)
                assert shipped[stack]["deployable"] is False, stack


def test_a_replaced_value_is_not_flagged():
    assert example_value_blockers({"model.revision": "0" * 40, "compute.capacity.reservationId": "cr-0fedcba9876543210"}) == []


def test_summary_wording(docs):
    rows = dict(plan_script.summary_rows(docs["b300-prod"]))
    assert rows["GPU nodes"].startswith("2x p6-b300.48xlarge = 2 copies x 1 node x 8 GPUs")
    assert "copys" not in json.dumps(rows)
    assert rows["storage"] == "nvme: 28,312 GiB available, 1,599 GiB needed"  # no FSx: none named
    assert rows["startup budget"].startswith("60 min (3,600 s)")
    assert rows["platform / env"] == "aws-eks / prod  (us-east-1, AZ us-east-1c)"
    for text in rows.values():
        assert not re.search(r"\d{4,} (GiB|s|files|tokens)\b", text), text  # thousands separated


def test_booleans_in_messages_are_yaml_booleans():
    with pytest.raises(ConfigError) as info:
        parse_spec({"target": "b300", "platform": "aws-eks", "environment": "trial", "owner": "me", "region": "us-east-1",
                    "network": {"apiServerPrivateOnly": True},
                    "model": {"licenseAcknowledged": True}}, stack="t", now=FIXED_NOW)
    assert ": true was replaced by network.apiServerAccess" in str(info.value)


def test_cost_how_column_shows_quantities_and_unit_prices(monkeypatch):
    from scripts.ops import cost as cost_script

    captured = {}
    monkeypatch.setattr(cost_script, "print_table", lambda title, columns, rows, **kw: captured.update(rows=list(rows)))
    assert cost_script.main(["--stack", "b300-prod"]) == 0
    how = {item: text for item, _, text in captured["rows"]}
    assert how["API cost per task"] == (
        "0.42M uncached in x 13.00 + 3.80M cached in x 1.30 + 0.22M out x 68.00 RMB/1M tokens = 5.50 + 4.95 + 15.13 RMB"
    )
    assert how["API cost, 1,000 tasks/month"].startswith("1,000 tasks x 25.57 RMB; ")
    # The whole bill (components/core/prices.py): the GPUs, then every other billable line with its quantity.
    assert how["Self-hosted per hour"].startswith("GPU 2x p6-b300.48xlarge = 284.83 USD/h (on-demand list price")
    assert "+ the rest of the bill" in how["Self-hosted per hour"]
    assert how["  NAT gateway, per gateway"].startswith("1 x USD 0.045/hour; ")
    assert how["Self-hosted per month"].startswith("285.50 USD/h x 730 h; ")


def test_markdown_keeps_the_marker_visible(docs):
    """GitHub hides `<word ...>` outside code spans as an HTML tag: the marker is escaped there."""
    text = plan_script.render_markdown(docs["b300-prod"])
    for line in text.splitlines():
        outside_code = re.sub(r"`[^`]*`", "", line)
        assert "<known" not in outside_code, line
    assert "bucket=&lt;known after pulumi up>" in text and f"`{KNOWN_AFTER_UP}`" in text
    assert "| gpuUsdPerHour | `284.832` |" in text
    assert "`(none)`" in plan_script.render_markdown(docs["gb300"])
