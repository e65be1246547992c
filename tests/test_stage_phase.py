"""``kimi-deploy:phase: stage``: the weights and what they need, no GPU, on every stack; the switch to
serve keeps every staged resource (same type, name and parent: the same URN)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from typing import Any

import pulumi
import pytest

from components.core.config import namespace_config, read_stack_config
from components.core.errors import ConfigError
from components.core.load import load_stack, parse_spec
from components.core.naming import SYSTEM_NODE_LABEL, SYSTEM_NODE_ROLE
from components.core.targets import INSTANCES, STAGING_INSTANCE, TARGETS
from components.plan_engine import run_program
from tests.conftest import FIXED_NOW, REFUSED_ENGINE_CONFIG, REFUSED_ENGINE_OVERLAY, STACKS, TEST_SECRETS

GPU_RESOURCE_NAMES = {t.gpu_resource_name for t in TARGETS.values()}
GPU_INSTANCE_TYPES = set(INSTANCES) | {t for target in TARGETS.values() for t in target.platforms.values()}
# On an existing cluster the stage needs a mirror the operator owns (config/phase.py).
EXISTING_MIRROR = {"enabled": True, "create": False, "bucketName": "team-weight-mirror", "region": "us-east-1"}
# ... and the credentials of the pods that publish to it (kubernetes.mirrorCredentials).
MIRROR_SECRET = {"secret": {"name": "team-mirror-keys"}}


def _config(stack: str, phase: str) -> dict[str, Any]:
    config = dict(read_stack_config(stack))
    config["kimi-deploy:phase"] = phase
    if not load_stack(stack, now=FIXED_NOW).profile.provisions_aws:
        config["kimi-deploy:storage"] = {**config["kimi-deploy:storage"], "mirror": EXISTING_MIRROR}
        config["kimi-deploy:kubernetes"] = {**config["kimi-deploy:kubernetes"], "mirrorCredentials": MIRROR_SECRET}
    return config


def _run(stack: str, phase: str, monkeypatch=None, **kwargs):
    return run_program(_config(stack, phase), stack=stack, secrets=TEST_SECRETS, now=FIXED_NOW, **kwargs)


def _strings(value: Any):
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)
    elif value is not None:
        yield str(value)


def _containers(value: Any):
    if isinstance(value, dict):
        for key in ("containers", "initContainers"):
            if isinstance(value.get(key), list):
                yield from value[key]
        for v in value.values():
            yield from _containers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _containers(v)


@pytest.mark.parametrize("stack", STACKS)
def test_a_stage_plan_declares_no_gpu_resource(stack):
    run = _run(stack, "stage")
    spec = run.context.spec
    assert spec.staging and run.outputs["phase"] == "stage"
    names = {(r.type, r.name) for r in run.resources}
    for r in run.resources:
        text = " ".join(_strings(r.inputs))
        assert not any(t in text.split() or f'"{t}"' in text for t in GPU_INSTANCE_TYPES), (r.type, r.name)
        assert r.inputs.get("instanceType") not in GPU_INSTANCE_TYPES, (r.type, r.name)
        for c in _containers(r.inputs):
            limits = {**(c.get("resources") or {}).get("limits", {}), **(c.get("resources") or {}).get("requests", {})}
            assert not set(limits) & GPU_RESOURCE_NAMES, (r.name, c["name"])
            assert list(c.get("command") or [])[:1] == ["python3"], (r.name, c["name"])  # the sync, never `vllm serve`
        assert r.type not in ("kubernetes:apps/v1:Deployment", "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet",
                              "kubernetes:helm.sh/v3:Release", "aws:ec2/placementGroup:PlacementGroup"), (r.type, r.name)
        assert r.type != "aws:ec2/launchTemplate:LaunchTemplate" or r.name == "eks-system-lt", r.name
    node_groups = [r for r in run.resources if r.type == "aws:eks/nodeGroup:NodeGroup"]
    assert all(r.inputs["labels"] == {SYSTEM_NODE_LABEL: SYSTEM_NODE_ROLE} for r in node_groups), node_groups
    assert ("aws:ec2/instance:Instance", "gpu-instance") not in names
    # ... and it does stage: the publish runs, on a stager instance or as the one Job.
    instances = [r for r in run.resources if r.type == "aws:ec2/instance:Instance"]
    jobs = [r for r in run.resources if r.type == "kubernetes:batch/v1:Job"]
    if spec.profile.serves_under_systemd:
        assert [r.inputs["instanceType"] for r in instances] == [STAGING_INSTANCE.instance_type] and not jobs
    else:
        assert not instances and [r.name for r in jobs] == ["weight-sync-publish-mirror"]
    assert run.outputs["mirrorCompleteMarker"].endswith(f"/{spec.revision}/.weights-complete.json")
    assert run.outputs["switchToServe"].endswith("pulumi config set kimi-deploy:phase serve && pulumi up")
    assert not run.secret_leaks


class _Parents:
    """Records (type, name) -> parent (type, name) of every resource a program declares."""

    def __init__(self, monkeypatch):
        self.parents: dict[tuple[str, str], tuple[str, str] | None] = {}
        original = pulumi.Resource.__init__

        def init(resource, t, name, *args, **kwargs):
            opts = kwargs.get("opts") if "opts" in kwargs else (args[2] if len(args) > 2 else None)
            parent = getattr(opts, "parent", None)
            self.parents[(t, name)] = (parent._type, parent._name) if parent is not None else None
            original(resource, t, name, *args, **kwargs)

        monkeypatch.setattr(pulumi.Resource, "__init__", init)

    def take(self) -> dict[tuple[str, str], tuple[str, str] | None]:
        out, self.parents = self.parents, {}
        return out


@pytest.mark.parametrize("stack", STACKS)
def test_the_switch_to_serve_keeps_every_staged_resource(stack, monkeypatch):
    """Every resource of the stage, except the stager and its children, is declared by serve with the
    same type, name and parent: the same URN, so `pulumi up` of serve adds the GPUs and changes no
    staged resource's identity (the mirror, FSx, the cluster, the network, IAM)."""
    recorder = _Parents(monkeypatch)
    stage_run = _run(stack, "stage")
    stage = recorder.take()
    serve_run = _run(stack, "serve")
    serve = recorder.take()
    stager = {key for key, parent in stage.items() if key[0] == "kimi-deploy:aws:Ec2Stager" or
              (parent is not None and parent[0] == "kimi-deploy:aws:Ec2Stager")}
    # The root stack resource is the run's own (the mock engine may register it once per process).
    shared = {k for k in set(stage) - stager if k[0] != "pulumi:pulumi:Stack"}
    missing = sorted(shared - set(serve))
    assert not missing, f"serve drops staged resources (a switch would delete them): {missing}"
    moved = sorted(k for k in shared if stage[k] != serve[k])
    assert not moved, f"parents differ between stage and serve (a new URN): {[(k, stage[k], serve[k]) for k in moved]}"
    assert len(shared) > 8  # the comparison covers the stack, not a handful of resources
    # Same inputs too, so serve neither updates nor replaces them; the one exception: on aws-eks the
    # publish Job moves from the system nodes to the GPU nodes (a new Job that finds the mirror
    # complete in seconds; a Job holds no data).
    inputs = {phase: {(r.type, r.name): json.dumps(r.inputs, sort_keys=True, default=str) for r in run.resources}
              for phase, run in (("stage", stage_run), ("serve", serve_run))}
    changed = sorted(k for k in inputs["stage"] if k in inputs["serve"] and inputs["stage"][k] != inputs["serve"][k])
    on_system_nodes = stage_run.context.spec.profile.stages_on_system_nodes
    expected = [("kubernetes:batch/v1:Job", "weight-sync-publish-mirror")] if on_system_nodes else []
    assert changed == expected
    # What serve adds is what needs a GPU (or serves): never a second mirror or network.
    added = set(serve) - set(stage)
    assert not any(t in ("kimi-deploy:aws:WeightMirror", "kimi-deploy:aws:Network", "aws:s3/bucket:Bucket") for t, _ in added)


