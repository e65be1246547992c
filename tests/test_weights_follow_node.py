"""Weights follow the node: the node-local copy is an init container of the vLLM pods, so a GPU
node added or replaced after `pulumi up` gets its copy from its own pod, with no Job to re-run."""

from __future__ import annotations

import math

import pytest

from components.core import time_to_ready as ttr
from components.core.config import read_stack_config
from components.core.engine_cache import restored_at_start
from components.core.sizing import sync_budget_seconds
from components.core.time_to_ready import stack_time_to_ready
from components.core.weights import sync_steps
from components.k8s import engine_cache, vllm_service
from tests.conftest import plan_for
from tests.test_k8s_workloads import run_with_timeouts, seconds, vllm_pods


def _jobs(run) -> dict[str, str]:
    return {r.name: r.inputs["metadata"]["name"] for r in run.resources if r.type == "kubernetes:batch/v1:Job"}


@pytest.mark.parametrize("stack", ["b300-prod", "gb300"])
def test_a_node_that_appears_later_needs_no_job_rerun(stack):
    """One more copy (one more GPU node, or a replaced one): the Jobs are unchanged (Pulumi
    leaves them alone) and the pod that lands on the new node carries the sync onto it."""
    before = plan_for(stack)
    compute = dict(read_stack_config(stack)["kimi-deploy:compute"])
    compute["replicas"] = compute.get("replicas", 1) + 1
    after = plan_for(stack, overrides={"kimi-deploy:compute": compute})
    assert after.context.spec.gpu_nodes > before.context.spec.gpu_nodes
    assert _jobs(after) == _jobs(before) and "weight-sync-node-copy" not in _jobs(after)
    for role, pod in vllm_pods(after).items():
        assert pod == vllm_pods(before)[role]  # the same template: every pod copies onto its node
        assert pod["spec"]["initContainers"][0]["name"] == "weight-sync"


@pytest.mark.parametrize("stack", ["b300-prod", "gb300", "mi355x"])
def test_pulumi_waits_and_progress_deadline_include_the_copy(stack):
    run, timeouts = run_with_timeouts(stack)
    spec, sizing = run.context.spec, run.context.sizing
    copy = next(s for s in sync_steps(spec, "b" if spec.config.storage.mirror.enabled else None) if s.name == "node-copy")
    # The engine caches' restore (an init container after the copy) where the pods restore them.
    restore = engine_cache.RESTORE_TIMEOUT_SECONDS if restored_at_start(spec) else 0
    # A replaced node (or a scale-up onto a new one): the pod waits for the node's launch and boot.
    replaced = {p.name: p.seconds for p in stack_time_to_ready(spec).scenarios["replaced_node"].phases}
    node_wait = math.ceil(ttr.NODE_WAIT_SAFETY_FACTOR * (replaced["instance launch"] + replaced["instance boot"]) / 60) * 60
    # A LeaderWorkerSet leader's gate also waits for its workers' engine-cache saves.
    from components.core.engine_cache import ENGINE_CACHE_GROUP_WAIT_SECONDS
    group_wait = ENGINE_CACHE_GROUP_WAIT_SECONDS if restore and spec.nodes_per_copy > 1 else 0
    per_pod = (node_wait + ttr.IMAGE_PULL_BUDGET_SECONDS + sync_budget_seconds(spec, sizing, copy) + restore
               + sizing.startup_budget_seconds + ttr.ENGINE_TIMEOUT_MARGIN_SECONDS + group_wait)
    workload = "vllm-leaderworkerset" if spec.nodes_per_copy > 1 else "vllm-deployment"
    assert seconds(timeouts[workload].create) == per_pod
    # a rolling update may touch every copy up to the autoscaler's maximum
    assert seconds(timeouts[workload].update) == per_pod * vllm_service.max_replicas(spec)
    if spec.nodes_per_copy == 1:
        deployment = run.named("vllm-deployment").inputs["spec"]
        assert deployment["progressDeadlineSeconds"] == per_pod


@pytest.mark.parametrize("stack", ["b300-prod", "gb300", "mi355x"])
def test_startup_probe_window_ends_after_the_engine_ready_timeout(stack):
    """vLLM's own 'engine not ready' error must come before the kubelet's probe kill."""
    run = plan_for(stack)
    for role, pod in vllm_pods(run).items():
        container = next(c for c in pod["spec"]["containers"] if c["name"] == "vllm")
        if "startupProbe" not in container:
            continue  # headless workers serve no HTTP
        env = {e["name"]: e.get("value") for e in container["env"]}
        engine_timeout = int(env["VLLM_ENGINE_READY_TIMEOUT_S"])
        probe = container["startupProbe"]
        window = probe["failureThreshold"] * probe["periodSeconds"]
        assert window >= engine_timeout + 60, (role, window, engine_timeout)
