#!/usr/bin/env python3
"""Offline plan: everything `pulumi up` would declare for a stack, with no cloud account.

Runs the real Pulumi program (``__main__.py`` -> ``components.program``) under Pulumi's mock
engine with the stack's config, records every resource and its inputs, and prints a summary
(target, nodes x GPUs, storage, load time, startup budget, KV tokens, cost), the exact
``vllm serve`` command per node role, the weight-sync runs and the resource table.

Values that exist only after ``pulumi up`` (ids, addresses, generated names) print as
``<known after pulumi up>`` (``components.plan_engine.KNOWN_AFTER_UP``); example values shipped in
``stacks/`` print a warning until replaced (``components.core.examples``).

Exit codes: 0 ok; 1 the plan found a problem (a secret in a plain input); 2 usage or config error.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: its folder is on sys.path, the project may not be installed here
    import _cli  # noqa: F401  first: a missing package (or the project itself) prints `make setup`, not a traceback

from components.core.config import STACKS_DIR, ConfigError, format_utc, load_stack, parse_utc, read_stack_config, stack_names
from scripts._cli import CliParser, prog_name

REPO_ROOT = Path(__file__).resolve().parents[1]

DEFAULT_STACK = "b300"
FORMATS = ("table", "json", "markdown")


def _parse_now(text: str | None) -> datetime:
    if not text:
        return datetime.now(UTC).replace(microsecond=0)
    return parse_utc(text, "--now")


def build_plan_document(stack: str, *, now: datetime | None = None, stacks_dir: Path | None = None) -> dict[str, Any]:
    """The offline plan of ``stack`` as one JSON-serializable document.

    Keys: ``stack``, ``target``, ``platform``, ``environment``, ``model`` {id, revision,
    revision_is_commit, source, weights_bytes, files}, ``nodes`` {gpu_nodes, nodes_per_copy,
    gpus_per_node, replicas, instance_type}, ``sizing`` {storage_kind, storage_capacity_gib,
    fsx_capacity_gib, fsx_throughput_per_tib_mbps, read_bytes_per_second, load_seconds,
    startup_budget_seconds, kv_cache_tokens, kv_cache_tokens_tp, kv_cache_tokens_dcp,
    max_model_len, download_seconds_at_100MBps, usd_per_hour, price_source}, ``vllm``
    {image, served_model_names, port, tensor_parallel_size, decode_context_parallel_size,
    roles [{name, nodes, argv, env, secret_env}]}, ``weight_sync`` [{name, source, dest,
    per_node}], ``expires_at``, ``warnings``, ``resources`` [{type, name, inputs}],
    ``outputs``, ``secret_leaks``. Secret values appear only as ``[secret]``.

    Raises:
        ConfigError: the stack file is missing or invalid (one line).
    """
    from components.core.sizing import compute_sizing, first_deploy_seconds, sync_expected_seconds
    from components.core.vllm import build_vllm_command
    from components.core.weights import sync_steps
    from components.plan_engine import run_program

    now = now or datetime.now(UTC).replace(microsecond=0)
    stacks_dir = stacks_dir or STACKS_DIR
    spec = load_stack(stack, now=now, stacks_dir=stacks_dir)  # validates before anything is declared
    sizing = compute_sizing(spec)
    command = build_vllm_command(spec, sizing)
    run = run_program(read_stack_config(stack, stacks_dir=stacks_dir), stack=stack, now=now, allow_blockers=True)
    mirror_bucket = run.outputs.get("mirrorBucket") if spec.config.storage.mirror.enabled else None
    if spec.config.storage.mirror.enabled and not mirror_bucket:
        mirror_bucket = spec.config.storage.mirror.bucket_name or "<mirror-bucket>"
    steps = sync_steps(spec, mirror_bucket if spec.config.storage.mirror.enabled else None)
    st = sizing.storage
    # Registration order under the mock engine depends on async scheduling: sort for
    # reproducible documents and diffs.
    resources = sorted(run.resources, key=lambda r: (r.type, r.name))
    return {
        "stack": stack,
        "target": spec.target.name,
        "target_display": spec.target.display_name,
        "platform": spec.platform,
        "environment": spec.environment,
        "region": spec.region,
        "availability_zone": spec.availability_zone,
        "model": {
            "id": spec.hub_repo,
            "profile": spec.model.name,
            "revision": spec.revision,
            "revision_is_commit": spec.revision_is_commit,
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
            "kv_cache_model": _kv_cache_model(spec.model),
            "max_model_len": sizing.max_model_len,
            "full_context_sequences": sizing.full_context_sequences,
            "download_seconds_at_100MBps": sizing.download_seconds_at_100MBps,
            "first_deploy_seconds": first_deploy_seconds(spec, sizing, steps),
            "usd_per_hour": sizing.usd_per_hour,
            "price_source": sizing.price_source,
        },
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
        "expires_at": run.outputs.get("expiresAt"),
        "expires_rule": _expiry_rule(spec),
        "protect": spec.protect,
        "warnings": list(spec.warnings),
        # What stops `pulumi up` (the program raises the first) although the plan renders.
        "blockers": [str(b) for b in spec.blockers],
        # A stage declares no engine: a build that cannot serve blocks serve only (config/phase.py).
        "deployable": not spec.blockers or spec.staging,
        # Provider-computed values (ids, addresses, generated names) show as KNOWN_AFTER_UP.
        "resources": run.mark_computed([{"type": r.type, "name": r.name, "inputs": r.inputs} for r in resources]),
        "outputs": run.mark_computed(run.outputs),
        "secret_leaks": [{"secret": k, "resource": n, "path": p} for k, n, p in run.secret_leaks],
        "generated_at": format_utc(now),
        **scaling_section(spec, sizing),
        **_time_to_ready_section(spec, sizing, steps),
        **_stage_then_serve_section(spec, sizing, steps),
    }


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


def _stage_then_serve_notes(doc: dict[str, Any]) -> list[str]:
    """What runs the stage, when to switch, and the reservation note where it applies."""
    sts = doc["stage_then_serve"]
    notes = [f"staging on {sts['staging_compute']}; switch to serve at {_duration(sts['switch_at_seconds'])}, "
             f"when {sts['switch_when']}"]
    return notes + ([sts["reservation_note"]] if sts["reservation_note"] else [])


def _stage_then_serve_table(doc: dict[str, Any], console) -> None:
    """The section for people: the rows of ``stage_then_serve_rows`` and the reservation note."""
    from rich.markup import escape
    from rich.table import Table

    rows = stage_then_serve_rows(doc)
    if not rows:
        console.print("\n" + _stage_then_serve_lines(doc)[-1].replace("**", ""), highlight=False, markup=False)
        return
    table = Table(title=f"\nstage, then serve (this stack's phase: {doc['phase']})", title_justify="left")
    for column in ("path", "time to ready", "GPU USD", "staging USD"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    console.print(table)
    for note in _stage_then_serve_notes(doc):
        console.print("  " + note, highlight=False, markup=False, soft_wrap=True)


def _stage_then_serve_lines(doc: dict[str, Any]) -> list[str]:
    """The section as text lines (markdown table; the table renderer prints the same rows)."""
    rows = stage_then_serve_rows(doc)
    if not rows:
        return ["", "**Stage, then serve**: no S3 mirror, nothing to stage (phase: stage needs one)."]
    lines = ["", f"**Stage, then serve** (this stack's phase: {doc['phase']})", "",
             "| path | time to ready | GPU USD | staging USD |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return lines + [""] + [f"> {note}" for note in _stage_then_serve_notes(doc)]


def _time_to_ready_section(spec, sizing, steps) -> dict[str, Any]:
    """``time_to_ready`` {first_deploy, repeat_trial, replaced_node: {total_seconds, gpu_usd,
    phases [{name, start_seconds, seconds, source, on_critical_path}]}}, ``time_to_ready_goal``
    {scenario, from, goal_seconds, modelled_seconds, met} and ``time_to_ready_alternatives``
    {runai_streamer: {repeat_trial, note}} (``components/core/time_to_ready.py``)."""
    from components.core.time_to_ready import ENGINE_CACHE_NOTE, RUNAI_STREAMER_NOTE, time_to_ready

    model = time_to_ready(spec, sizing, steps)
    stream = model.streamer_repeat_trial
    return {
        "time_to_ready": model.as_json(),
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
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _output_text(value: Any) -> str:
    """A stack output for people: strings as they are, ``(none)`` for an output without a value
    (e.g. ``gpuUsdPerHour`` where no public price exists), JSON for the rest."""
    if value is None:
        return "(none)"
    return value if isinstance(value, str) else json.dumps(value)


def _summarize_inputs(inputs: dict[str, Any], limit: int = 110) -> str:
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
    text = ", ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Plurals that are not word + "s".
_IRREGULAR_PLURALS = {"copy": "copies"}


def _plural(count: int, word: str) -> str:
    """``1 copy``, ``2 copies``, ``1,200 files`` (thousands separated)."""
    return f"{count:,} " + (word if count == 1 else _IRREGULAR_PLURALS.get(word, word + "s"))


def summary_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """The plan's summary as ``(label, text)`` rows, shared by the table and Markdown."""
    sz, nodes, model = doc["sizing"], doc["nodes"], doc["model"]
    price = f"USD {sz['usd_per_hour']:.2f}/h ({sz['price_source']})" if sz["usd_per_hour"] else sz["price_source"]
    where = ""
    if doc["region"]:
        where = f"  ({doc['region']}" + (f", AZ {doc['availability_zone']})" if doc["availability_zone"] else ")")
    available = f"{sz['storage_capacity_gib']:,}" if sz["storage_capacity_gib"] else "?"
    storage = f"{sz['storage_kind']}: {available} GiB available, {sz['storage_needed_gib']:,} GiB needed"
    if sz["fsx_capacity_gib"]:
        storage += f"; FSx {sz['fsx_capacity_gib']:,} GiB x {sz['fsx_throughput_per_tib_mbps']:,} MB/s/TiB"
    mirror = any(s["name"] == "publish-mirror" for s in doc["weight_sync"])
    download = _duration(sz["download_seconds_at_100MBps"]) + " at 100 MB/s " + (
        "(once, into the in-region mirror)" if mirror else "(on every node: this stack has no mirror)"
    )
    steps = " + ".join(f"{s['name']} {_duration(s['expected_seconds'])}" for s in doc["weight_sync"])
    first = (f"about {_duration(sz['first_deploy_seconds'])} with nothing downloaded yet (infrastructure, image pull, {steps}, "
             "load, engine init; see time to ready)")
    ttl = doc["expires_at"] and not doc["expires_rule"].startswith("explicit")
    expires = doc["expires_rule"] + (f" -> {doc['expires_at']} if created now" if ttl else "")
    return [
        ("target", doc["target_display"]),
        ("platform / environment", f"{doc['platform']} / {doc['environment']}{where}"),
        (
            "GPU nodes",
            f"{nodes['gpu_nodes']}x {nodes['instance_type']} = {_plural(nodes['replicas'], 'copy')} x "
            f"{_plural(nodes['nodes_per_copy'], 'node')} x {_plural(nodes['gpus_per_node'], 'GPU')}; capacity: "
            f"{nodes['capacity']}",
        ),
        (
            "model",
            f"{model['id']} @ {model['revision']}  ({model['weights_bytes'] / 1e12:.2f} TB, {_plural(model['files'], 'file')}, "
            f"from {model['source']})",
        ),
        ("storage", storage),
        (
            "weight load",
            f"{_duration(sz['load_seconds'])} at {sz['read_bytes_per_second'] / 1e9:.1f} GB/s per node  ({sz['read_source']})",
        ),
        (
            "startup budget",
            f"{_duration(sz['startup_budget_seconds'])} ({sz['startup_budget_seconds']:,} s)  (startup probe, "
            "VLLM_ENGINE_READY_TIMEOUT_S, Pulumi timeouts)",
        ),
        (
            "KV cache",
            f"{sz['kv_cache_tokens']:,} tokens per copy  (TP only: {sz['kv_cache_tokens_tp']:,}); "
            f"{sz['full_context_sequences']} x {sz['max_model_len']:,}-token sequences"
            + (f"  ({sz['kv_cache_model']['label']})" if sz.get("kv_cache_model") else ""),
        ),
        ("hub download", download),
        ("first deploy", first),
        ("cost", price),
        ("expires", expires),
    ] + scaling_rows(doc)