def test_stage_is_allowed_while_the_engine_build_is_blocked_and_serve_is_not(monkeypatch):
    # A release known not to serve the model; the EKS API source replaced (the shipped example blocks
    # a stage too: tests/test_config.py).
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", REFUSED_ENGINE_OVERLAY)
    for stack in STACKS:
        run = _run(stack, "stage")  # as `pulumi up` runs it: no allow_blockers
        assert run.context.spec.blockers, stack
        with pytest.raises(ConfigError, match="cannot serve Kimi K3.1-Pro"):
            _run(stack, "serve")


def test_stage_without_a_mirror_is_refused_with_what_to_set():

    ns, secrets = namespace_config(read_stack_config("mi355x"))
    with pytest.raises(ConfigError, match=r"kimi-deploy:phase: 'stage' needs the S3 mirror \(storage.mirror.enabled is "
                       r"false\) for staging to fill: "
                       r"on platform kubernetes an existing bucket: storage.mirror \{enabled: true, create: false, "
                       r"bucketName, region\} and kubernetes.mirrorCredentials"):
        # mi355x ships without a mirror: the message says what one takes there, not only "enable it"
        parse_spec({**ns, "phase": "stage"}, stack="mi355x", now=FIXED_NOW, secrets_set=secrets)
    created = {**ns["storage"], "mirror": {"enabled": True}}
    with pytest.raises(ConfigError, match="storage.mirror.enabled: true needs an existing bucket on kubernetes"):
        parse_spec({**ns, "phase": "stage", "storage": created}, stack="mi355x", now=FIXED_NOW, secrets_set=secrets)
    created = {**ns["storage"], "mirror": {"enabled": True, "bucketName": "team-mirror"}}
    with pytest.raises(ConfigError, match="storage.mirror.bucketName: 'team-mirror' is a bucket kubernetes cannot create"):
        parse_spec({**ns, "phase": "stage", "storage": created}, stack="mi355x", now=FIXED_NOW, secrets_set=secrets)
    with pytest.raises(ConfigError, match="kimi-deploy:phase: 'later' is not allowed"):
        parse_spec({**ns, "phase": "later"}, stack="mi355x", now=FIXED_NOW, secrets_set=secrets)


