"""The time-to-ready model (components/core/time_to_ready.py): phases add up, every input has a
source, measured overrides replace estimates, the b300 repeat trial meets its goal on paper."""

from __future__ import annotations

import pytest

from components.core import time_inputs
from components.core import time_to_ready as ttr
from components.core.config import namespace_config, read_stack_config
from components.core.load import load_stack, parse_spec
from components.core.sizing import compute_sizing
from components.core.targets import INSTANCES, TARGETS
from components.core.weights import sync_steps
from tests.conftest import FIXED_NOW, STACKS

WEIGHTS = 1_560_000_000_000


def _model(spec):
    bucket = "bucket" if spec.config.storage.mirror.enabled else None
    return ttr.time_to_ready(spec, compute_sizing(spec), sync_steps(spec, bucket))


def _spec_with(stack: str, **time_to_ready):
    ns, _ = namespace_config(read_stack_config(stack))
    ns["timeToReady"] = time_to_ready
    return parse_spec(ns, stack="t", now=FIXED_NOW)


@pytest.mark.parametrize("stack", STACKS)
def test_phases_add_up_along_the_critical_path(stack):
    model = _model(load_stack(stack, now=FIXED_NOW))
    assert set(model.as_json()) == set(ttr.SCENARIOS)
    for name, scenario in model.scenarios.items():
        phases = scenario.phases
        assert scenario.total_seconds == max(p.end_seconds for p in phases), name
        critical = sorted((p for p in phases if p.on_critical_path), key=lambda p: p.start_seconds)
        # The critical path is a gap-free chain from 0 to the total ...
        assert critical[0].start_seconds == 0 and critical[-1].end_seconds == scenario.total_seconds
        for a, b in zip(critical, critical[1:], strict=False):
            assert b.start_seconds == a.end_seconds, (name, a.name, b.name)
        assert sum(p.seconds for p in critical) == scenario.total_seconds
        # ... and every phase off it ends no later than the phase after it starts.
        for p in phases:
            assert p.seconds >= 0 and p.start_seconds >= 0
            if not p.on_critical_path:
                assert p.end_seconds <= scenario.total_seconds


def test_overlapping_phases_overlap():
    """The engine-cache restore runs beside the weight copy (same start, off the critical path)."""
    repeat = _model(load_stack("b300", now=FIXED_NOW)).scenarios["repeat_trial"]
    by_name = {p.name: p for p in repeat.phases}
    restore, copy = by_name["engine cache restore"], by_name["weight copy mirror -> NVMe"]
    assert restore.start_seconds < copy.end_seconds and copy.start_seconds < restore.end_seconds
    assert not restore.on_critical_path and copy.on_critical_path


def test_json_shape_is_exact():
    doc = _model(load_stack("b300", now=FIXED_NOW)).as_json()
    assert list(doc) == ["first_deploy", "repeat_trial", "replaced_node"]
    for scenario in doc.values():
        assert set(scenario) == {"total_seconds", "gpu_usd", "phases"}
        assert isinstance(scenario["total_seconds"], int) and isinstance(scenario["gpu_usd"], float)
        for phase in scenario["phases"]:
            assert set(phase) == {"name", "start_seconds", "seconds", "source", "on_critical_path"}
            assert isinstance(phase["on_critical_path"], bool)


def test_every_constant_has_a_source():
    assert time_inputs.FACTS
    for name, fact in time_inputs.FACTS.items():
        assert fact.source.strip(), name
        assert fact.value >= 0, name
    for name in ("b300", "gb300", "mi355x"):
        inst = INSTANCES[TARGETS[name].platforms[next(iter(TARGETS[name].platforms))]]
        assert inst.network_gbps and inst.network_source not in ("", "unknown"), name
        assert inst.nvme_write_bytes_per_second and inst.nvme_write_source not in ("", "unknown"), name


@pytest.mark.parametrize("stack", STACKS)
def test_every_phase_has_a_source(stack):
    model = _model(load_stack(stack, now=FIXED_NOW))
    for scenario in model.scenarios.values():
        for p in scenario.phases:
            assert p.source.strip(), p.name