def render_markdown(doc: dict[str, Any]) -> str:
    """The plan as Markdown (pull-request comments, docs)."""
    lines = [f"### Plan: `{doc['stack']}` — {doc['target_display']}", "", "| | |", "|---|---|"]
    lines += [f"| {label} | {text.replace('|', '/').replace('<', '&lt;')} |" for label, text in summary_rows(doc)]
    lines.append("")
    for b in doc["blockers"]:
        lines.append(f"> ⛔ **`pulumi up` refuses this stack:** {b}")
    for w in doc["warnings"]:
        lines.append(f"> ⚠ {w}")
    lines.append("")
    for role in doc["vllm"]["roles"]:
        lines.append(f"**vLLM {role['name']}** ({_plural(role['nodes'], 'node')} per copy), image `{doc['vllm']['image']}`")
        lines.append("```sh")
        env = [f"{k}={shlex.quote(v)}" for k, v in role["env"].items()]
        env += [f"{k}=<{v}>" for k, v in role["secret_env"].items()]
        lines.append(" \\\n".join(env) + " \\\n  " + " \\\n  ".join(_argv_lines(role["argv"])))
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


_SCENARIO_TITLES = {
    "first_deploy": "first deploy (empty mirror)",
    "repeat_trial": "repeat trial (mirror full)",
    "replaced_node": "replaced node",
    "repeat_trial_runai_streamer": "repeat trial, --load-format runai_streamer from the mirror (alternative)",
    "repeat_trial_engine_cache": "repeat trial with the engine caches restored (alternative: not wired on this platform)",
}