def test_eks_stage_publishes_on_the_system_nodes_within_their_disk():
    from components.aws.cluster import SYSTEM_INSTANCE_TYPE, SYSTEM_ROOT_VOLUME_GIB
    from components.core.time_inputs import VLLM_IMAGE_UNPACKED_BYTES
    from components.k8s.weight_sync import STAGE_SYSTEM_NODE_WORKERS, stage_scratch_gib

    run = _run("b300-prod", "stage")
    job = next(r for r in run.resources if r.type == "kubernetes:batch/v1:Job")
    pod = job.inputs["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {SYSTEM_NODE_LABEL: SYSTEM_NODE_ROLE} and pod["tolerations"] == []
    container = pod["containers"][0]
    argv = container["command"]
    assert argv[argv.index("--workers") + 1] == str(STAGE_SYSTEM_NODE_WORKERS) and "--staging-dir" in argv
    scratch = next(v for v in pod["volumes"] if v["name"] == "staging")
    assert scratch == {"name": "staging", "emptyDir": {"sizeLimit": f"{stage_scratch_gib(run.context.spec)}Gi"}}
    # The staging files and the engine image fit the system node's root volume; the requests fit its 4 vCPU.
    assert stage_scratch_gib(run.context.spec) * 2**30 + VLLM_IMAGE_UNPACKED_BYTES.value < SYSTEM_ROOT_VOLUME_GIB * 2**30 * 0.95
    assert SYSTEM_INSTANCE_TYPE == "m7i.xlarge" and int(container["resources"]["requests"]["cpu"]) <= 4
    serve = _run("b300-prod", "serve")
    assert any(r.type == "aws:eks/nodeGroup:NodeGroup" and r.name == "eks-gpu" for r in serve.resources)


def _stager_user_data(run) -> str:
    instance = next(r for r in run.resources if r.type == "aws:ec2/instance:Instance")
    return base64.b64decode(instance.inputs["userDataBase64"]).decode()


def test_ec2_stager_publishes_then_terminates_itself():
    import yaml

    run = _run("b300", "stage")
    instance = next(r for r in run.resources if r.type == "aws:ec2/instance:Instance")
    assert instance.inputs["instanceInitiatedShutdownBehavior"] == "terminate"
    assert instance.inputs["metadataOptions"]["httpTokens"] == "required"
    text = _stager_user_data(run)
    doc = yaml.safe_load(text)
    files = {f["path"]: f["content"] for f in doc["write_files"]}
    unit = files["/etc/systemd/system/kimi-stage.service"]
    assert "ExecStartPost=/usr/bin/systemctl poweroff" in unit and "Restart=on-failure" in unit
    weights = files["/opt/kimi-deploy/weights.sh"]
    assert "kimi-weights: publish-mirror" in weights and "kimi-weights: node-copy" not in weights
    assert "--staging-dir" in weights and "kimi-weight-sync-node-copy" not in weights
    assert "/kimi-deploy/b300/stage-hub-token" in weights  # its own parameter: serve's GPU instance makes another
    assert "packages" not in doc  # its AMI contract installs docker and mdadm inside the retried chain
    policy = json.loads(next(r for r in run.resources if r.name == "stage-role-weight-mirror").inputs["policy"])
    writes = [s for s in policy["Statement"] if any("PutObject" in a for a in s["Action"] if isinstance(s["Action"], list))
              or s["Action"] == "s3:PutObject"]
    assert writes and all(f"/models/moonshotai/Kimi-K3.1-Pro/{run.context.spec.revision}/" in json.dumps(s["Resource"])
                          for s in writes)


@pytest.mark.skipif(shutil.which("cloud-init") is None, reason="cloud-init (Debian package) not installed")
def test_stager_user_data_passes_cloud_init_schema(tmp_path):
    path = tmp_path / "user-data"
    path.write_text(_stager_user_data(_run("b300", "stage")))
    proc = subprocess.run(["cloud-init", "schema", "--config-file", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_preflight_mirror_check_says_when_to_switch(moto_aws):
    import boto3

    from scripts.ops import preflight
    from scripts.ops._cli import PASS, WARN

    ns, secrets = namespace_config(read_stack_config("b300"))
    spec = parse_spec({**ns, "region": "us-east-1", "phase": "stage"}, stack="b300", now=FIXED_NOW, secrets_set=secrets)
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="stage-mirror")
    clients = preflight.AwsClients("us-east-1")
    check = preflight.check_mirror(spec, clients, "stage-mirror")
    assert check.status == WARN and "the stage's publish has not finished" in check.reason
    prefix = f"models/moonshotai/Kimi-K3.1-Pro/{spec.revision}"
    files = [{"path": f"f{i}", "size_bytes": 1} for i in range(spec.model.file_count)]
    for f in files:
        s3.put_object(Bucket="stage-mirror", Key=f"{prefix}/{f['path']}", Body=b"x")
    s3.put_object(Bucket="stage-mirror", Key=f"{prefix}/manifest.json", Body=json.dumps({"files": files}).encode())
    s3.put_object(Bucket="stage-mirror", Key=f"{prefix}/.weights-complete.json", Body=b"{}")
    check = preflight.check_mirror(spec, clients, "stage-mirror")
    assert check.status == PASS
    assert check.reason.endswith("staged; switch: pulumi config set kimi-deploy:phase serve && pulumi up")


# --- the plan: stage then serve beside a single `pulumi up` --------------------------------------


def _stage_then_serve(stack: str):
    from components.core.sizing import compute_sizing
    from components.core.time_to_ready import stage_then_serve
    from components.core.weights import SHAPE_BUCKET, sync_steps

    spec = load_stack(stack, now=FIXED_NOW)
    return spec, stage_then_serve(spec, compute_sizing(spec), sync_steps(spec, SHAPE_BUCKET if spec.config.storage.mirror.enabled
                                                                           else None))


@pytest.mark.parametrize("stack", ["b300", "b300-prod", "gb300"])
def test_the_gpu_wait_saved_is_the_hub_download(stack):
    spec, model = _stage_then_serve(stack)
    download = next(p for p in model.single_up.phases if p.name == "hub download -> mirror")
    # The hub at its measured 1.62 GB/s: about 16 min of GPU wait, not the 4.3 h of the 100 MB/s guess.
    assert model.gpu_seconds_saved == download.seconds and 900 < download.seconds < 1000
    assert [p.name for p in model.stage.phases][-1] == "hub download -> mirror"
    assert not any(p.name.startswith("hub download") for p in model.serve.phases)
    assert model.total_seconds == model.stage.total_seconds + model.serve.total_seconds
    staged_hours = (model.stage.total_seconds - model.stage.phases[0].seconds) / 3600
    assert model.staging_usd == round(staged_hours * model.staging_usd_per_hour, 2)
    if model.single_up.gpu_usd is not None:
        assert model.gpu_usd_saved == round(model.single_up.gpu_usd - model.serve.gpu_usd, 2) < 100
        assert model.net_usd_saved_slow > model.net_usd_saved
    reserved = spec.config.compute.capacity.type in ("odcr", "capacity-block")
    assert model.reservation_bills_anyway is reserved
    assert (model.as_json()["reservation_note"] is not None) is reserved


def test_ec2_staging_compute_is_the_stager_at_its_public_price():
    _, model = _stage_then_serve("b300")
    assert model.staging_usd_per_hour == STAGING_INSTANCE.usd_per_hour and "karpenter" in model.staging_source.lower()
    assert [p.name for p in model.stage.phases][:2] == ["infrastructure (no GPU)", "stager boot"]
    assert model.staging_usd < 5 < model.gpu_usd_saved


def test_no_mirror_nothing_to_stage_and_the_plan_says_so():
    from scripts.ops.plan import build_plan_document, render_markdown

    assert _stage_then_serve("mi355x")[1] is None
    doc = build_plan_document("mi355x", now=FIXED_NOW)
    assert doc["stage_then_serve"] is None and "nothing to stage" in render_markdown(doc)


def test_plan_document_carries_the_comparison_and_a_stage_is_deployable_while_blocked(monkeypatch, tmp_path):
    from scripts.ops.plan import build_plan_document, render_markdown, stage_then_serve_rows

    doc = build_plan_document("b300", now=FIXED_NOW)
    sts = doc["stage_then_serve"]
    assert doc["phase"] == "serve" and 30 < sts["gpu_usd_saved"] < 50 and sts["switch_at_seconds"] < sts["total_seconds"]
    assert sts["verdict"].startswith("staging first saves USD 37.61 net") and sts["pays"] is True
    rows = stage_then_serve_rows(doc)
    assert [r[0] for r in rows] == ["single `pulumi up`", "stage, then serve", "GPU wait saved"]
    assert rows[2][2] == f"{sts['gpu_usd_saved']:,.2f}"
    assert "mirrorCompleteMarker" in render_markdown(doc)
    monkeypatch.delenv("KIMI_DEPLOY_CONFIG_OVERLAY", raising=False)
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", json.dumps({**REFUSED_ENGINE_CONFIG, "kimi-deploy:phase": "stage"}))
    staged = build_plan_document("b300", now=FIXED_NOW)
    assert staged["phase"] == "stage" and staged["blockers"] and staged["deployable"] is True


def test_a_blocked_stack_in_stage_reads_as_deployable_everywhere(monkeypatch):
    """A new user staging a blocked stack (README, first day step 2) is told it is allowed: the
    table, --strict, plan --all and preflight agree with `pulumi up` (program.build_context)."""
    import os
    import sys

    from scripts.ops import plan
    from scripts.ops.preflight import check_deployable

    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", json.dumps({**REFUSED_ENGINE_CONFIG, "kimi-deploy:phase": "stage"}))
    cmd = [sys.executable, "-m", "scripts.cli", "plan", "--stack", "b300", "--strict", "--now", "2026-12-01T00:00:00Z"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "100"})
    assert run.returncode == 0, run.stderr
    assert "BLOCKED" not in run.stdout and "phase: stage: `pulumi up` stages the weights; serve is refused" in run.stdout
    doc = plan.build_plan_document("b300", now=FIXED_NOW)
    assert plan.verdict(doc) == "deployable (phase: stage; serve refused: kimi-deploy:vllm.imageTag)"
    assert "refuses the serve phase" in plan.render_markdown(doc)
    check = check_deployable(load_stack("b300", now=FIXED_NOW))
    assert check.status == "pass" and "serve is refused" in check.reason
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", json.dumps(REFUSED_ENGINE_CONFIG))
    assert check_deployable(load_stack("b300", now=FIXED_NOW)).status == "fail"


@pytest.mark.parametrize("stack", STACKS)
def test_a_stage_plan_passes_the_guardrails_and_none_of_it_is_gpu_capacity(stack):
    """The policy pack's own definition of GPU capacity (policy/rules.py is_gpu_resource) finds none,
    and every rule passes on the stage as on serve (encryption, IMDSv2, tags, expiry, ...)."""
    from policy import rules
    from tests.test_policy import plan_resources

    run = _run(stack, "stage")
    resources = rules.resolve_launch_templates(plan_resources(run))
    assert not [r.name for r in resources if rules.is_gpu_resource(r.type, r.props)]
    ctx = rules.RuleContext(secrets_masked=True, api_port=run.context.spec.config.vllm.port)
    violations = rules.check_resources(plan_resources(run), ctx)
    assert violations == [], "\n".join(f"{r}: {m}" for r, m in violations)


def test_a_measured_stager_boot_replaces_the_estimate():
    from components.core.sizing import compute_sizing
    from components.core.time_to_ready import stage_then_serve
    from components.core.weights import SHAPE_BUCKET, sync_steps

    ns, secrets = namespace_config(read_stack_config("b300"))
    ns["timeToReady"] = {"stagerBootSeconds": 95}
    spec = parse_spec({**ns, "region": "us-east-1"}, stack="b300", now=FIXED_NOW, secrets_set=secrets)
    model = stage_then_serve(spec, compute_sizing(spec), sync_steps(spec, SHAPE_BUCKET))
    boot = next(p for p in model.stage.phases if p.name == "stager boot")
    assert boot.seconds == 95 and boot.source == "measured (kimi-deploy:timeToReady.stagerBootSeconds)"


@pytest.mark.parametrize("stack", ["b300", "gb300", "b300-prod"])
def test_a_stage_plans_summary_shows_what_the_stage_creates_and_costs(stack, monkeypatch):
    """phase: stage creates no GPU node and no vLLM server: the summary says so, prices what the
    stage runs on (the stager, or the EKS system nodes), and marks the serve figures as such."""
    from scripts.ops.plan import build_plan_document, summary_rows, table_lines

    serve = dict(summary_rows(build_plan_document(stack, now=FIXED_NOW)))
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", json.dumps({"kimi-deploy:phase": "stage",
                                                                  "kimi-deploy:vllm": {"imageTag": "nightly-" + "0" * 40}}))
    doc = build_plan_document(stack, now=FIXED_NOW)
    rows = dict(summary_rows(doc, details=False))
    sts = doc["stage_then_serve"]
    assert rows["GPU nodes"] == f"none in this phase (serve adds {serve['GPU nodes']})"
    assert rows["phase"].startswith(f"stage: the weights (hub -> S3 mirror) on {sts['staging_compute']}")
    assert rows["cost"].startswith(f"USD {sts['staging_usd_per_hour']:.2f}/h for {sts['staging_compute']}; no GPU node")
    assert f"(serve: {serve['cost']}" in rows["cost"] or f"(serve: {serve['cost'].split('  (')[0]}" in rows["cost"]
    assert all(rows[k].startswith("at serve: ") for k in ("weight load", "startup budget", "KV cache"))
    text = "\n".join(line.plain for line in table_lines(doc, 200))
    assert "at phase: serve (not created by this stage)" in text
    if stack == "b300":
        assert rows["cost"].startswith(f"USD {STAGING_INSTANCE.usd_per_hour:.2f}/h for m6idn.4xlarge stager")
        assert "USD 142.42/h" not in rows["cost"].split("(serve:")[0]