def test_estimates_are_labelled():
    assert time_inputs.ENGINE_INIT_COLD_SECONDS.is_estimate and time_inputs.IMAGE_PULL_BYTES_PER_SECOND.is_estimate
    assert not time_inputs.S3_CONNECTION_GBPS.is_estimate and not time_inputs.S3_ACHIEVABLE_FRACTION.is_estimate
    first = _model(load_stack("b300", now=FIXED_NOW)).scenarios["first_deploy"]
    engine = next(p for p in first.phases if p.name.startswith("engine init"))
    assert engine.source.startswith("estimate")


def test_overrides_replace_estimates():
    base = _model(load_stack("b300", now=FIXED_NOW))
    spec = _spec_with("b300", imagePullSeconds=42, engineInitSeconds=1234, engineInitCachedSeconds=77,
                      copyGBps=2.5, infrastructureSeconds=11, instanceBootSeconds=13)
    model = _model(spec)
    first = {p.name: p for p in model.scenarios["first_deploy"].phases}
    repeat = {p.name: p for p in model.scenarios["repeat_trial"].phases}
    cached = repeat  # aws-ec2 with a mirror: the boot chain restores the engine caches
    assert first["image pull"].seconds == 42
    assert first["image pull"].source == "measured (kimi-deploy:timeToReady.imagePullSeconds)"
    assert first["engine init (cold)"].seconds == 1234 and "engineInitSeconds" in first["engine init (cold)"].source
    assert cached["engine init (cached)"].seconds == 77 and "engineInitCachedSeconds" in cached["engine init (cached)"].source
    mi355x = _model(_spec_with("mi355x", engineInitSeconds=1234))  # kubernetes platform: no restore, cold
    assert {p.name: p for p in mi355x.scenarios["repeat_trial"].phases}["engine init (cold)"].seconds == 1234
    assert first["infrastructure"].seconds == 11 and first["instance boot"].seconds == 13
    copy = repeat["weight copy mirror -> NVMe"]
    assert copy.seconds == -(-spec.model.weights_bytes // int(2.5e9)) and "copyGBps" in copy.source
    assert model.scenarios["repeat_trial"].total_seconds != base.scenarios["repeat_trial"].total_seconds
    # The startup budget follows the measured cold engine init.
    assert compute_sizing(spec).startup_budget_seconds >= 2 * 1234


def test_override_must_be_positive():
    from components.core.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        _spec_with("b300", copyGBps=0)
    assert "timeToReady.copyGBps" in str(info.value)


def test_copy_rate_is_the_minimum_of_its_bounds():
    spec = load_stack("b300", now=FIXED_NOW)
    rate = time_inputs.mirror_copy_rate(spec)
    inst = spec.instance
    network = inst.network_gbps * 1e9 / 8 * time_inputs.S3_ACHIEVABLE_FRACTION.value
    assert rate.bytes_per_second == min(network, inst.nvme_write_bytes_per_second, 128 * 5e9 / 8)
    assert rate.bound == "nvme-write"
    # The old unsourced 500 MB/s is gone: the copy runs at tens of times that.
    assert rate.bytes_per_second > 10 * 500e6


def test_b300_repeat_trial_goal_on_paper():
    """The goal is judged on what the boot chain does: on aws-ec2 it restores the engine caches
    (userdata engine-cache units), so the repeat trial starts cached and meets 15 minutes on paper."""
    model = _model(load_stack("b300", now=FIXED_NOW))
    assert model.goal_seconds == 900
    assert model.repeat_trial_after_running_seconds <= 900 and model.goal_met
    names = [p.name for p in model.scenarios["repeat_trial"].phases]
    assert "engine cache restore" in names and "engine init (cached)" in names
    assert model.engine_cache_repeat_trial is None  # nothing to show beside: it is the scenario


def test_kubernetes_platform_starts_cold_and_shows_the_cached_start_beside():
    """On the kubernetes platform the pods do not restore the caches (nothing is granted the right
    to save there): cold in the scenarios, cached as an alternative where a mirror exists."""
    ns, _ = namespace_config(read_stack_config("mi355x"))
    ns["storage"] = {**ns["storage"], "mirror": {"enabled": True, "create": False, "bucketName": "existing-mirror",
                                                 "region": "us-east-1"}}
    ns["kubernetes"] = {**ns["kubernetes"], "mirrorCredentials": {"secret": {"name": "mirror-keys"}}}
    model = _model(parse_spec(ns, stack="t", now=FIXED_NOW))
    assert all("(cached)" not in p.name for p in model.scenarios["repeat_trial"].phases)
    alt = model.engine_cache_repeat_trial
    assert alt is not None and alt.total_seconds < model.scenarios["repeat_trial"].total_seconds


@pytest.mark.parametrize("stack", ["gb300", "b300-prod"])
def test_aws_eks_pods_restore_between_the_copy_and_the_load(stack):
    """aws-eks: the restore is an init container after the weight-sync one, so it follows the copy
    and vLLM (the load, then the cached engine init) follows it; no alternative is shown."""
    model = _model(load_stack(stack, now=FIXED_NOW))
    for name in ("repeat_trial", "replaced_node"):
        phases = {p.name: p for p in model.scenarios[name].phases}
        copy = next(p for n, p in phases.items() if n.startswith("weight copy"))
        restore = phases["engine cache restore"]
        assert restore.start_seconds == copy.end_seconds and restore.on_critical_path
        assert phases["weight load"].start_seconds == restore.end_seconds
        assert "engine init (cached)" in phases and "engine init (cold)" not in phases
    assert "engine init (cold)" in {p.name for p in model.scenarios["first_deploy"].phases}
    assert model.engine_cache_repeat_trial is None


def test_repeat_trial_after_running_excludes_the_infrastructure():
    model = _model(load_stack("b300", now=FIXED_NOW))
    repeat = model.scenarios["repeat_trial"]
    assert model.repeat_trial_after_running_seconds == repeat.total_seconds - repeat.phases[0].end_seconds


def test_gpu_cost_counts_from_the_gpu_node():
    spec = load_stack("b300", now=FIXED_NOW)
    first = _model(spec).scenarios["first_deploy"]
    infra = first.phases[0]
    assert first.gpu_seconds == first.total_seconds - infra.end_seconds
    assert first.gpu_usd == pytest.approx(first.gpu_seconds / 3600 * 142.416, abs=0.01)
    assert _model(load_stack("gb300", now=FIXED_NOW)).scenarios["first_deploy"].gpu_usd is None


def test_streamer_is_modelled_side_by_side():
    model = _model(load_stack("b300", now=FIXED_NOW))
    stream = model.streamer_repeat_trial
    assert stream is not None
    names = [p.name for p in stream.phases]
    assert "weight copy mirror -> NVMe" not in names and "weight load" not in names
    assert any("runai_streamer" in n for n in names)
    assert "distributed" in ttr.RUNAI_STREAMER_NOTE


def test_schedule_rejects_an_unknown_dependency():
    with pytest.raises(ValueError, match="depends on"):
        ttr.schedule("x", [ttr._Step("a", 1, "s", after=("b",))], None)


def test_plan_shows_time_to_ready():
    """The plan's JSON carries the model; Markdown draws a Mermaid gantt; the table one critical-path
    bar per scenario, and with --details a bar per phase."""
    import io

    from scripts.ops.plan import build_plan_document, render_markdown, render_table

    doc = build_plan_document("b300", now=FIXED_NOW)
    spec = load_stack("b300", now=FIXED_NOW)
    assert doc["time_to_ready"] == _model(spec).as_json() or set(doc["time_to_ready"]) == set(ttr.SCENARIOS)
    assert doc["time_to_ready_goal"]["met"] is True and doc["time_to_ready_goal"]["goal_seconds"] == 900
    assert doc["time_to_ready_alternatives"]["engine_cache"]["repeat_trial"] is None
    assert doc["sizing"]["first_deploy_seconds"] == doc["time_to_ready"]["first_deploy"]["total_seconds"]
    md = render_markdown(doc)
    assert md.count("```mermaid\ngantt") == 4  # three scenarios + the streamer alternative
    assert ":crit, p0, 0, " in md
    out = io.StringIO()
    render_table(doc, file=out, width=120)
    text = out.getvalue()
    bars = [line for line in text.splitlines() if "━" in line]
    assert "time to ready" in text and len(bars) == 4 and "E engine init" in text  # 3 scenarios + the streamer
    out = io.StringIO()
    render_table(doc, file=out, width=120, details=True)
    text = out.getvalue()
    assert "█" in text and "engine init (cached)" in text


def test_replaced_node_pays_from_boot():
    replaced = _model(load_stack("b300", now=FIXED_NOW)).scenarios["replaced_node"]
    assert replaced.phases[0].name == "instance launch"
    assert replaced.gpu_seconds == replaced.total_seconds - replaced.phases[0].end_seconds


@pytest.mark.parametrize("name", STACKS)
def test_weight_phases_name_the_public_origin_of_their_rates(name):
    """The hub download names both ends of its range: the measurement (ai-dynamo/modelexpress, with
    its date) and the slow end's public bound (the hf_transfer README); the FSx copy names where
    throughput = capacity x MB/s per TiB comes from."""
    from scripts.ops.plan import build_plan_document

    doc = build_plan_document(name, now=FIXED_NOW)
    phases = [p for sc in doc["time_to_ready"].values() for p in sc["phases"]]
    hub = [p["source"] for p in phases if p["name"].startswith("hub download")]
    assert hub and all("ai-dynamo/modelexpress docs/BENCHMARKS.md, read 2026-12-07" in s
                       and "github.com/huggingface/hf_transfer" in s and "0.50-1.62 GB/s" in s for s in hub)
    for p in phases:
        if p["name"] == "weight copy FSx -> NVMe":
            assert "docs.aws.amazon.com/fsx/latest/LustreGuide/managing-throughput-capacity.html" in p["source"]


def test_the_ec2_boot_estimate_cites_what_the_vm_tier_measured(tmp_path):
    """The GPU-independent part of the aws-ec2 boot (kernel, cloud-init, Docker, the RAID0) is
    measured by tests/test_vm_boot.py; its recorded figures appear in the phase's source."""
    import json

    doc = json.loads(time_inputs.VM_BOOT_FILE.read_text())
    first = doc["boots"]["first-boot"]["phases"]
    source = time_inputs.INSTANCE_BOOT_SECONDS["aws-ec2"].source
    assert f"cloud-init done {first['cloud_init_done']:.0f} s" in source
    assert f"RAID0 mounted {first['array_mounted']:.0f} s" in source and doc["accel"] in source
    assert source.startswith("estimate:")  # the GPU instance's own part stays an estimate
    model = _model(load_stack("b300", now=FIXED_NOW))
    phase = next(p for p in model.scenarios["first_deploy"].phases if p.name == "instance boot")
    assert phase.source == source
    bad = tmp_path / "vm.json"
    bad.write_text(json.dumps({"recorded_at": "x", "accel": "tcg", "guest_cpu_slowdown": 1, "boots": {}}))
    with pytest.raises(ValueError, match="tests.vm.record"):
        time_inputs.vm_boot_measurement(bad)


@pytest.mark.parametrize("stack", ["b300-prod", "gb300", "mi355x"])
def test_a_pods_budget_follows_the_phases_its_platform_runs(stack):
    """One number per stack, from the model's phases: the alerts' budget is the Deployment's
    progress deadline and Pulumi's timeout, and it covers the init containers' copy (mi355x: the
    hub download onto the node) and, on a new node, the node's launch and boot."""
    from components.core.sizing import sync_budget_seconds
    from components.core.time_to_ready import NODE_WAIT_PHASE, pod_ready_budget
    from components.core.weights import SHAPE_BUCKET, sync_steps
    from tests.test_k8s_workloads import of_kind, run_with_timeouts, seconds

    run, timeouts = run_with_timeouts(stack)
    spec, sizing = run.context.spec, run.context.sizing
    budget = pod_ready_budget(spec, sizing)
    steps = sync_steps(spec, SHAPE_BUCKET if spec.config.storage.mirror.enabled else None)
    copy = next(s for s in steps if s.name == "node-copy" and s.per_node)
    replaced = budget.scenarios["replaced_node"]
    assert replaced[0].name == NODE_WAIT_PHASE and replaced[0].expected_seconds > 0
    assert all(p.name != NODE_WAIT_PHASE for p in budget.scenarios["first_deploy"])
    copies = [p for p in budget.phases if p.init_container and p.name != "engine cache restore"]
    assert [p.budget_seconds for p in copies] == [sync_budget_seconds(spec, sizing, copy)]
    assert budget.budget_seconds > sizing.startup_budget_seconds + sync_budget_seconds(spec, sizing, copy)
    # every scenario's pod runs at least as long as the model says and stays inside the budget
    for name in budget.scenarios:
        assert 0 < budget.expected_seconds(name) < budget.budget_seconds
    workload = "vllm-leaderworkerset" if spec.nodes_per_copy > 1 else "vllm-deployment"
    assert seconds(timeouts[workload].create) == budget.budget_seconds
    for dep in of_kind(run, "Deployment"):
        assert dep["spec"]["progressDeadlineSeconds"] == budget.budget_seconds
    if stack == "mi355x":
        # The budget is timed at the hub range's slow end, the expectation at the measured rate.
        assert copies[0].name == "hub download -> node" and copies[0].expected_seconds == -(-WEIGHTS // 1_622_889_306)
        assert copies[0].budget_seconds == 2 * 3_120 and budget.budget_seconds > 5_700 + copies[0].budget_seconds


def test_the_hub_rate_is_a_public_measurement_with_a_slow_end():
    """The first deploy downloads at the measured 1.62 GB/s (865 GB in 8 m 53 s), not the former
    100 MB/s guess; the slow end (0.5 GB/s) is modelled beside it and times the budgets."""
    hub = time_inputs.HUB_DOWNLOAD_BYTES_PER_SECOND
    assert hub.value == 865e9 / 533 and not hub.is_estimate and "8 m 53 s" in hub.source
    assert time_inputs.HUB_DOWNLOAD_LOW_BYTES_PER_SECOND.is_estimate
    model = _model(load_stack("b300", now=FIXED_NOW))
    first = model.scenarios["first_deploy"]
    download = next(p for p in first.phases if p.name == "hub download -> mirror")
    assert download.seconds == -(-WEIGHTS * 533 // 865_000_000_000)  # 962 s
    assert first.total_seconds < 3600 < model.first_deploy_slow.total_seconds
    slow = next(p for p in model.first_deploy_slow.phases if p.name == "hub download -> mirror")
    assert slow.seconds == WEIGHTS // 500_000_000
    assert first.gpu_usd is not None and first.gpu_usd < 100 < model.first_deploy_slow.gpu_usd


def test_a_measured_hub_rate_replaces_both_ends():
    spec = _spec_with("b300", hubDownloadGBps=0.25)
    model = ttr.time_to_ready(spec, compute_sizing(spec), sync_steps(spec, "bucket"))
    download = next(p for p in model.scenarios["first_deploy"].phases if p.name == "hub download -> mirror")
    assert download.seconds == WEIGHTS // 250_000_000 and "timeToReady.hubDownloadGBps" in download.source
    assert model.first_deploy_slow.total_seconds == model.scenarios["first_deploy"].total_seconds


def test_the_hub_rate_is_capped_by_the_network_of_the_machine_that_downloads():
    spec = load_stack("b300", now=FIXED_NOW)
    slow_machine = time_inputs.hub_download_rate(spec, 3.125, "c6id.2xlarge", "moto")
    assert slow_machine.capped_by == "c6id.2xlarge network"
    assert slow_machine.expected.bytes_per_second == 3.125e9 / 8 * time_inputs.S3_ACHIEVABLE_FRACTION.value
    assert time_inputs.publish_hub_rate(spec, staging=False).capped_by is None  # a GPU node's 300 Gbps


def _window_spec(stack: str, **keys):
    ns, _ = namespace_config(read_stack_config(stack))
    ns.update(keys)
    return parse_spec(ns, stack="t", now=FIXED_NOW)


def test_a_trial_window_shorter_than_the_first_deploy_blocks_serve_with_both_figures():
    spec = _window_spec("b300", trialTtlHours=1)
    (err,) = [b for b in spec.blockers if "trialTtlHours" in str(b)]
    text = str(err)
    assert text.startswith("kimi-deploy:trialTtlHours: 1 leaves 60 min") and "44 min-80 min" in text and "18 min" in text
    assert not [b for b in _window_spec("b300", trialTtlHours=2).blockers if "trialTtlHours" in str(b)]


def test_an_expiry_or_a_capacity_block_end_before_the_first_deploy_blocks_serve():
    from datetime import timedelta

    soon = (FIXED_NOW + timedelta(minutes=70)).isoformat()
    spec = _window_spec("b300", expiresAt=soon)
    assert [str(b).split(":", 2)[1] for b in spec.blockers] == ["expiresAt"]
    assert not _window_spec("b300", expiresAt=(FIXED_NOW + timedelta(hours=3)).isoformat()).blockers
    capacity = {"type": "capacity-block", "reservationId": "cr-0a1b2c3d4e5f60718", "availabilityZone": "us-east-1a",
                "endsAt": (FIXED_NOW + timedelta(minutes=100)).isoformat()}
    ns, _ = namespace_config(read_stack_config("b300"))
    ns["compute"] = {**ns.get("compute", {}), "availabilityZone": "us-east-1a", "capacity": capacity}
    blocked = parse_spec(ns, stack="t", now=FIXED_NOW)
    (err,) = [b for b in blocked.blockers if "compute.capacity.endsAt" in str(b)]
    assert "leaves 70 min" in str(err) and "terminates the capacity block's instances" in str(err)


def test_the_goal_line_gives_the_repeat_trials_whole_figure_beside_its_own():
    """The goal's "modelled 13 min" (from the instance running) and the table's "repeat trial 18 min"
    (from `pulumi up`) read as two figures for one thing in two docs: the goal line names both."""
    from scripts.ops import plan as plan_script

    doc = plan_script.build_plan_document("b300", now=FIXED_NOW)
    goal = doc["time_to_ready_goal"]
    whole = doc["time_to_ready"]["repeat_trial"]["total_seconds"]
    assert whole > goal["modelled_seconds"]
    line = plan_script._goal_line(doc)
    assert (f"modelled {plan_script._duration(goal['modelled_seconds'])} ({goal['modelled_seconds']:,} s; "
            f"{plan_script._duration(whole)} from `pulumi up`, as in the table)") in line, line


def _ns_spec(stack: str, section: str, **keys):
    ns, _ = namespace_config(read_stack_config(stack))
    ns[section] = {**ns.get(section, {}), **keys}
    return parse_spec(ns, stack="t", now=FIXED_NOW)


@pytest.mark.parametrize(("section", "keys", "expected"), [
    # Issue 35 (trials t228, t527, t158): days of GPU time before anything gives up, in silence.
    ("storage", {"readGBps": 0.016}, ("storage.readGBps 0.016", "startup budget of 54.7 h", "above 12.0 h",
                                      "USD 7,785 of GPU time at the stack's USD 142.42/h")),
    ("timeToReady", {"engineInitSeconds": 86400}, ("timeToReady.engineInitSeconds 86400", "startup budget of 48.1 h",
                                                   "USD 6,845")),
    ("compute", {"weightsRetry": {"attempts": 20, "delaySeconds": 3600}},
     ("compute.weightsRetry {attempts: 20, delaySeconds: 3600}", "retrying for 19.0 h", "above 4.0 h",
      "3x the modelled first deploy of 1.3 h", "USD 2,706")),
])
def test_a_wait_far_beyond_the_modelled_time_to_ready_is_warned_with_hours_and_gpu_cost(section, keys, expected):
    spec = _ns_spec("b300", section, **keys)
    (warning,) = [w for w in spec.warnings if "startup budget of" in w or "weightsRetry" in w]
    for part in expected:
        assert part in warning, (part, warning)


@pytest.mark.parametrize("stack", STACKS)
def test_the_shipped_stacks_wait_no_longer_than_the_bound(stack):
    spec = load_stack(stack, now=FIXED_NOW)
    assert not [w for w in spec.warnings if "startup budget of" in w or "weightsRetry" in w]
    bound, _ = ttr.long_wait_bound(ttr.stack_time_to_ready(spec))
    assert compute_sizing(spec).startup_budget_seconds <= bound