def _goal_line(doc: dict[str, Any]) -> str:
    goal = doc["time_to_ready_goal"]
    verdict = "met" if goal["met"] else "NOT met"
    return (f"goal: repeat trial ready within {_duration(goal['goal_seconds'])} of the {goal['from']}: "
            f"modelled {_duration(goal['modelled_seconds'])} ({goal['modelled_seconds']} s), {verdict}")


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
        title = _SCENARIO_TITLES[name]
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


def _time_to_ready_table(doc: dict[str, Any], console) -> None:
    """The time-to-ready section for people: a bar per phase, critical phases in bold."""
    from rich.markup import escape
    from rich.table import Table

    console.print("\n[bold]time to ready[/bold]  " + escape(_goal_line(doc)), highlight=False)
    for name, sc in _alternative_scenarios(doc).items():
        title = _SCENARIO_TITLES[name]
        usd = f", GPU wait USD {sc['gpu_usd']:,.2f}" if sc["gpu_usd"] is not None else ""
        table = Table(title=f"{title}: {_duration(sc['total_seconds'])}{usd}", title_justify="left")
        table.add_column("phase")
        table.add_column("start", justify="right")
        table.add_column("duration", justify="right")
        table.add_column("timeline (* = critical path)", no_wrap=True)
        table.add_column("source", overflow="fold")
        for p in sc["phases"]:
            mark = "*" if p["on_critical_path"] else " "
            table.add_row(escape(p["name"]), _duration(p["start_seconds"]), _duration(p["seconds"]),
                          mark + _bar(p["start_seconds"], p["seconds"], sc["total_seconds"]), escape(p["source"]),
                          style="bold" if p["on_critical_path"] else None)
        console.print(table)
    for note in _alternative_notes(doc):
        console.print("  " + note, highlight=False, markup=False, soft_wrap=True)