# --- which commit serve loads (model.revision: a branch is resolved once, by staging) --------------

@pytest.mark.parametrize("stack", STACKS)
def test_the_plan_says_which_commit_serve_will_load(stack):
    from scripts.ops.plan import build_plan_document, render_markdown, summary_rows

    doc = build_plan_document(stack, now=FIXED_NOW)
    spec = load_stack(stack, now=FIXED_NOW)
    commit = doc["model"]["serve_commit"]
    row = dict(summary_rows(doc))["weights commit"]
    if spec.revision_is_commit:
        assert commit["commit"] == spec.revision and commit["marker"] is None
        assert row == f"{spec.revision} (model.revision pins it)"
    else:  # b300 and gb300 ship `main`: staging resolves it, serve reads the commit from the mirror's marker
        assert commit["commit"] is None and spec.config.storage.mirror.enabled
        marker = f"s3://<known after pulumi up>/models/{spec.hub_repo}/{spec.revision}/.weights-complete.json"
        assert commit["marker"] == marker
        key = f"models/{spec.hub_repo}/{spec.revision}/.weights-complete.json"
        assert row == f"the commit staging resolved: read from the mirror's {key} at serve time"
        assert any("is a branch, not a commit" in w for w in doc["warnings"])  # the warning stays
    assert f"| weights commit | {row.replace('<', '&lt;')} |" in render_markdown(doc)


