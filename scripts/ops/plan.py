#!/usr/bin/env python3
"""Offline plan: everything `pulumi up` would declare for a stack, with no cloud account.

Runs the real Pulumi program (``__main__.py`` -> ``components.program``) under Pulumi's mock
engine with the stack's config, records every resource and its inputs, and builds one document
(``build_plan_document``; ``--format json`` prints it, ``markdown`` renders all of it). The table
for people (``render_table``) fits a screen or two at 80-120 columns: a summary (target, nodes x
GPUs, storage, load time, startup budget, KV tokens, cost), what stops `pulumi up` (once), the
``vllm serve`` command per node role as a shell command one can paste, the weight-sync runs, one
critical-path bar per time-to-ready scenario and the resources counted by type; ``--details``
adds every phase with its source, every resource with its key inputs and the outputs. ``--all``
prints one line per stack: deployable, or refused by `pulumi up`.

Values that exist only after ``pulumi up`` (ids, addresses, generated names) print as
``<known after pulumi up>`` (``components.plan_engine.KNOWN_AFTER_UP``); example values shipped in
``stacks/`` print a warning until replaced (``components.core.examples``).

Exit codes: 0 ok; 1 the plan found a problem (a secret in a plain input); 2 usage or config error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: its folder is on sys.path, the project may not be installed here
    import _cli  # noqa: F401  first: a missing package (or the project itself) prints `make setup`, not a traceback

from rich.text import Text

from components.core import cost as costmodel
from components.core.config import (
    STACKS_DIR,
    DeploymentSpec,
    config_overlay,
    format_utc,
    parse_clock,
    read_stack_config,
    stack_names,
)
from components.core.config.stack_file import CONFIG_OVERLAY_ENV, overlay_keys
from components.core.engine_memory import KDA_STATE_PER_SEQUENCE_ESTIMATE, KV_SIZING_SOURCE
from components.core.errors import ConfigError
from components.core.load import load_stack
from components.core.time_to_ready import HOURS_SHOWN_FROM_SECONDS, whole_minutes
from scripts.ops._cli import CliParser, UsageError, check_output_path, print_overlay_notice, prog_name
from scripts.ops._text import shell_command, shell_units, wrap_items
from scripts.ops._text import wrap as _wrap_text

REPO_ROOT = Path(__file__).resolve().parents[2]

DEFAULT_STACK = "b300"
FORMATS = ("table", "json", "markdown")


# A plan that takes longer than this says what it is doing (on stderr; the plan text on stdout is unchanged).
PROGRESS_AFTER_SECONDS = 2.0


class PlanProgress:
    """Progress lines of one plan on ``stream`` (stderr): ``plan b300: running the program under the
    mock engine (2.1 s)``, one per phase, and a last ``plan b300: done in 3.4 s``.

    Nothing is said while the plan is quicker than ``after_seconds`` (a warm plan takes 2-3 s);
    from then on the phase in progress and every later one are said as they start. ``after_seconds``
    0 says every phase from the start. The wait is a ``threading.Event`` (the plan's end ends it).
    """

    def __init__(self, stack: str, stream: Any, after_seconds: float = PROGRESS_AFTER_SECONDS) -> None:
        import threading
        import time

        self._stack, self._stream, self._clock = stack, stream, time.monotonic
        self._start = self._clock()
        self._phase = "starting"
        self._shown = after_seconds <= 0
        self._lock = threading.Lock()
        self._done = threading.Event()
        if not self._shown:
            threading.Thread(target=self._wait, args=(after_seconds,), daemon=True).start()

    def _wait(self, seconds: float) -> None:
        if not self._done.wait(seconds):
            with self._lock:
                if not self._done.is_set():
                    self._shown = True
                    self._say(self._phase)

    def _say(self, text: str) -> None:
        print(f"plan {self._stack}: {text} ({self._clock() - self._start:.1f} s)", file=self._stream, flush=True)

    def phase(self, name: str) -> None:
        """``name`` (what the plan does now) starts."""
        with self._lock:
            self._phase = name
            if self._shown:
                self._say(name)

    def done(self) -> None:
        """The plan is written: the last line, where progress was shown."""
        with self._lock:
            self._done.set()
            if self._shown:
                self._say("done")


def _parse_now(text: str | None) -> datetime:
    if text is None:  # the flag left out; an empty --now is refused by parse_clock
        return datetime.now(UTC).replace(microsecond=0)
    return parse_clock(text, "--now")


def kubernetes_api_document(spec: DeploymentSpec) -> dict[str, Any] | None:
    """How the Kubernetes provider reaches the cluster, for the plan: ``{mode, summary, path, ...}``
    (``config.ApiServerAccess.document`` on aws-eks; on an existing cluster the kubeconfig's
    server); None where no Kubernetes object is declared (aws-ec2)."""
    from components.core.config import api_server_access

    if spec.profile.creates_cluster:
        return api_server_access(spec.config).document()
    if not spec.profile.runs_kubernetes:
        return None
    context = spec.config.kubernetes.context
    where = f", context {context}" if context else ""
    return {
        "mode": "kubeconfig",
        "summary": f"the server of kimi-deploy:kubeconfig{where} (the network path to it is yours)",
        "path": [
            "the provider uses the kubeconfig secret as given: `pulumi up`, preview and destroy run where its server "
            "answers; `kimi-deploy preflight --check-cluster` contacts it",
        ],
    }


def build_plan_document(stack: str, *, now: datetime | None = None, stacks_dir: Path | None = None,
                        progress: PlanProgress | None = None) -> dict[str, Any]:
    """The offline plan of ``stack`` as one JSON-serializable document.

    Keys: ``stack``, ``target``, ``platform``, ``environment``, ``model`` {id, revision,
    revision_is_commit, serve_commit {commit, marker, summary}: which commit serve loads, source,
    weights_bytes, files}, ``nodes`` {gpu_nodes, nodes_per_copy,
    gpus_per_node, replicas, instance_type}, ``sizing`` {storage_kind, storage_capacity_gib,
    fsx_capacity_gib, fsx_throughput_per_tib_mbps, read_bytes_per_second, load_seconds,
    startup_budget_seconds, kv_cache_tokens, kv_cache_tokens_tp, kv_cache_tokens_dcp,
    kv_cache_tokens_range, kv_cache_tokens_range_tp ([low, high]),
    kv_cache_source, kv_cache_layout {terms [{name, layers, format, bytes_per_token_per_layer,
    bytes_per_token_per_gpu, dcp_sharded, per_sequence, source}], budget {terms [{name, low_bytes,
    high_bytes, transient, estimate, source}], kv_bytes_per_gpu_low/high, ...}, ...}, kv_cache_claim,
    max_model_len, download_seconds, download_seconds_slow, hub_rate {range, expected_bytes_per_second,
    low_bytes_per_second, source, low_source}, usd_per_hour, price_source}, ``vllm``
    {image, served_model_names, port, tensor_parallel_size, decode_context_parallel_size,
    roles [{name, nodes, argv, env, secret_env}]}, ``weight_sync`` [{name, source, dest,
    per_node}], ``kubernetes_api`` (how the Kubernetes provider reaches the cluster: {mode, summary,
    path, ...}, ``kubernetes_api_document``; None on aws-ec2),
    ``expires_at``, ``warnings``,
    ``resources`` [{type, name, inputs, references, ignore_changes, replace_on_changes}] (references:
    input path -> the resource attribute it is computed from, ``{"launchTemplate.id": "gpu-lt.id"}``;
    ignore_changes, only where the program sets it: input paths ``pulumi up`` keeps from the state;
    replace_on_changes, only where set: input paths whose change replaces the resource),
    ``outputs``, ``secret_leaks``. Secret values appear only as ``[secret]``.

    ``progress``: told each phase as it starts (``PlanProgress``: reading the config, sizing, the
    program under the mock engine, pricing, time to ready).

    Raises:
        ConfigError: the stack file is missing or invalid (one line).
    """
    say = progress.phase if progress is not None else (lambda _name: None)
    say("reading the stack config")
    from components.core.sizing import compute_sizing, sync_expected_seconds
    from components.core.time_to_ready import first_deploy_seconds
    from components.core.vllm import build_vllm_command
    from components.core.weights import serve_commit, sync_steps
    from components.plan_engine import run_program

    now = now or datetime.now(UTC).replace(microsecond=0)
    stacks_dir = stacks_dir or STACKS_DIR
    spec = load_stack(stack, now=now, stacks_dir=stacks_dir)  # validates before anything is declared
    say("sizing (KV cache, memory, storage, vLLM command)")
    sizing = compute_sizing(spec)
    command = build_vllm_command(spec, sizing)
    say("running the Pulumi program under the mock engine")
    run = run_program(read_stack_config(stack, stacks_dir=stacks_dir), stack=stack, now=now, allow_blockers=True)
    mirror_bucket = run.outputs.get("mirrorBucket") if spec.config.storage.mirror.enabled else None
    if spec.config.storage.mirror.enabled and not mirror_bucket:
        mirror_bucket = spec.config.storage.mirror.bucket_name or "<mirror-bucket>"
    steps = sync_steps(spec, mirror_bucket if spec.config.storage.mirror.enabled else None)
    st = sizing.storage
    # Registration order under the mock engine depends on async scheduling: sort for
    # reproducible documents and diffs.
    resources = sorted(run.resources, key=lambda r: (r.type, r.name))
    say(f"pricing {len(resources)} resources; time to ready")
    bill = costmodel.bill_document(
        costmodel.spec_bill(spec, [{"type": r.type, "name": r.name, "inputs": r.inputs} for r in resources]),
        costmodel.trial_hours(spec, now))
    return {
        "stack": stack,
        "target": spec.target.name,
        # The profile names one model copy; a stack of several says how many (the GPU nodes row has the count).
        "target_display": (spec.target.display_name if spec.config.compute.replicas == 1
                           else f"{spec.config.compute.replicas} copies, each {spec.target.display_name}"),
        "platform": spec.platform,
        "environment": spec.environment,
        "region": spec.region,
        "availability_zone": spec.availability_zone,
        "model": {
            "id": spec.hub_repo,
            "profile": spec.model.name,
            "revision": spec.revision,
            "revision_is_commit": spec.revision_is_commit,
            # Which commit serve loads: pinned, or the one staging resolved (read from the mirror's marker).
            "serve_commit": run.mark_computed(dataclasses.asdict(
                serve_commit(spec, mirror_bucket if spec.config.storage.mirror.enabled else None))),
            "source": spec.model_source,
            "weights_bytes": spec.model.weights_bytes,
            "files": spec.model.file_count,
        },
        "nodes": {
            "gpu_nodes": spec.gpu_nodes,
            "nodes_per_copy": spec.nodes_per_copy,
            "gpus_per_node": spec.target.gpus_per_node,
            "replicas": spec.replicas,
            "instance_type": spec.instance.instance_type,
            "capacity": spec.config.compute.capacity.type if spec.profile.provisions_aws else "existing cluster",
        },
        "sizing": {
            "storage_kind": st.kind,
            "storage_capacity_gib": st.capacity_gib,
            "storage_needed_gib": st.needed_gib,
            "fsx_capacity_gib": st.fsx_capacity_gib,
            "fsx_throughput_per_tib_mbps": st.fsx_throughput_per_tib_mbps,
            "read_bytes_per_second": st.read_bytes_per_second,
            "read_source": st.read_source,
            "load_seconds": sizing.load_seconds,
            "startup_budget_seconds": sizing.startup_budget_seconds,
            "kv_cache_tokens": sizing.kv_cache_tokens,
            "kv_cache_tokens_tp": sizing.kv_cache_tokens_tp,
            "kv_cache_tokens_dcp": sizing.kv_cache_tokens_dcp,
            "kv_cache_tokens_range": list(sizing.kv_cache_tokens_range),
            "kv_cache_tokens_range_tp": list(sizing.kv_cache_tokens_range_tp),
            "kv_cache_source": sizing.kv_cache_source,
            "kv_cache_layout": _kv_cache_layout(spec, sizing),
            "kv_cache_claim": _kv_cache_claim(sizing),
            "max_model_len": sizing.max_model_len,
            "full_context_sequences": sizing.full_context_sequences,
            "download_seconds": sizing.download_seconds,
            "download_seconds_slow": sizing.download_seconds_slow,
            "hub_rate": _hub_rate(spec),
            "first_deploy_seconds": first_deploy_seconds(spec, sizing, steps),
            "usd_per_hour": sizing.usd_per_hour,
            "price_source": sizing.price_source,
        },
        "bill": bill,
        "vllm": {
            "image": command.image,
            "served_model_names": list(command.served_model_names),
            "port": command.port,
            "tensor_parallel_size": command.tensor_parallel_size,
            "decode_context_parallel_size": command.decode_context_parallel_size,
            "roles": [
                {
                    "name": r.name,
                    "nodes": r.nodes,
                    "argv": list(r.argv),
                    "env": dict(r.env),
                    "secret_env": {k: f"[secret] from kimi-deploy:{v}" for k, v in r.secret_env.items()},
                }
                for r in command.roles
            ],
        },
        "weight_sync": run.mark_computed([
            {
                "name": s.name,
                "source": s.source,
                "dest": s.dest,
                "per_node": s.per_node,
                "expected_seconds": sync_expected_seconds(spec, sizing, s),
                "argv": list(s.argv),
            }
            for s in steps
        ]),
        # How the Kubernetes provider (and so `pulumi up`, preview, destroy) reaches the cluster.
        "kubernetes_api": kubernetes_api_document(spec),
        "expires_at": run.outputs.get("expiresAt"),
        "expires_rule": _expiry_rule(spec),
        # What stops by itself at the expiry and what keeps billing (components/aws/expiry.py).
        "at_expiry": _at_expiry(spec, resources, bill) if run.outputs.get("expiresAt") else None,
        "protect": spec.protect,
        "warnings": list(spec.warnings),
        # What stops `pulumi up` (the program raises the first) although the plan renders.
        "blockers": [str(b) for b in spec.blockers],
        # A stage declares no engine: a build that cannot serve blocks serve only (config/phase.py);
        # an EKS API no one can reach blocks every phase (spec.up_blockers).
        "deployable": not spec.up_blockers,
        # Provider-computed values (ids, addresses, generated names) show as KNOWN_AFTER_UP;
        # ignore_changes (where set): inputs `pulumi up` keeps from the state; replace_on_changes
        # (where set): inputs whose change replaces the resource.
        "resources": [
            {**entry, "references": run.references(r.inputs),
             **({"ignore_changes": list(r.ignore_changes)} if r.ignore_changes else {}),
             **({"replace_on_changes": list(r.replace_on_changes)} if r.replace_on_changes else {})}
            for r, entry in zip(
                resources, run.mark_computed([{"type": r.type, "name": r.name, "inputs": r.inputs} for r in resources]),
                strict=True,
            )
        ],
        "outputs": run.mark_computed(run.outputs),
        "secret_leaks": [{"secret": k, "resource": n, "path": p} for k, n, p in run.secret_leaks],
        "generated_at": format_utc(now),
        # The keys KIMI_DEPLOY_CONFIG_OVERLAY set over the stack file for this render ([] when
        # unset): the table and Markdown say so in their first line (``overlay_line``).
        "config_overlay": list(overlay_keys(extra, stack)) if (extra := config_overlay()) is not None else [],
        **scaling_section(spec, sizing),
        **_scraping_section(spec),
        **_time_to_ready_section(spec, sizing, steps),
        **_stage_then_serve_section(spec, sizing, steps),
    }


def _hub_rate(spec) -> dict[str, Any]:
    """The hub download rate onto a GPU node as a range (``time_inputs.publish_hub_rate``)."""
    from components.core.time_inputs import publish_hub_rate

    hub = publish_hub_rate(spec, staging=False)
    return {"range": hub.range_text(), "expected_bytes_per_second": hub.expected.bytes_per_second,
            "low_bytes_per_second": hub.low.bytes_per_second, "source": hub.expected.source, "low_source": hub.low.source}


def _stage_then_serve_section(spec, sizing, steps) -> dict[str, Any]:
    """``phase`` (the stack's) and ``stage_then_serve``: ``phase: stage`` until the mirror is
    complete, then serve, beside a single ``pulumi up`` (``time_to_ready.stage_then_serve``), or
    None without a mirror (nothing to stage)."""
    from components.core.time_to_ready import stage_then_serve

    model = stage_then_serve(spec, sizing, steps)
    return {"phase": spec.config.phase, "stage_then_serve": model.as_json() if model is not None else None}


def stage_then_serve_rows(doc: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The compact comparison for people: ``(path, time to ready, GPU USD, staging USD)`` rows of a
    single ``pulumi up``, stage then serve, and the GPU wait saved; empty without a mirror."""
    sts = doc.get("stage_then_serve")
    if not sts:
        return []

    def usd(value: float | None) -> str:
        return "unknown (no GPU price)" if value is None else f"{value:,.2f}"

    single, serve = sts["single_up"], sts["serve"]
    staging = "none added" if sts["staging_usd"] is None else usd(sts["staging_usd"])
    return [
        ("single `pulumi up`", _duration(single["total_seconds"]), usd(single["gpu_usd"]), "-"),
        ("stage, then serve", _duration(sts["total_seconds"]), usd(serve["gpu_usd"]), staging),
        ("GPU wait saved", _duration(sts["gpu_seconds_saved"]), usd(sts["gpu_usd_saved"]), ""),
    ]


def _no_mirror_note(doc: dict[str, Any]) -> str:
    """What ``phase: stage`` takes on a stack without a mirror (config/phase.py says the same when refused)."""
    if doc["platform"] == "kubernetes":
        return ("phase: stage needs an existing S3 bucket here (this platform creates none): storage.mirror {enabled: "
                "true, create: false, bucketName, region} and kubernetes.mirrorCredentials (docs/kubernetes.md)")
    return "phase: stage needs storage.mirror.enabled: true"


def _stage_then_serve_notes(doc: dict[str, Any]) -> list[str]:
    """What runs the stage, when to switch, and the reservation note where it applies."""
    sts = doc["stage_then_serve"]
    notes = [f"staging on {sts['staging_compute']}; switch to serve at {_duration(sts['switch_at_seconds'])}, "
             f"when {sts['switch_when']}"]
    return notes + ([sts["reservation_note"]] if sts["reservation_note"] else [])


def _section_stage_then_serve(view: View) -> list[Text]:
    """Stage then serve beside a single `pulumi up` (``stage_then_serve_rows``), then what runs the
    stage, when to switch and, for reserved capacity, that it bills anyway."""
    rows = stage_then_serve_rows(view.doc)
    if not rows:
        return [_heading("stage, then serve", "no S3 mirror: nothing to stage")] + [
            Text(line) for line in wrap(_no_mirror_note(view.doc), view.width, prefix="  ", indent="    ")]
    lines = [_heading("stage, then serve", f"this stack's phase: {view.doc['phase']}")]
    texts = [f"ready in {ready}; GPU USD {gpu}" + (f"; staging USD {staging}" if staging.strip("-") else "")
             for _, ready, gpu, staging in rows[:2]]
    texts.append(f"{rows[2][1]} of GPU time; USD {rows[2][2]}")
    lines += _rows([(row[0], text) for row, text in zip(rows, texts, strict=True)], view.width, label_max=20)
    lines += [_text(line, "bold") for line in wrap(view.doc["stage_then_serve"]["verdict"], view.width, prefix="  ",
                                                    indent="    ")]
    notes = _stage_then_serve_notes(view.doc)
    if len(notes) > 1 and not view.details:
        notes = [notes[0], "reserved capacity bills its whole term: staging saves GPU money only when the reservation "
                           "starts at the switch to serve (--details)"]
    for note in notes:
        lines += [Text(line) for line in wrap(note, view.width, prefix="  ", indent="    ")]
    return lines


def _stage_then_serve_lines(doc: dict[str, Any]) -> list[str]:
    """The section as text lines (markdown table; the table renderer prints the same rows)."""
    rows = stage_then_serve_rows(doc)
    if not rows:
        return ["", f"**Stage, then serve**: no S3 mirror, nothing to stage: {_no_mirror_note(doc)}."]
    lines = ["", f"**Stage, then serve** (this stack's phase: {doc['phase']})", "",
             "| path | time to ready | GPU USD | staging USD |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return lines + ["", f"**{doc['stage_then_serve']['verdict']}**", ""] + [f"> {note}" for note in _stage_then_serve_notes(doc)]


def _time_to_ready_section(spec, sizing, steps) -> dict[str, Any]:
    """``time_to_ready`` {first_deploy, repeat_trial, replaced_node: {total_seconds, gpu_usd,
    phases [{name, start_seconds, seconds, source, on_critical_path}]}}, ``time_to_ready_goal``
    {scenario, from, goal_seconds, modelled_seconds, met} and ``time_to_ready_alternatives``
    {runai_streamer: {repeat_trial, note}} (``components/core/time_to_ready.py``)."""
    from components.core.time_to_ready import ENGINE_CACHE_NOTE, RUNAI_STREAMER_NOTE, time_to_ready

    model = time_to_ready(spec, sizing, steps)
    stream = model.streamer_repeat_trial
    slow = model.first_deploy_slow
    hub = next((p for p in slow.phases if p.name.startswith("hub download")), None)
    return {
        "time_to_ready": model.as_json(),
        # The first deploy at the slow end of the hub's range (the scenario uses the expected rate).
        "time_to_ready_first_deploy_slow": {"total_seconds": slow.total_seconds, "gpu_usd": slow.gpu_usd,
                                            "hub_download_seconds": hub.seconds if hub else None},
        "time_to_ready_goal": {
            "scenario": "repeat_trial",
            "from": "instance running",
            "goal_seconds": model.goal_seconds,
            "modelled_seconds": model.repeat_trial_after_running_seconds,
            "met": model.goal_met,
        },
        "time_to_ready_alternatives": {
            "runai_streamer": {"repeat_trial": stream.as_json() if stream else None, "note": RUNAI_STREAMER_NOTE},
            "engine_cache": {
                "repeat_trial": model.engine_cache_repeat_trial.as_json() if model.engine_cache_repeat_trial else None,
                "note": ENGINE_CACHE_NOTE,
            },
        },
    }


def _scraping_section(spec) -> dict[str, Any]:
    """``{"scraping": "<how vLLM is scraped and the selector that assumes>"}`` on Kubernetes
    (``components/core/scraping.py``), else ``{}``."""
    from components.core.scraping import scraping_summary

    summary = scraping_summary(spec)
    return {"scraping": summary} if summary else {}


def scaling_section(spec, sizing) -> dict[str, Any]:
    """``{"scaling": {...}}`` of an autoscaled stack, else ``{}``: ``min_replicas``,
    ``max_replicas``, ``initial_replicas``, ``controller``, ``scale_up_seconds`` (+ source, + the
    budget-based bound),
    ``scale_down_delay_seconds``, ``gpu_nodes_min``/``gpu_nodes_max``, ``usd_per_hour_at_min``,
    ``usd_per_hour_at_max`` (None when no price is known), ``price_source``,
    ``scale_down_saves``, ``notes`` (``components/core/scaling.py``); with
    ``autoscaling.controller: hpa`` also ``adapter_rules`` (what prometheus-adapter must serve)."""
    from components.core.scaling import scaling_plan

    plan = scaling_plan(spec, sizing)
    if plan is None:
        return {}
    section: dict[str, Any] = {
        "min_replicas": plan.min_replicas,
        "max_replicas": plan.max_replicas,
        "initial_replicas": plan.initial_replicas,
        "controller": plan.controller,
        "scale_up_seconds": plan.scale_up_seconds,
        "scale_up_source": plan.scale_up_source,
        "scale_up_bound_seconds": plan.scale_up_bound_seconds,
        "scale_down_delay_seconds": plan.scale_down_delay_seconds,
        "gpu_nodes_min": plan.node_min,
        "gpu_nodes_max": plan.node_max,
        "usd_per_hour_at_min": plan.usd_per_hour_at_min,
        "usd_per_hour_at_max": plan.usd_per_hour_at_max,
        "price_source": plan.price_source,
        "scale_down_saves": plan.scale_down_saves,
        "notes": list(plan.notes),
    }
    if plan.controller == "hpa":
        from components.k8s.autoscaling import adapter_rules

        section["adapter_rules"] = adapter_rules(spec, plan)
    return {"scaling": section}


def scaling_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """Summary rows of the ``scaling`` section (none when the stack is not autoscaled)."""
    sc = doc.get("scaling")
    if not sc:
        return []

    def price(value: float | None) -> str:
        return f"USD {value:.2f}/h" if value is not None else "price unknown"

    saves = "" if sc["scale_down_saves"] else " (reserved: scaling down saves nothing)"
    return [
        (
            "autoscaling",
            f"{sc['min_replicas']}..{sc['max_replicas']} replicas ({sc['controller']}), "
            f"{sc['gpu_nodes_min']}..{sc['gpu_nodes_max']} GPU nodes; "
            f"scale-up about {_duration(sc['scale_up_seconds'])}, scale-down after {_duration(sc['scale_down_delay_seconds'])} "
            "of low demand "
            "(then one copy per 30 min)",
        ),
        ("cost at min / max", f"{price(sc['usd_per_hour_at_min'])} / {price(sc['usd_per_hour_at_max'])}{saves}"),
        *(("scaling note", note) for note in sc["notes"]),
    ]


def _at_expiry(spec, resources, bill: dict[str, Any]) -> str:
    """What the expiry does: the GPU resource a schedule stops (``expiry.AT_EXPIRY``) and what keeps
    billing, read from the stack's own bill (its lines that keep billing, e.g. the NAT gateway's public
    IPv4 address, which AWS charges per hour since 2024-02-01: ``prices.PRICES["publicIpv4Hour"]``),
    or that nothing is stopped from the cloud side. On a cluster the stack does not create (the
    kubernetes platform), nothing acts on the expiry: the sweeper only sweeps AWS regions, so the
    GPU workload runs on until the stack is destroyed."""
    if not spec.profile.provisions_aws and spec.profile.runs_kubernetes:
        return ("nothing stops by itself: the sweeper only sweeps AWS, so the GPU workload on this cluster keeps "
                f"running (its GPUs allocated) after the expiry; stop it with `pulumi destroy --stack {spec.stack}`")
    if not any(r.type == "aws:scheduler/schedule:Schedule" for r in resources):
        return "nothing stops by itself (no GPU resource on AWS to stop; the sweeper acts on the expires-at tag)"
    from components.aws.expiry import AT_EXPIRY

    stops = AT_EXPIRY[spec.platform]
    return f"{stops}; still billing: {still_billing(bill)}; `pulumi up` is refused after it"


def still_billing(bill: dict[str, Any]) -> str:
    """The bill's lines that keep billing after the GPUs stop, named briefly (``NAT gateway``,
    ``public IPv4 address x2``), reserved GPU capacity first, then the hourly figure they add up to."""
    names: list[str] = []
    for line in bill["lines"]:
        if not line["keeps_billing"]:
            continue
        if line["item"].startswith("GPU nodes"):
            name = "the GPU reservation (its term)"
        elif line["usd_per_hour"] is None:
            continue  # per use (data processed, logs ingested): nothing while idle
        else:
            name = re.sub(r" \((in use|rotation|gpu-instance|eks-)[^)]*\)", "", line["item"].split(", ")[0])
            if line["unit"] == "hour" and line["quantity"] > 1:
                name += f" x{line['quantity']:g}"
        if name not in names:
            names.append(name)
    return (", ".join(names) or "nothing priced") + f" (USD {bill['after_gpu_stop_usd_per_hour']:,.2f}/h)"


def _expiry_rule(spec) -> str:
    if spec.expires_at is not None:
        return f"explicit expiresAt {format_utc(spec.expires_at)}"
    if spec.environment == "trial":
        return f"{spec.trial_ttl_hours} h after the first `pulumi up` (fixed at creation)"
    return "does not expire"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < HOURS_SHOWN_FROM_SECONDS:
        return f"{whole_minutes(seconds)} min"
    return f"{seconds / 3600:.1f} h"


def _output_text(value: Any) -> str:
    """A stack output for people: strings as they are, ``(none)`` for an output without a value
    (e.g. ``gpuUsdPerHour`` where no public price exists), JSON for the rest."""
    if value is None:
        return "(none)"
    return value if isinstance(value, str) else json.dumps(value)


def _summarize_inputs(inputs: dict[str, Any]) -> str:
    """The inputs people look for first (``instanceType=...``, ``cidrBlock=...``), comma-separated."""
    keys = (
        "instanceType", "ami", "availabilityZone", "storageCapacity", "deploymentType",
        "perUnitStorageThroughput", "cidrBlock", "cidrIpv4", "ipProtocol", "fromPort", "toPort",
        "bucket", "key", "version", "chart", "capacityType", "kind", "name", "role", "policyArn",
        "serviceName", "vpcEndpointType", "type",
    )
    parts = []
    for key in keys:
        if key in inputs and not isinstance(inputs[key], (dict, list)):
            parts.append(f"{key}={inputs[key]}")
    meta = inputs.get("metadata")
    if isinstance(meta, dict) and meta.get("name"):
        parts.append(f"name={meta['name']}")
    return ", ".join(parts)


# Plurals that are not word + "s".
_IRREGULAR_PLURALS = {"copy": "copies"}


def _plural(count: int, word: str) -> str:
    """``1 copy``, ``2 copies``, ``1,200 files`` (thousands separated)."""
    return f"{count:,} " + (word if count == 1 else _IRREGULAR_PLURALS.get(word, word + "s"))


def summary_rows(doc: dict[str, Any], *, details: bool = True) -> list[tuple[str, str]]:
    """The plan's summary as ``(label, text)`` rows, shared by the table and Markdown.
    ``details=False`` (the table without ``--details``): the figures without their sources
    (``(estimate)`` where one is), and without the rows the time-to-ready section shows (hub
    download, first deploy) or that explain (scaling notes)."""
    sz, nodes, model = doc["sizing"], doc["nodes"], doc["model"]
    price = f"USD {sz['usd_per_hour']:.2f}/h ({sz['price_source']})" if sz["usd_per_hour"] else sz["price_source"]
    where = ""
    if doc["region"]:
        where = f"  ({doc['region']}" + (f", AZ {doc['availability_zone']})" if doc["availability_zone"] else ")")
    available = f"{sz['storage_capacity_gib']:,}" if sz["storage_capacity_gib"] else "?"
    storage = f"{sz['storage_kind']}: {available} GiB available, {sz['storage_needed_gib']:,} GiB needed"
    if sz["fsx_capacity_gib"]:
        storage += (f"; uses FSx for Lustre ({sz['fsx_capacity_gib']:,} GiB x {sz['fsx_throughput_per_tib_mbps']:,} "
                    "MB/s/TiB, billed per GB-month)")
    download = (f"{_duration(sz['download_seconds'])} ({_duration(sz['download_seconds_slow'])} at the slow end) at "
                f"{sz['hub_rate']['range']} ") + (
        "(once, into the in-region mirror)" if has_mirror(doc) else "(on every node: this stack has no mirror)"
    )
    steps = " + ".join(f"{s['name']} {_duration(s['expected_seconds'])}" for s in doc["weight_sync"])
    first = (f"about {_duration(sz['first_deploy_seconds'])} with nothing downloaded yet (infrastructure, image pull, {steps}, "
             "load, engine init; see time to ready)")
    ttl = doc["expires_at"] and not doc["expires_rule"].startswith("explicit")
    expires = doc["expires_rule"] + (f" -> {doc['expires_at']} if created now" if ttl else "")
    if doc.get("at_expiry"):
        expires += f"; then {doc['at_expiry']}"
    kv_source = sz["kv_cache_source"]

    def source(text: str | None) -> str:
        """``  (text)`` with --details; ``  (estimate)`` for an estimate without; else nothing."""
        if not text:
            return ""
        if details:
            return f"  ({text})"
        return "  (estimate)" if text.startswith("estimate") else ""

    read = sz["read_source"]
    read_source = f"  ({read})" if details or not read.startswith("estimate") else "  (estimate)"
    gpu_nodes = (f"{nodes['gpu_nodes']}x {nodes['instance_type']} = {_plural(nodes['replicas'], 'copy')} x "
                 f"{_plural(nodes['nodes_per_copy'], 'node')} x {_plural(nodes['gpus_per_node'], 'GPU')}; capacity: "
                 f"{nodes['capacity']}")
    staging = doc.get("phase") == "stage" and doc.get("stage_then_serve")
    # phase: stage creates no GPU node and no vLLM server: the rows say what this phase creates and
    # costs, and mark the serve figures as such (components/core/config/phase.py).
    serve = "at serve: " if staging else ""
    if staging:
        sts = doc["stage_then_serve"]
        stage_price = (f"USD {sts['staging_usd_per_hour']:.2f}/h for {sts['staging_compute']}"
                       + (f" ({sts['staging_source']})" if details else "")
                       if sts["staging_usd_per_hour"] is not None else f"nothing added: {sts['staging_compute']}")
        price = f"{stage_price}; no GPU node in this phase (serve: {price})" + (
            "; the reserved GPU capacity bills its whole term all the same" if sts["reservation_bills_anyway"] else "")
    rows = [
        ("target", doc["target_display"]),
        ("platform / env", f"{doc['platform']} / {doc['environment']}{where}"),
        *([("phase", f"stage: the weights (hub -> S3 mirror) on {doc['stage_then_serve']['staging_compute']}; no GPU "
                     "node and no vLLM server until phase: serve")] if staging else []),
        ("GPU nodes", f"none in this phase (serve adds {gpu_nodes})" if staging else gpu_nodes),
        (
            "model",
            f"{model['id']} @ {model['revision']}  ({model['weights_bytes'] / 1e12:.2f} TB, {_plural(model['files'], 'file')}, "
            f"from {model['source']})",
        ),
        ("weights commit", model["serve_commit"]["summary"]),
        ("storage", storage),
        (
            "weight load",
            f"{serve}{_duration(sz['load_seconds'])} at {sz['read_bytes_per_second'] / 1e9:.1f} GB/s per node{read_source}",
        ),
        (
            "startup budget",
            f"{serve}{_duration(sz['startup_budget_seconds'])} ({sz['startup_budget_seconds']:,} s)"
            + ("  (startup probe, VLLM_ENGINE_READY_TIMEOUT_S, Pulumi timeouts)" if details else ""),
        ),
        (
            "KV cache",
            f"{serve}{_token_range(sz['kv_cache_tokens_range'])} tokens per copy  "
            f"(TP only: {_token_range(sz['kv_cache_tokens_range_tp'])}); "
            f"{sz['full_context_sequences']} x {sz['max_model_len']:,}-token sequences"
            + (source(kv_source) if details or kv_source.startswith("estimate") else "  (measured)"),
        ),
        *(kv_detail_rows(sz) if details else []),
        *([("hub download", download), ("first deploy", first)] if details else []),
        ("cost", price),
        *([("total cost", costmodel.bill_summary(doc["bill"]))] if doc.get("bill") else []),
        *(bill_rows(doc["bill"]) if details and doc.get("bill") else []),
        ("expires", expires),
    ]
    api = doc.get("kubernetes_api")
    if api:
        rows.append(("Kubernetes API", api["summary"]))
        rows += [("API path", line) for line in api["path"]] if details else []
    rows += [row for row in scaling_rows(doc) if details or row[0] != "scaling note"]
    return rows + ([("scraping", doc["scraping"])] if doc.get("scraping") else [])


def bill_rows(bill: dict[str, Any]) -> list[tuple[str, str]]:
    """``--details``: one ``cost line`` row per priced line of the bill (quantity x unit price, source)."""
    rows = []
    for line in bill["lines"]:
        unit = "unknown" if line["usd_per_unit"] is None else f"USD {line['usd_per_unit']:g}"
        amount = (f"USD {line['usd_per_hour']:,.4f}/h" if line["usd_per_hour"] is not None
                  else "per use" + (f", {'per deploy' if bill.get('hub_download_nodes') else 'once'} "
                                    f"USD {line['one_time_usd']:,.2f}" if line["one_time_usd"] else ""))
        stops = "" if line["keeps_billing"] else ", stops with the GPUs"
        est = " (estimate)" if line["estimate"] else ""
        rows.append(("cost line", f"{line['item']}: {line['quantity']:,.6g} x {unit}/{line['unit']} = {amount}{stops}"
                                  f"  ({line['source']}{est})"))
    return rows


def _token_range(tokens: list[int] | tuple[int, int]) -> str:
    low, high = tokens
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def kv_detail_rows(sz: dict[str, Any]) -> list[tuple[str, str]]:
    """The KV figure's derivation for ``--details``: bytes per token per cache (the engine's
    layout, ``sizing.kv_cache_layout``), the memory they get, and the published claim beside them."""
    layout = sz["kv_cache_layout"]
    dcp = layout["decode_context_parallel_size"]
    per_token = [t for t in layout["terms"] if not t["per_sequence"]]
    parts = [
        f"{t['name']} {t['layers']} x {t['bytes_per_token_per_layer']:,} B {t['format']}"
        + (", sharded over DCP" if t["dcp_sharded"] else "")
        for t in per_token
    ]
    states = [f"{t['name']} ({t['layers']} layers) per sequence, not in the token figure" for t in layout["terms"]
              if t["per_sequence"]]
    at_dcp = f" (DCP {dcp}: {layout['bytes_per_token_per_gpu_at_dcp']:,.0f} B)" if dcp > 1 else ""
    backend = (f"; latent format of {layout['attention_backend']} ({layout['backend_source']})"
               if layout["attention_backend"] else "")
    rows = [(
        "KV per token",
        f"{layout['bytes_per_token_per_gpu']:,} B per GPU{at_dcp} = " + " + ".join(parts)
        + "".join(f"; {s}" for s in states) + backend + f" ({layout['source']})",
    )]
    budget = layout["budget"]
    rows += memory_rows(budget)
    claim = sz.get("kv_cache_claim")
    if claim:
        rows.append(("recipe's claim", f"{claim['difference']} ({claim['source']})"))
    return rows


def _gb(low: int, high: int) -> str:
    return f"{low / 1e9:,.2f} GB" if low == high else f"{low / 1e9:,.2f}-{high / 1e9:,.2f} GB"


def memory_rows(budget: dict[str, Any]) -> list[tuple[str, str]]:
    """``--details`` rows of the per-GPU memory: each named term with its source, the KV bytes left
    and what a recipe's ``--max-num-seqs`` would buy (``_memory_budget``)."""
    terms = "; ".join(
        f"{t['name']} {_gb(t['low_bytes'], t['high_bytes'])}" + (" (transient, counted 1.75x)" if t["transient"] else "")
        for t in budget["terms"]
    )
    rows = [
        ("GPU memory", f"{budget['gpu_memory_bytes'] / 1e9:,.2f} GB x {budget['gpu_memory_utilization']:g} "
                       f"({budget['utilization_source']}); batch limits: {budget['batch_limits_source']}"),
        ("memory terms", f"{terms} (per GPU)"),
        *((f"  {t['name']}", t["source"]) for t in budget["terms"]),
        ("KV memory", f"{_gb(budget['kv_bytes_per_gpu_low'], budget['kv_bytes_per_gpu_high'])} per GPU "
                      f"({budget['sizing_source']})"),
    ]
    kda = budget["kda_state_per_sequence"]
    rows.append(("KDA state", f"{_gb(kda['low_bytes'], kda['high_bytes'])} per sequence per GPU, taken from the KV pool "
                              f"per request ({kda['basis']})"))
    option = budget.get("max_num_seqs_option")
    if option:
        rows.append(("--max-num-seqs", (
            f"{option['max_num_seqs']} instead of {option['current']:,} would add "
            f"{option['tokens_gained_low']:,}-{option['tokens_gained_high']:,} KV tokens per copy (a smaller indexer "
            f"logits buffer; at most {option['max_num_seqs']} sequences at once); {option['source']}; not rendered"
        )))
    return rows


# Code blocks in Markdown are laid out for this many columns (a pull-request page shows about 120).
MARKDOWN_COMMAND_COLUMNS = 100


def overlay_line(doc: dict[str, Any]) -> str | None:
    """The plan's first line while ``KIMI_DEPLOY_CONFIG_OVERLAY`` set keys of this render, else None."""
    keys = doc.get("config_overlay") or []
    if not keys:
        return None
    return (f"overlay: {CONFIG_OVERLAY_ENV} sets {', '.join(keys)} over stacks/Pulumi.{doc['stack']}.yaml "
            "(offline only; `pulumi up` reads the stack file alone)")


def render_markdown(doc: dict[str, Any]) -> str:
    """The plan as Markdown (pull-request comments, docs)."""
    overlay = overlay_line(doc)
    lines = [f"> {overlay}", ""] if overlay else []
    lines += [f"### Plan: `{doc['stack']}` — {doc['target_display']}", "", "| | |", "|---|---|"]
    lines += [f"| {label} | {text.replace('|', '/').replace('<', '&lt;')} |" for label, text in summary_rows(doc)]
    lines.append("")
    for b in doc["blockers"]:
        lines.append(f"> ⛔ **`pulumi up` refuses the serve phase:** {b}" if doc["deployable"]
                     else f"> ⛔ **`pulumi up` refuses this stack:** {b}")
    for w in doc["warnings"]:
        lines.append(f"> ⚠ {w}")
    lines.append("")
    for role in doc["vllm"]["roles"]:
        lines.append(f"**vLLM {role['name']}** ({_plural(role['nodes'], 'node')} per copy), image `{doc['vllm']['image']}`")
        lines.append("```sh")
        lines += shell_command(_assignments(role), role["argv"], MARKDOWN_COMMAND_COLUMNS)
        lines.append("```")
    lines += ["", "**Weight sync**", ""]
    for step in doc["weight_sync"]:
        where = "on every GPU node" if step["per_node"] else "once"
        lines.append(
            f"- `{step['name']}` ({where}, about {_duration(step['expected_seconds'])}): `{step['source']}` -> `{step['dest']}`"
        )
    lines += _time_to_ready_markdown(doc)
    lines += _stage_then_serve_lines(doc)
    lines += ["", f"**Resources** ({len(doc['resources'])})", "", "| type | name | key inputs |", "|---|---|---|"]
    for r in doc["resources"]:
        # Outside code spans `<known after pulumi up>` would be read as an HTML tag and hidden.
        lines.append(f"| `{r['type']}` | {r['name']} | {_summarize_inputs(r['inputs']).replace('|', '/').replace('<', '&lt;')} |")
    if doc["outputs"]:
        lines += ["", "**Outputs**", "", "| output | value |", "|---|---|"]
        for k, v in doc["outputs"].items():
            lines.append(f"| {k} | `{_output_text(v)}` |")
    return "\n".join(lines) + "\n"


def has_mirror(doc: dict[str, Any]) -> bool:
    """Whether the stack keeps an in-region weight mirror (its sync publishes one)."""
    return any(s["name"] == "publish-mirror" for s in doc["weight_sync"])


def scenario_title(name: str, doc: dict[str, Any], *, short: bool = False) -> str:
    """A time-to-ready scenario's title for people, true to the stack: with a mirror the first
    deploy fills it and the repeat trial finds it full; without one every scenario downloads from
    the hub. ``short``: the alternatives' titles for the one-line-per-scenario table."""
    mirror = has_mirror(doc)
    titles = {
        "first_deploy": "first deploy (empty mirror)" if mirror else "first deploy (hub download)",
        "repeat_trial": "repeat trial (mirror full)" if mirror else "repeat trial (hub download again)",
        "replaced_node": "replaced node (from the mirror)" if mirror else "replaced node (hub download)",
        "repeat_trial_runai_streamer": "alternative: runai_streamer" if short else
        "repeat trial, --load-format runai_streamer from the mirror (alternative)",
        "repeat_trial_engine_cache": "alternative: engine caches" if short else
        "repeat trial with the engine caches restored (alternative: not wired on this platform)",
    }
    return titles[name]


def _goal_line(doc: dict[str, Any]) -> str:
    goal = doc["time_to_ready_goal"]
    verdict = "met" if goal["met"] else "NOT met"
    whole = doc["time_to_ready"][goal["scenario"]]["total_seconds"]
    # Both figures of the repeat trial side by side (docs quoted 13 min here and 18 min from the table
    # below as if they contradicted): the goal counts from the instance running, the table from `pulumi up`.
    since_up = f"; {_duration(whole)} from `pulumi up`, as in the table" if whole > goal["modelled_seconds"] else ""
    return (f"goal: repeat trial ready within {_duration(goal['goal_seconds'])} of the {goal['from']}: "
            f"modelled {_duration(goal['modelled_seconds'])} ({goal['modelled_seconds']:,} s{since_up}), {verdict}")


def _alternative_scenarios(doc: dict[str, Any]) -> dict[str, Any]:
    """The modelled scenarios plus the alternatives drawn beside them (None ones left out)."""
    scenarios = dict(doc["time_to_ready"])
    for alt, body in doc["time_to_ready_alternatives"].items():
        if body["repeat_trial"]:
            scenarios[f"repeat_trial_{alt}"] = body["repeat_trial"]
    return scenarios


def _alternative_notes(doc: dict[str, Any]) -> list[str]:
    return [body["note"] for body in doc["time_to_ready_alternatives"].values()]


def _time_to_ready_markdown(doc: dict[str, Any]) -> list[str]:
    """The time-to-ready section: per scenario a Mermaid gantt chart (critical phases marked
    ``crit``) and the phases with their sources."""
    lines = ["", "**Time to ready**", "", _goal_line(doc), ""]
    for name, sc in _alternative_scenarios(doc).items():
        title = scenario_title(name, doc)
        usd = f", GPU wait USD {sc['gpu_usd']:,.2f}" if sc["gpu_usd"] is not None else ""
        lines += [f"*{title}*: {_duration(sc['total_seconds'])} ({sc['total_seconds']} s){usd}", "",
                  "```mermaid", "gantt", f"  title {title}", "  dateFormat X", "  axisFormat %H:%M"]
        for i, p in enumerate(sc["phases"]):
            tag = "crit, " if p["on_critical_path"] else ""
            label = p["name"].replace(":", " ").replace(";", ",")
            lines.append(f"  {label} :{tag}p{i}, {p['start_seconds']}, {max(p['seconds'], 1)}s")
        lines += ["```", "", "| phase | start | duration | critical | source |", "|---|---|---|---|---|"]
        for p in sc["phases"]:
            lines.append(f"| {p['name']} | {p['start_seconds']} s | {p['seconds']} s | "
                         f"{'yes' if p['on_critical_path'] else ''} | {p['source'].replace('|', '/')} |")
        lines.append("")
    lines += ["> " + note for note in _alternative_notes(doc)]
    return lines


def _bar(start: int, seconds: int, total: int, width: int = 40) -> str:
    """A bar of ``seconds`` starting at ``start`` on a ``width``-character axis of ``total``."""
    if total <= 0:
        return ""
    first = int(start / total * width)
    length = max(1, round(seconds / total * width)) if seconds else 0
    return " " * first + "█" * min(length, width - first)


# --- the table for people ----------------------------------------------------------------------
#
# The table is a list of sections; each is one function ``(View) -> list[Text]`` that returns its
# lines (none to leave it out) laid out for ``view.width`` columns (scripts/ops/_text.py: lines break
# at spaces, long tokens fold between their parts, nothing is cut mid-word). ``TABLE_SECTIONS``
# is the order; ``render_table`` prints them with a blank line between. Without ``--details``
# the sections stay short (about 60-100 lines for the shipped stacks at 80-120 columns); with it
# they show every phase, source, resource and output.

# The width the table is laid out for: the terminal's (rich: COLUMNS, else the terminal size,
# else 80), kept between these bounds.
TABLE_MIN_COLUMNS = 40
TABLE_MAX_COLUMNS = 160


def wrap(text: str, width: int, prefix: str = "", indent: str | None = None) -> list[str]:
    """``scripts.ops._text.wrap`` that keeps the ``<known after pulumi up>`` marker on one line."""
    from components.plan_engine import KNOWN_AFTER_UP

    return _wrap_text(text, width, prefix, indent, keep=(KNOWN_AFTER_UP,))


@dataclass(frozen=True)
class View:
    """What a table section renders.

    Attributes:
        doc: the plan document (``build_plan_document``).
        width: columns per line.
        details: ``--details``: every phase, source, resource and output.
    """

    doc: dict[str, Any]
    width: int
    details: bool


def _text(line: str, style: str | None = None, head: int = 0, head_style: str = "bold") -> Text:
    """``line`` as rich Text: ``style`` on all of it, ``head_style`` on its first ``head`` characters."""
    text = Text(line, style=style or "")
    if head:
        text.stylize(head_style, 0, head)
    return text


def _heading(title: str, note: str = "") -> Text:
    return _text(title + (f"  {note}" if note else ""), head=len(title))


def _rows(rows: list[tuple[str, str]], width: int, indent: str = "  ", label_max: int = 16) -> list[Text]:
    """``(label, text)`` rows: labels in a column (at most ``label_max`` wide; a longer one
    takes its own line), texts wrapped with a hanging indent."""
    label_width = min(label_max, max((len(label) for label, _ in rows), default=0))
    out: list[Text] = []
    for label, value in rows:
        if len(label) > label_width:
            out.append(_text(indent + label, head=len(indent + label)))
            prefix = indent + " " * (label_width + 2)
        else:
            prefix = indent + label.ljust(label_width + 2)
        for i, line in enumerate(wrap(value, width, prefix=prefix)):
            out.append(_text(line, head=len(indent) + len(label) if i == 0 and len(label) <= label_width else 0))
    return out


def _section_summary(view: View) -> list[Text]:
    """The overlay in force (``overlay_line``), the title with the target, then the summary rows
    (``summary_rows``)."""
    doc = view.doc
    title = f"kimi-deploy plan: {doc['stack']}"
    overlay = overlay_line(doc)
    lines = [Text(line, style="bold yellow") for line in wrap(overlay, view.width, indent="  ")] if overlay else []
    lines += [_text(line, head=len(title) if i == 0 else 0)
              for i, line in enumerate(wrap(f"{title} — {doc['target_display']}", view.width, indent="  "))]
    rows = [row for row in summary_rows(doc, details=view.details) if row[0] != "target"]
    return lines + _rows(rows, view.width)


def _section_blockers(view: View) -> list[Text]:
    """What stops `pulumi up`, printed once (main() does not repeat it on stderr for a table)."""
    blockers = view.doc["blockers"]
    if not blockers:
        return []
    if view.doc["deployable"]:  # phase: stage is allowed; the blockers stop the switch to serve
        head = (f"phase: stage: `pulumi up` stages the weights; serve is refused until this is fixed "
                f"({_plural(len(blockers), 'blocker')}):")
        style, line_style = "bold yellow", "yellow"
    else:
        head = f"BLOCKED: `pulumi up` refuses this stack ({_plural(len(blockers), 'blocker')}; --strict exits 2):"
        style, line_style = "bold red", "red"
    lines = [_text(line, style) for line in wrap(head, view.width)]
    for b in blockers:
        lines += [_text(line, line_style) for line in wrap(b, view.width, prefix="  ")]
    return lines


def _section_warnings(view: View) -> list[Text]:
    lines: list[Text] = []
    for w in view.doc["warnings"]:
        wrapped = wrap(w, view.width, prefix="warning: ", indent="  ")
        lines += [_text(line, head=len("warning:") if i == 0 else 0, head_style="yellow") for i, line in enumerate(wrapped)]
    return lines


def _assignments(role: dict[str, Any]) -> list[str]:
    """The role's environment as shell assignments; a secret reads from the caller's environment
    and names the stack secret it comes from (its value never appears)."""
    out = [f"{k}={shlex.quote(v)}" for k, v in role["env"].items()]
    for k, v in role["secret_env"].items():
        origin = v.split(" from ", 1)[-1]  # "[secret] from kimi-deploy:apiKey"
        out.append(f'{k}="${{{k}:?the stack secret {origin}}}"')
    return out


def role_difference(base: dict[str, Any], role: dict[str, Any]) -> str | None:
    """How ``role``'s command differs from ``base``'s, in one sentence, or None when they differ
    in more than half of their options (then both are shown whole)."""

    def units(r: dict[str, Any]) -> list[str]:
        return [" ".join(shlex.quote(w) for w in u) for u in shell_units(r["argv"])]

    mine, theirs = units(role), units(base)
    added = [u for u in mine if u not in theirs]
    removed = [u for u in theirs if u not in mine]
    env_mine, env_theirs = _assignments(role), _assignments(base)
    env_added = [a for a in env_mine if a not in env_theirs]
    env_removed = [a.split("=", 1)[0] for a in env_theirs if a not in env_mine]
    if len(added) + len(removed) + len(env_added) + len(env_removed) > max(len(mine), len(theirs)) // 2:
        return None
    parts = []
    if added or removed:
        parts.append(" ".join(added) + (" in place of " + " ".join(removed) if removed else "") if added
                     else "without " + " ".join(removed))
    if env_added:
        parts.append("with " + " ".join(env_added))
    if env_removed:
        parts.append("without " + ", ".join(env_removed))
    return f"the {base['name']}'s command, " + "; ".join(parts) if parts else f"the {base['name']}'s command"


def _section_commands(view: View) -> list[Text]:
    """The vLLM command per role, as a shell command one can paste (env, then argv). Without
    --details a role that differs little from the first is given as that difference."""
    doc = view.doc
    lines: list[Text] = []
    roles = doc["vllm"]["roles"]
    staging = doc.get("phase") == "stage" and doc.get("stage_then_serve")
    at_serve = " at phase: serve (not created by this stage)" if staging else ""
    for i, role in enumerate(roles):
        head = f"vLLM {role['name']}"
        header = f"{head} ({_plural(role['nodes'], 'node')} per copy){at_serve}, image {doc['vllm']['image']}"
        if i:
            lines.append(Text(""))
        diff = None if view.details or i == 0 else role_difference(roles[0], role)
        if diff is not None:
            lines += [_text(line, head=len(head) if n == 0 else 0)
                      for n, line in enumerate(wrap(f"{header}: {diff} (--details: in full)", view.width, indent="  "))]
            continue
        lines += [_text(line, head=len(head) if n == 0 else 0) for n, line in enumerate(wrap(header, view.width, indent="  "))]
        lines += [Text(line) for line in shell_command(_assignments(role), role["argv"], view.width, pack=not view.details)]
    return lines


def _section_weight_sync(view: View) -> list[Text]:
    lines = [_heading("weight sync")]
    for step in view.doc["weight_sync"]:
        where = "on every GPU node" if step["per_node"] else "once"
        text = f"{step['name']} ({where}, about {_duration(step['expected_seconds'])}): {step['source']} -> {step['dest']}"
        lines += [Text(line) for line in wrap(text, view.width, prefix="  ", indent="    ")]
        if view.details:
            # The command at column 0: a word split across lines must continue there (scripts/ops/_text.py).
            lines += [_text(line, "dim") for line in shell_command([], step["argv"], view.width)]
    return lines


# Letters that mark a phase in the one-line critical path (by the phase name's start); a phase
# not listed takes the first free letter of its name.
_PHASE_LETTERS = (
    ("infrastructure", "I"), ("instance launch", "L"), ("instance boot", "B"), ("image pull", "P"),
    ("hub download", "H"), ("mirror check", "M"), ("weight copy", "C"), ("engine cache restore", "R"),
    ("weight stream", "S"), ("weight load", "W"), ("engine init", "E"),
)
_BAR_FILL = "━"
_BAR_STYLES = ("cyan", "magenta", "green", "yellow", "blue", "red")


def _phase_letters(scenarios: dict[str, Any]) -> dict[str, str]:
    """Phase name -> its letter, for every critical phase of ``scenarios``."""
    letters: dict[str, str] = {}
    for sc in scenarios.values():
        for p in sc["phases"]:
            name = p["name"]
            if not p["on_critical_path"] or name in letters:
                continue
            letter = next((ch for prefix, ch in _PHASE_LETTERS if name.startswith(prefix)), None)
            if letter is None:
                used = set(letters.values()) | {ch for _, ch in _PHASE_LETTERS}
                letter = next((ch for ch in name.upper() + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if ch.isalpha() and ch not in used), "?")
            letters[name] = letter
    return letters


def critical_path_bar(scenario: dict[str, Any], letters: dict[str, str], width: int) -> Text:
    """The critical path of ``scenario`` as one bar of ``width`` characters: per phase its letter
    then ``━`` for the rest of its share of the total (at least the letter; zero-second phases
    are left out)."""
    phases = [p for p in scenario["phases"] if p["on_critical_path"] and p["seconds"] > 0]
    total = sum(p["seconds"] for p in phases) or 1
    lengths = [max(1, round(p["seconds"] / total * width)) for p in phases]
    while sum(lengths) > width and max(lengths) > 1:
        lengths[lengths.index(max(lengths))] -= 1
    while phases and sum(lengths) < width:
        lengths[lengths.index(max(lengths))] += 1
    bar = Text()
    for i, (p, n) in enumerate(zip(phases, lengths, strict=True)):
        bar.append(letters[p["name"]] + _BAR_FILL * (n - 1), style=_BAR_STYLES[i % len(_BAR_STYLES)])
    return bar


def _section_time_to_ready(view: View) -> list[Text]:
    doc, width = view.doc, view.width
    scenarios = _alternative_scenarios(doc)
    if view.details:
        return _time_to_ready_details(view, scenarios)
    letters = _phase_letters(scenarios)
    rows = []
    for name, sc in scenarios.items():
        usd = f"USD {sc['gpu_usd']:,.0f}" if sc["gpu_usd"] is not None else "-"
        rows.append((scenario_title(name, doc, short=True), _duration(sc["total_seconds"]), usd, sc))
    title_w = max(len(r[0]) for r in rows)
    total_w = max(len("ready in"), *(len(r[1]) for r in rows))
    usd_w = max(len("GPU wait"), *(len(r[2]) for r in rows))
    lead = 2 + title_w + 2 + total_w + 2 + usd_w + 2
    bar_w = width - lead
    own_line = bar_w < 20  # too narrow for a bar beside the columns: the bar goes under its row
    lines = [_heading("time to ready"), *(Text(line) for line in wrap(_goal_line(doc), width, prefix="  "))]
    lines.append(_text("  " + "scenario".ljust(title_w) + "  " + "ready in".rjust(total_w) + "  " + "GPU wait".rjust(usd_w)
                       + ("" if own_line else "  critical path"), "dim"))
    for title, total, usd, sc in rows:
        row = Text("  " + title.ljust(title_w) + "  " + total.rjust(total_w) + "  " + usd.rjust(usd_w))
        if own_line:
            lines += [row, Text("    ") + critical_path_bar(sc, letters, width - 4)]
        else:
            lines.append(row + Text("  ") + critical_path_bar(sc, letters, bar_w))
    order = [ch for _, ch in _PHASE_LETTERS]
    used = sorted(set(letters.values()), key=lambda ch: (order.index(ch) if ch in order else len(order), ch))
    legend = [f"{letter} {_legend_name(letter, letters)}" for letter in used]
    lines += [Text(line, style="dim") for line in wrap_items(legend, width, prefix="  ")]
    lines += [Text(line, style="dim") for line in wrap(
        "each bar spans its scenario's total; every phase with its source: --details", width, prefix="  ")]
    if (slow := _first_deploy_range_line(doc)) is not None:
        lines += [Text(line) for line in wrap(slow, width, prefix="  ", indent="    ")]
    return lines


def _first_deploy_range_line(doc: dict[str, Any]) -> str | None:
    """The first deploy at both ends of the hub's range (None when no step reads the hub's range:
    a measured rate has one end)."""
    slow = doc.get("time_to_ready_first_deploy_slow")
    first = doc["time_to_ready"]["first_deploy"]
    hub = doc["sizing"]["hub_rate"]
    if not slow or slow["hub_download_seconds"] is None or slow["total_seconds"] == first["total_seconds"]:
        return None
    usd = (f"; GPU wait USD {first['gpu_usd']:,.0f}-{slow['gpu_usd']:,.0f}"
           if first["gpu_usd"] is not None and slow["gpu_usd"] is not None else "")
    return (f"first deploy {_duration(first['total_seconds'])}-{_duration(slow['total_seconds'])}{usd}: the hub "
            f"download at {hub['range']} (a hub is shared: the fast end is a public measurement, the slow end an "
            "estimate; set timeToReady.hubDownloadGBps once measured)")


def _legend_name(letter: str, letters: dict[str, str]) -> str:
    """The phases a letter marks, by the start of their names (``weight copy`` for ``weight copy
    mirror -> NVMe``); a phase without a listed letter by its whole name."""
    known = next((prefix for prefix, ch in _PHASE_LETTERS if ch == letter), None)
    return known or " / ".join(name for name, ch in letters.items() if ch == letter)


def _time_to_ready_details(view: View, scenarios: dict[str, Any]) -> list[Text]:
    """Every scenario with every phase: start, duration, a timeline bar, the name, the source."""
    doc, width = view.doc, view.width
    lines = [_heading("time to ready"), *(Text(line) for line in wrap(_goal_line(doc), width, prefix="  "))]
    bar_w = max(10, min(40, width // 3))
    for name, sc in scenarios.items():
        usd = f", GPU wait USD {sc['gpu_usd']:,.2f}" if sc["gpu_usd"] is not None else ""
        title = scenario_title(name, doc)
        lines.append(Text(""))
        lines += [_text(line, head=len(title) if i == 0 else 0) for i, line in enumerate(
            wrap(f"{title}: {_duration(sc['total_seconds'])} ({sc['total_seconds']:,} s){usd}", width, indent="  "))]
        lines.append(_text(f"  {'':1} {'start':>6} {'takes':>6}  {'timeline (* critical path)'.ljust(bar_w)}  phase", "dim"))
        for p in sc["phases"]:
            mark = "*" if p["on_critical_path"] else " "
            bar = _bar(p["start_seconds"], p["seconds"], sc["total_seconds"], bar_w).ljust(bar_w)
            row = f"  {mark} {_duration(p['start_seconds']):>6} {_duration(p['seconds']):>6}  {bar}  "
            lines += [_text(line, "bold" if p["on_critical_path"] else None)
                      for line in wrap(p["name"], width, prefix=row)]
            lines += [_text(line, "dim") for line in wrap(p["source"], width, prefix="      source: ", indent="        ")]
    lines.append(Text(""))
    for note in _alternative_notes(doc):
        lines += [Text(line) for line in wrap(note, width, prefix="  note: ", indent="    ")]
    return lines


def _resource_group(type_token: str) -> tuple[str, str]:
    """``(group, kind)`` of a Pulumi type token: AWS by service (``aws:ec2``, ``Subnet``), the
    providers under ``pulumi:providers``, every other package as a whole (``kubernetes``,
    ``Deployment``)."""
    package, _, rest = type_token.partition(":")
    module, _, kind = rest.rpartition(":")
    if package in ("aws", "pulumi"):
        return f"{package}:{module.split('/')[0]}", kind or rest
    return package, kind or rest


def _section_resources(view: View) -> list[Text]:
    resources = view.doc["resources"]
    if view.details:
        return _resources_details(view)
    groups: dict[str, Counter[str]] = {}
    for r in resources:
        group, kind = _resource_group(r["type"])
        groups.setdefault(group, Counter())[kind] += 1
    lines = [_heading(f"resources ({len(resources)})", "by type; each with its key inputs: --details")]
    for group in sorted(groups):
        kinds = groups[group]
        label = f"  {group} ({sum(kinds.values())}): "
        items = [k if n == 1 else f"{k} x{n}" for k, n in sorted(kinds.items())]
        lines += [_text(line, head=len(label) - 2 if i == 0 else 0)
                  for i, line in enumerate(wrap_items(items, view.width, prefix=label, indent="      "))]
    return lines


def _resources_details(view: View) -> list[Text]:
    doc, width = view.doc, view.width
    lines = [_heading(f"resources ({len(doc['resources'])})", "type, then each name with its key inputs")]
    by_type: dict[str, list[dict[str, Any]]] = {}
    for r in doc["resources"]:
        by_type.setdefault(r["type"], []).append(r)
    for type_token, items in by_type.items():
        lines += [_text(line, "bold") for line in wrap(type_token, width, prefix="  ")]
        for r in items:
            inputs = _summarize_inputs(r["inputs"])
            lines += [Text(line) for line in wrap(f"{r['name']}: {inputs}" if inputs else r["name"], width,
                                                  prefix="    ", indent="      ")]
    if doc["outputs"]:
        lines += [Text(""), _heading("outputs")]
        lines += _rows([(k, _output_text(v)) for k, v in doc["outputs"].items()], width, label_max=22)
    return lines


TABLE_SECTIONS: tuple[Callable[[View], list[Text]], ...] = (
    _section_summary,
    _section_blockers,
    _section_warnings,
    _section_commands,
    _section_weight_sync,
    _section_time_to_ready,
    _section_stage_then_serve,
    _section_resources,
)


def table_lines(doc: dict[str, Any], width: int, *, details: bool = False) -> list[Text]:
    """The table as lines for ``width`` columns: each non-empty section of ``TABLE_SECTIONS``,
    a blank line between them."""
    view = View(doc, max(TABLE_MIN_COLUMNS, min(TABLE_MAX_COLUMNS, width)), details)
    lines: list[Text] = []
    for section in TABLE_SECTIONS:
        part = section(view)
        if part:
            lines += ([Text("")] if lines else []) + part
    return lines


def render_table(doc: dict[str, Any], file=None, *, width: int | None = None, details: bool = False) -> None:
    """Print the plan for people to ``file`` (default standard output), laid out for ``width``
    columns (default: the terminal's, from rich: COLUMNS, else the terminal size, else 80)."""
    from rich.console import Console

    console = Console(file=file, width=width, highlight=False)
    for line in table_lines(doc, console.width, details=details):
        console.print(line, soft_wrap=True)


def make_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog=prog_name("scripts/ops/plan.py"),
        description="Offline plan of a kimi-deploy stack: every resource `pulumi up` would declare, "
        "the exact vLLM command per node role, sizing and cost. Needs no cloud account and no Pulumi CLI. "
        "Exit codes: 0 ok, 1 a secret found in a plain input, 2 usage or config error.",
    )
    parser.add_argument(
        "--stack",
        default=DEFAULT_STACK,
        help=f"stack name: stacks/Pulumi.<stack>.yaml (default {DEFAULT_STACK}; all: {', '.join(stack_names())})",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table for people (default), json for machines (one document), markdown for pull requests",
    )
    parser.add_argument(
        "--now", help="the clock as ISO 8601 (default: now); fixes trial expiries for reproducible plans and diffs"
    )
    parser.add_argument(
        "--diff-against",
        metavar="GIT_REF",
        help="show what changes against the stack as rendered at GIT_REF (a temporary git worktree); with --format "
             "markdown|json|table",
    )
    parser.add_argument("--output", metavar="FILE", help="write the result to FILE instead of standard output (any format)")
    parser.add_argument("--details", action="store_true",
                        help="table: every phase with its source per time-to-ready scenario, every resource with its key "
                             "inputs, the outputs and every role's full command (json and markdown always have them all)")
    parser.add_argument("--all", action="store_true",
                        help="plan every stack in stacks/ and print one line each: deployable, or refused by `pulumi up` "
                             "and the key that stops it (with --format json: one JSON list); exit 1 if any plan leaks a "
                             "secret, 2 if any config is invalid")
    parser.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                        help="progress lines on stderr (which stack, which phase; stdout's plan is unchanged): auto "
                             f"(default) on a terminal once a plan takes over {PROGRESS_AFTER_SECONDS:g} s, always from "
                             "the start, never")
    parser.add_argument("--strict", action="store_true",
                        help="exit 2 when `pulumi up` would refuse the stack (a blocker such as an engine build that cannot "
                             "serve the model); without it the plan is shown with the blocker at its top and exits 0")
    return parser


def _open_output(path: str | None):
    if not path:
        return None
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as err:
        raise ConfigError("--output", path, f"cannot be written: {err.strerror}") from None


def _kv_cache_layout(spec: Any, sizing: Any) -> dict[str, Any]:
    """The caches of one copy as the engine lays them out (``sizing.kv_layout``), one term each,
    and the memory per GPU they get (``kv_budget``)."""
    layout = sizing.kv_layout
    dcp = spec.config.vllm.decode_context_parallel_size
    return {
        "kv_cache_dtype": layout.kv_cache_dtype,
        "indexer_cache_dtype": layout.indexer_cache_dtype,
        "attention_backend": layout.attention_backend,
        "backend_source": layout.backend_source,
        "decode_context_parallel_size": dcp,
        "bytes_per_token_per_gpu": layout.bytes_per_token_per_gpu,
        "bytes_per_token_per_gpu_at_dcp": layout.bytes_per_token_per_gpu_at(dcp),
        "source": "vLLM's cache layout, kv_layout.py",
        "terms": [
            {
                "name": t.name,
                "layers": t.layers,
                "format": t.format,
                "bytes_per_token_per_layer": t.bytes_per_token_per_layer,
                "bytes_per_token_per_gpu": t.bytes_per_token_per_gpu,
                "dcp_sharded": t.dcp_sharded,
                "per_sequence": t.per_sequence,
                "source": t.source,
            }
            for t in layout.terms
        ],
        "budget": _memory_budget(sizing),
    }


def _memory_budget(sizing: Any) -> dict[str, Any]:
    """The per-GPU memory of one copy by named term (``sizing.memory``, ``engine_memory.py``) and the
    KV bytes and tokens they leave, low-high (the span of the estimate terms)."""
    memory = sizing.memory
    option = sizing.max_num_seqs_option
    return {
        "gpu_memory_bytes": memory.gpu_memory_bytes,
        "gpu_memory_utilization": memory.gpu_memory_utilization,
        "utilization_source": memory.utilization_source,
        "max_num_batched_tokens": memory.limits.max_num_batched_tokens,
        "max_num_seqs": memory.limits.max_num_seqs,
        "num_speculative_tokens": memory.limits.num_speculative_tokens,
        "batch_limits_source": memory.limits.source,
        "terms": [
            {"name": t.name, "low_bytes": t.low_bytes, "high_bytes": t.high_bytes, "transient": t.transient,
             "estimate": t.estimate, "source": t.source}
            for t in memory.terms
        ],
        "kv_bytes_per_gpu_low": memory.kv_bytes_low,
        "kv_bytes_per_gpu_high": memory.kv_bytes_high,
        "kv_cache_tokens_low": sizing.kv_cache_tokens_range[0],
        "kv_cache_tokens_high": sizing.kv_cache_tokens_range[1],
        "sizing_source": KV_SIZING_SOURCE,
        "kda_state_per_sequence": dataclasses.asdict(KDA_STATE_PER_SEQUENCE_ESTIMATE),
        "max_num_seqs_option": None if option is None else {
            "max_num_seqs": option.max_num_seqs, "current": option.current,
            "tokens_gained_low": option.tokens_gained[0], "tokens_gained_high": option.tokens_gained[1],
            "source": option.source,
        },
    }


def _kv_cache_claim(sizing: Any) -> dict[str, Any] | None:
    """The published KV claim beside the engine-layout figures for its setting, or None."""
    claim = sizing.kv_claim
    return None if claim is None else dataclasses.asdict(claim)


def verdict(doc: dict[str, Any]) -> str:
    """One line on whether `pulumi up` takes the stack: ``deployable``, or ``refused by `pulumi
    up`: <config keys of the blockers>`` and the command that shows why."""
    if doc["secret_leaks"]:
        leaks = ", ".join(f"kimi-deploy:{leak['secret']} in {leak['resource']}.{leak['path']}" for leak in doc["secret_leaks"])
        return f"FAILED: a secret appears in a plain input ({leaks})"
    if not doc["blockers"]:
        return "deployable"
    if doc["deployable"]:  # phase: stage: the blockers are the serve phase's
        return f"deployable (phase: stage; serve refused: {blocker_keys(doc)})"
    return f"refused by `pulumi up`: {blocker_keys(doc)} (`kimi-deploy plan --stack {doc['stack']}` says why)"


def blocker_keys(doc: dict[str, Any]) -> str:
    """The config keys of the plan's blockers, comma-separated (each blocker is a one-line
    ``ConfigError``: ``<key>: <value> <what is allowed>``)."""
    return ", ".join(dict.fromkeys(b.split(": ", 1)[0] for b in doc["blockers"]))


def plan_all(now: datetime, fmt: str, *, strict: bool = False) -> int:
    """``--all``: every stack's plan built (and serialized), one verdict line each (``verdict``),
    or with ``fmt == "json"`` a list of ``{stack, deployable, blockers, secret_leaks}``.
    Exit 2 if a stack's config is invalid (the others still run), or with ``strict`` if `pulumi up`
    refuses a stack (as ``--strict`` on one stack); else 1 if a plan leaks a secret, else 0."""
    names = stack_names()
    width = max(len(n) for n in names)
    results: list[dict[str, Any]] = []
    code = 0
    for name in names:
        try:
            doc = build_plan_document(name, now=now)
            json.dumps(doc)  # the JSON document must serialize, as --format json writes it
        except ConfigError as err:
            code = 2
            results.append({"stack": name, "error": str(err)})
            if fmt != "json":
                print(f"{name:<{width}}  error: {err}")
            continue
        if doc["secret_leaks"] and code == 0:
            code = 1
        results.append({"stack": name, "deployable": doc["deployable"], "blockers": doc["blockers"],
                        "secret_leaks": doc["secret_leaks"]})
        if fmt != "json":
            print(f"{name:<{width}}  {verdict(doc)}", flush=True)
    if fmt == "json":
        print(json.dumps(results, indent=2))
    refused = [r["stack"] for r in results if "deployable" in r and not r["deployable"]]
    if strict and refused and code != 2:
        print(f"error: `pulumi up` refuses {', '.join(refused)}; exit 2 (--strict)", file=sys.stderr)
        return 2
    return code


def _progress(stack: str, mode: str) -> PlanProgress | None:
    """``--progress``: None for ``never``, or ``auto`` where stderr is no terminal (a pipe or CI log
    keeps exactly what it kept); else a ``PlanProgress`` on stderr (``always``: from the start)."""
    if mode == "never" or (mode == "auto" and not sys.stderr.isatty()):
        return None
    return PlanProgress(stack, sys.stderr, 0.0 if mode == "always" else PROGRESS_AFTER_SECONDS)


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    progress: PlanProgress | None = None
    for flag, value in (("--diff-against", args.diff_against), ("--output", args.output)):
        if value is not None and not value.strip():  # read as unset it would silently do something else
            print(f"error: {flag}: {value!r} is empty; give a {'git ref' if flag == '--diff-against' else 'file'} or "
                  "leave the flag out", file=sys.stderr)
            return 2
    if args.output:
        try:  # never a stack file, Pulumi.yaml or a file holding secure: values
            check_output_path("--output", args.output)
        except UsageError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    try:
        now = _parse_now(args.now)
        if args.all:
            if args.diff_against or args.output or args.details or args.stack != DEFAULT_STACK:
                print("error: --all takes no --stack, --diff-against, --output or --details: it prints one line per "
                      "stack (see --help)", file=sys.stderr)
                return 2
            print_overlay_notice()
            return plan_all(now, args.format, strict=args.strict)
        if args.diff_against:
            from scripts.ops import plan_diff

            return plan_diff.main_diff(args.stack, args.diff_against, fmt=args.format, now=now, output=args.output)
        if args.format == "json" or args.output:  # a table or Markdown on stdout says it in its first line
            print_overlay_notice(stack=args.stack)
        progress = _progress(args.stack, args.progress)
        doc = build_plan_document(args.stack, now=now, progress=progress)
        out = _open_output(args.output)
    except ConfigError as err:
        if progress is not None:
            progress.done()
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        if progress is not None:
            progress.phase(f"rendering the {args.format}")
        if args.format == "json":
            (out or sys.stdout).write(json.dumps(doc, indent=2) + "\n")
        elif args.format == "markdown":
            (out or sys.stdout).write(render_markdown(doc))
        else:
            render_table(doc, file=out, details=args.details)
    finally:
        if out is not None:
            out.close()
        if progress is not None:
            progress.done()
    if doc["secret_leaks"]:
        for leak in doc["secret_leaks"]:
            print(
                f"error: secret kimi-deploy:{leak['secret']} appears in plain input {leak['resource']}.{leak['path']}",
                file=sys.stderr,
            )
        return 1
    if doc["blockers"] and not doc["deployable"]:
        # Said once: a table or Markdown on standard output shows the blockers at its top; JSON
        # and --output files are not read on the terminal, so there they go to stderr.
        if out is None and args.format in ("table", "markdown"):
            if args.strict:
                print(f"error: `pulumi up` refuses this stack: {blocker_keys(doc)} (why: above); exit 2 (--strict)",
                      file=sys.stderr)
        else:
            for b in doc["blockers"]:
                print(f"{'error' if args.strict else 'blocked'}: `pulumi up` refuses this stack: {b}", file=sys.stderr)
        return 2 if args.strict else 0
    return 0


if __name__ == "__main__":
    from scripts.ops._cli import run_cli

    code = run_cli(main)
    sys.stdout.flush()
    sys.stderr.flush()
    # Pulumi's mock monitor leaves per-thread asyncio loops that, collected at interpreter exit,
    # sometimes print "Exception ignored ... Invalid file descriptor: -1". Nothing is pending:
    # leave without the noisy teardown.
    os._exit(code)