def _argv_lines(argv: list[str]) -> list[str]:
    """Group argv into 'flag value' lines for reading."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        cur = shlex.quote(argv[i])
        if i == 0 and len(argv) > 2:
            out.append(" ".join(shlex.quote(a) for a in argv[:3]))
            i = 3
            continue
        if argv[i].startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            values = []
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                values.append(shlex.quote(argv[j]))
                j += 1
            out.append(" ".join([cur, *values]))
            i = j
        else:
            out.append(cur)
            i += 1
    return out


def render_table(doc: dict[str, Any], file=None) -> None:
    """Print the plan for people (rich), to ``file`` (default standard output)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    interactive = file is None and sys.stdout.isatty()
    console = Console(file=file, width=None if interactive else 150, soft_wrap=False)
    summary = Table(title=f"kimi-deploy plan: {doc['stack']}", show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    for label, text in summary_rows(doc):
        summary.add_row(label, escape(text))
    console.print(summary)
    for b in doc["blockers"]:
        console.print(
            "[bold red]blocked: `pulumi up` refuses this stack:[/bold red] " + escape(b), soft_wrap=True, highlight=False
        )
    for w in doc["warnings"]:
        console.print("[yellow]warning:[/yellow] " + escape(w), soft_wrap=True, highlight=False)
    for role in doc["vllm"]["roles"]:
        console.print(
            f"\n[bold]vLLM {role['name']}[/bold] ({_plural(role['nodes'], 'node')} per copy)  image "
            + escape(doc["vllm"]["image"]),
            highlight=False,
        )
        for k, v in {**role["env"], **role["secret_env"]}.items():
            console.print(f"  {k}={v}", highlight=False, markup=False, soft_wrap=True)
        console.print("  " + " \\\n    ".join(_argv_lines(role["argv"])), highlight=False, markup=False, soft_wrap=True)
    console.print("\n[bold]weight sync[/bold]", highlight=False)
    for step in doc["weight_sync"]:
        where = "on every GPU node" if step["per_node"] else "once"
        console.print(
            f"  {step['name']} ({where}, about {_duration(step['expected_seconds'])}): {step['source']} -> {step['dest']}",
            highlight=False, markup=False, soft_wrap=True,
        )
    _time_to_ready_table(doc, console)
    _stage_then_serve_table(doc, console)
    table = Table(title=f"\nresources ({len(doc['resources'])})", title_justify="left")
    table.add_column("type", overflow="fold")
    table.add_column("name", overflow="fold")
    table.add_column("key inputs", overflow="fold")
    for r in doc["resources"]:
        table.add_row(escape(r["type"]), escape(r["name"]), escape(_summarize_inputs(r["inputs"])))
    console.print(table)
    if doc["outputs"]:
        out = Table(title="outputs", title_justify="left", show_header=False)
        out.add_column(style="bold")
        out.add_column(overflow="fold")
        for k, v in doc["outputs"].items():
            out.add_row(k, escape(_output_text(v)))
        console.print(out)


def make_parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog=prog_name("scripts/plan.py"),
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


def _kv_cache_model(model: Any) -> dict[str, Any] | None:
    """The plan's account of how its KV figures were obtained (``ModelProfile.kv_fit``), or None."""
    fit = model.kv_fit
    if fit is None:
        return None
    return {
        "label": fit.label,
        "formula": fit.formula,
        "figures": list(fit.figures),
        "fitted": dict(fit.fitted),
        "independent_check": fit.independent_check,
    }


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        now = _parse_now(args.now)
        if args.diff_against:
            from scripts import plan_diff

            return plan_diff.main_diff(args.stack, args.diff_against, fmt=args.format, now=now, output=args.output)
        doc = build_plan_document(args.stack, now=now)
        out = _open_output(args.output)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        if args.format == "json":
            (out or sys.stdout).write(json.dumps(doc, indent=2) + "\n")
        elif args.format == "markdown":
            (out or sys.stdout).write(render_markdown(doc))
        else:
            render_table(doc, file=out)
    finally:
        if out is not None:
            out.close()
    if doc["secret_leaks"]:
        for leak in doc["secret_leaks"]:
            print(
                f"error: secret kimi-deploy:{leak['secret']} appears in plain input {leak['resource']}.{leak['path']}",
                file=sys.stderr,
            )
        return 1
    if doc["blockers"]:
        for b in doc["blockers"]:
            print(f"{'error' if args.strict else 'blocked'}: `pulumi up` refuses this stack: {b}", file=sys.stderr)
        return 2 if args.strict else 0
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Pulumi's mock monitor leaves per-thread asyncio loops that, collected at interpreter exit,
    # sometimes print "Exception ignored ... Invalid file descriptor: -1". Nothing is pending:
    # leave without the noisy teardown.
    os._exit(code)