def test_a_branch_without_a_mirror_is_resolved_by_every_node_copy():
    from components.core.weights import serve_commit

    ns, secrets = namespace_config(read_stack_config("mi355x"))
    ns["model"] = {**ns["model"], "revision": "main"}
    spec = parse_spec({**ns, "environment": "trial"}, stack="mi355x", now=FIXED_NOW, secrets_set=secrets)
    assert not spec.config.storage.mirror.enabled
    assert serve_commit(spec, None).summary == ("the commit 'main' points to when each node copies from the hub "
                                                "(no mirror records one)")


def test_the_stager_network_carries_the_measured_hub_rate():
    """The stager's baseline network (not its burst) carries the measured hub download in and the
    same out to S3; the c6id.2xlarge it replaces (3.125 Gbps) capped it at ~0.25 GB/s."""
    from components.core.time_inputs import HUB_DOWNLOAD_BYTES_PER_SECOND, S3_ACHIEVABLE_FRACTION

    assert STAGING_INSTANCE.network_gbps * 1e9 / 8 * S3_ACHIEVABLE_FRACTION.value >= HUB_DOWNLOAD_BYTES_PER_SECOND.value
    _, model = _stage_then_serve("b300")
    download = next(p for p in model.stage.phases if p.name == "hub download -> mirror")
    assert model.stage_hub.capped_by is None and "hub-bound" in download.source
    assert download.seconds == next(p for p in model.single_up.phases if p.name == "hub download -> mirror").seconds


def test_the_verdict_says_when_staging_first_does_not_pay():
    from components.core.sizing import compute_sizing
    from components.core.time_to_ready import stage_then_serve
    from components.core.weights import sync_steps

    ns, _ = namespace_config(read_stack_config("b300"))
    # GPUs at USD 1/h: the 16 min of GPU wait staging saves cost less than the stager's 22 min.
    ns["compute"] = {**ns.get("compute", {}), "usdPerHour": 1.0}
    spec = parse_spec(ns, stack="t", now=FIXED_NOW)
    model = stage_then_serve(spec, compute_sizing(spec), sync_steps(spec, "bucket"))
    assert model.pays is False and model.verdict.startswith("staging first does not pay: USD -")
    _, prod = _stage_then_serve("b300-prod")
    assert prod.verdict.startswith("staging first does not pay here: the reservation bills its whole term")
    assert "m7i.xlarge system node network caps the stage's hub download at 0.12 GB/s" in prod.verdict
