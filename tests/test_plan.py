"""The offline plan: every stack renders, the JSON document has its keys, secrets never show,
bad config exits 2 with one line and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from components.plan_engine import PLACEHOLDER_PREFIX, SECRET_MASK
from scripts.ops import plan as plan_script
from tests.conftest import FIXED_NOW, REPO_ROOT, STACKS, TEST_SECRETS, plan_for, without_overlay_notice

NOW = FIXED_NOW.isoformat()


def run_plan(*args, cwd=REPO_ROOT):
    # The suite's engine overlay is set: plan names it first (stderr for JSON and files, the first
    # line of a table or Markdown: tests/test_operator_inputs.py); these tests look past it.
    return without_overlay_notice(subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "ops" / "plan.py"), *args], capture_output=True, text=True, cwd=cwd,
        timeout=120,
    ))


@pytest.mark.parametrize("name", STACKS)
def test_json_document_for_every_stack(name):
    doc = plan_script.build_plan_document(name, now=FIXED_NOW)
    assert doc["stack"] == name
    for key in ("stack", "target", "platform", "model", "sizing", "vllm", "resources", "outputs"):
        assert key in doc
    assert set(doc["model"]) >= {"id", "revision", "weights_bytes", "files"}
    assert set(doc["sizing"]) >= {
        "storage_kind", "storage_capacity_gib", "load_seconds", "startup_budget_seconds",
        "kv_cache_tokens", "download_seconds", "download_seconds_slow", "hub_rate",
    }
    assert doc["model"]["files"] == 112 and doc["model"]["weights_bytes"] == 1_560_000_000_000
    assert doc["sizing"]["download_seconds"] == 962 and doc["sizing"]["download_seconds_slow"] == 3_120
    roles = doc["vllm"]["roles"]
    assert roles and all({"name", "nodes", "argv", "env"} <= set(r) for r in roles)
    assert doc["resources"], "the program declared nothing"
    assert all({"type", "name", "inputs"} <= set(r) for r in doc["resources"])
    assert doc["secret_leaks"] == []
    json.dumps(doc)  # serializable


def test_cli_json_matches_document():
    proc = run_plan("--stack", "gb300", "--format", "json", "--now", NOW)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["target"] == "gb300" and [r["name"] for r in doc["vllm"]["roles"]] == ["leader", "worker"]
    assert doc["expires_at"] == "2026-12-02T12:00:00Z"  # 48 h TTL from the fixed clock


def test_default_stack_table_renders():
    proc = run_plan("--now", NOW)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "kimi-deploy plan: b300" in out and "vllm serve" in out and "--tool-call-parser kimi_k3" in out
    assert "142.42" in out and "3,060,948-4,532,228 tokens per copy" in out
    details = run_plan("--now", NOW, "--details")
    assert details.returncode == 0, details.stderr
    assert "apiKey" in details.stdout and "[secret]" in details.stdout  # rich must not eat the mask as markup


def test_markdown_renders():
    proc = run_plan("--stack", "mi355x", "--format", "markdown", "--now", NOW)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("> overlay: KIMI_DEPLOY_CONFIG_OVERLAY sets kimi-deploy:vllm.imageTag")
    assert proc.stdout.split("\n", 2)[2].startswith("### Plan: `mi355x`") and "```sh" in proc.stdout


@pytest.mark.parametrize("name", STACKS)
def test_secrets_never_appear(name):
    run = plan_for(name)
    text = json.dumps({"resources": [r.inputs for r in run.resources], "outputs": run.outputs})
    for value in TEST_SECRETS.values():
        assert value not in text
    assert run.secret_leaks == []
    assert run.outputs["apiKey"] == SECRET_MASK


def test_unset_secrets_get_placeholders_not_values():
    run = plan_for("b300", with_secrets=False)
    assert run.outputs["apiKey"] == SECRET_MASK


def test_secret_values_in_plain_inputs_are_reported():
    """The leak detector itself: a secret copied into a plain input is found."""
    import pulumi
    import pulumi_random as random

    from components.plan_engine import RecordingMocks

    mocks = RecordingMocks({"hfToken": "hf_leaky_value_123456"})
    pulumi.runtime.set_mocks(mocks, project="p", stack="s", preview=False)

    def body():
        random.RandomId("leak", byte_length=4, keepers={"token": "prefix-hf_leaky_value_123456"})
        random.RandomId("safe", byte_length=4, keepers={"token": pulumi.Output.secret("hf_leaky_value_123456")})
        return pulumi.Output.from_input(1)

    pulumi.runtime.test(body)()
    assert mocks.run.secret_leaks == [("hfToken", "leak", "keepers.token")]
    assert (
        mocks.run.named("safe").inputs["keepers"] == SECRET_MASK
        or mocks.run.named("safe").inputs["keepers"]["token"] == SECRET_MASK
    )


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--stack", "nope"], "--stack: 'nope' has no file"),
        (["--stack", "stacks/Pulumi.b300.yaml"], "--stack: 'stacks/Pulumi.b300.yaml' is not a stack name"),
        (["--stack", ""], "--stack: '' is not a stack name"),
        (["--stack", "b300", "--now", "yesterday"], "--now: 'yesterday' is not an ISO 8601 time"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, fragment):
    proc = run_plan(*args)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and fragment in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_stack_config_exits_2(tmp_path):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    text = (REPO_ROOT / "stacks" / "Pulumi.b300.yaml").read_text().replace("throughputPerTib", "x")
    text = text.replace("decodeContextParallelSize: 1 ", "decodeContextParallelSize: 3 ")
    (stacks / "Pulumi.bad.yaml").write_text(text)
    with pytest.raises(Exception) as info:
        plan_script.build_plan_document("bad", now=FIXED_NOW, stacks_dir=stacks)
    assert str(info.value).startswith("kimi-deploy:vllm.decodeContextParallelSize: 3")


def test_placeholder_marks_unset_secrets():
    from components.core.config import read_stack_config
    from components.plan_engine import run_program

    config = dict(read_stack_config("mi355x"))
    config["kimi-deploy:kubeconfig"] = {"secure": "v1:abc"}
    run = run_program(config, stack="mi355x", now=FIXED_NOW)
    text = json.dumps([r.inputs for r in run.resources])
    assert PLACEHOLDER_PREFIX not in text  # placeholders are secrets too: masked like real ones


def test_output_file_for_every_format(tmp_path):
    for fmt in ("table", "json", "markdown"):
        target = tmp_path / f"plan.{fmt}"
        proc = run_plan("--stack", "b300", "--format", fmt, "--now", NOW, "--output", str(target))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "" and target.read_text().strip()
        assert "vllm" in target.read_text()


def test_unwritable_output_is_one_line():
    proc = run_plan("--stack", "b300", "--format", "json", "--output", "/nonexistent-dir/plan.json")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "--output: '/nonexistent-dir/plan.json' cannot be written" in proc.stderr


def test_json_is_reproducible_and_sorted():
    first = run_plan("--stack", "gb300", "--format", "json", "--now", NOW)
    second = run_plan("--stack", "gb300", "--format", "json", "--now", NOW)
    assert first.returncode == second.returncode == 0
    assert first.stdout == second.stdout
    assert first.stderr == second.stderr == ""  # no asyncio teardown noise
    keys = [(r["type"], r["name"]) for r in json.loads(first.stdout)["resources"]]
    assert keys == sorted(keys)


def test_first_deploy_time_is_shown():
    doc = plan_script.build_plan_document("b300", now=FIXED_NOW)
    assert doc["sizing"]["first_deploy_seconds"] > doc["sizing"]["download_seconds"]
    # Hub at its measured 1.62 GB/s; the node copy at the time-to-ready model's rate (1.56 TB at 12 GB/s, NVMe-bound).
    assert [s["expected_seconds"] for s in doc["weight_sync"]] == [962, 130]
    text = plan_script.render_markdown(doc)
    assert "first deploy" in text and "publish-mirror 16 min" in text and "**Weight sync**" in text
    lines = "\n".join(line.plain for line in plan_script.table_lines(doc, 100))
    assert "first deploy 44 min-80 min; GPU wait USD 92-178: the hub download at 0.50-1.62 GB/s" in " ".join(lines.split())


def _variant(tmp_path, stack: str, name: str, old: str, new: str):
    """``stack``'s stack file with ``old`` replaced by ``new``, saved as stack ``name`` under ``tmp_path``."""
    text = (REPO_ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text()
    assert old in text
    (tmp_path / f"Pulumi.{name}.yaml").write_text(text.replace(old, new, 1))
    return tmp_path


def test_without_a_mirror_the_hub_download_is_priced_per_deploy_and_per_node(tmp_path):
    """New-user trial t233: gb300 with `storage.mirror.enabled: false` said "once: USD 70.20" for
    the NAT gateway, though every tray downloads the 1.56 TB on every deploy and every replacement."""
    stacks = _variant(tmp_path, "gb300", "t233", "enabled: true                        # the in-region S3 mirror",
                      "enabled: false")
    from components.core import cost as costmodel

    bill = plan_script.build_plan_document("t233", now=FIXED_NOW, stacks_dir=stacks)["bill"]
    once = plan_script.build_plan_document("gb300", now=FIXED_NOW)["bill"]
    assert once["hub_download_nodes"] == 0 and "; once: USD" in costmodel.bill_summary(once)
    nodes = bill["hub_download_nodes"]
    assert nodes == 2 and bill["one_time_usd"] == pytest.approx(nodes * once["one_time_usd"], abs=0.01)
    per_node = bill["one_time_usd"] / nodes
    assert (f"; per deploy: USD {bill['one_time_usd']:,.2f} (each of 2 GPU nodes downloads the weights from the hub "
            f"through NAT; USD {per_node:,.2f} more per replaced node)") in costmodel.bill_summary(bill)
    assert "once:" not in costmodel.bill_summary(bill)


def test_staging_on_a_reservation_bills_the_reservation(tmp_path):
    """New-user trial t761: b300-prod at `phase: stage` showed "GPU 0.00" and USD 0.63/h while its
    ODCR bills its term (USD 284.83/h at the list price) whether a node runs or not."""
    from components.core import cost as costmodel

    serve = plan_script.build_plan_document("b300-prod", now=FIXED_NOW)["bill"]
    env = "  kimi-deploy:environment: prod"
    stacks = _variant(tmp_path, "b300-prod", "t761", env, "  kimi-deploy:phase: stage\n" + env)
    doc = plan_script.build_plan_document("t761", now=FIXED_NOW, stacks_dir=stacks)
    assert doc["phase"] == "stage"
    bill = doc["bill"]
    gpu = [line for line in bill["lines"] if line["item"].startswith("GPU nodes")]
    serve_gpu = next(line for line in serve["lines"] if line["item"].startswith("GPU nodes"))
    assert len(gpu) == 1 and gpu[0]["usd_per_hour"] == serve_gpu["usd_per_hour"] > 280 and gpu[0]["keeps_billing"]
    assert gpu[0]["item"] == "GPU nodes (p6-b300.48xlarge, reserved: none running in this phase)"
    summary = costmodel.bill_summary(bill)
    assert f"GPU {serve_gpu['usd_per_hour']:,.2f} + " in summary and "GPU 0.00" not in summary
    assert bill["usd_per_hour"] > serve_gpu["usd_per_hour"]
