"""The plan's per-GPU memory terms against the pinned vLLM wheel's own sizing functions
(``tests/vllm_memory_probe.py`` runs them through ``KIMI_VLLM_PYTHON``), and every role's engine
settings against what the wheel computes for that role."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from components.core.load import load_stack
from components.core.model import KIMI_K3_1_PRO
from components.core.targets import GPUS
from components.core.vllm import build_vllm_command
from tests.conftest import FIXED_NOW, STACKS
from tests.vllm_contract import require_vllm_python

PROBE = Path(__file__).with_name("vllm_memory_probe.py")
WORKSPACE_ENV = "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE"
# What b300-prod (DCP8) set before: 2 GiB, sized for 8,192 batched tokens.
OLD_B300_PROD_ENV = {WORKSPACE_ENV: str(2 * 1024**3)}


def _flag(argv: tuple[str, ...], flag: str) -> str | None:
    found = None
    for i, arg in enumerate(argv):
        name, eq, inline = arg.partition("=")
        if name == flag:
            found = inline if eq else argv[i + 1]
    return found


def _roles() -> list[tuple[str, str, tuple[str, ...], dict[str, str], str]]:
    """``(stack, role, argv, env, gpu)`` for every role of every stack."""
    out = []
    for stack in STACKS:
        spec = load_stack(stack, now=FIXED_NOW)
        for role in build_vllm_command(spec).roles:
            out.append((stack, role.name, role.concrete_argv(), dict(role.env), spec.target.gpu.name))
    return out


def _workspace_case(argv: tuple[str, ...], gpu: str, defaults: dict[str, list[int]]) -> list[int]:
    """``[dcp, heads per rank, max_num_batched_tokens]`` of a role, as the engine derives them."""
    tp = int(_flag(argv, "--tensor-parallel-size") or 1)
    dcp = int(_flag(argv, "--decode-context-parallel-size") or 1)
    tokens = int(_flag(argv, "--max-num-batched-tokens") or defaults[gpu][0])
    return [dcp, KIMI_K3_1_PRO.attention.num_heads // tp, tokens]


def below_engine(env: dict[str, str], computed_workspace: int) -> list[str]:
    """The env settings of a role below what the engine computes for it (empty: none)."""
    value = env.get(WORKSPACE_ENV)
    return [] if value is None or int(value) >= computed_workspace else [f"{WORKSPACE_ENV}={value} < {computed_workspace}"]


def _run(request: dict) -> dict:
    python = require_vllm_python()
    proc = subprocess.run([str(python), str(PROBE)], input=json.dumps(request), capture_output=True, text=True,
                          timeout=900, check=False)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def wheel():
    """One probe run: the wheel's batch defaults per GPU, then the workspace of every role."""
    gpus = sorted(GPUS)
    first = _run({"batch_defaults": [[GPUS[g].memory_bytes, f"NVIDIA {g}"] for g in gpus]})
    defaults = dict(zip(gpus, first["batch_defaults"], strict=True))
    roles = _roles()
    workspace_cases = [_workspace_case(argv, gpu, defaults) for _, _, argv, _, gpu in roles]
    return {"defaults": defaults, "roles": roles, "role_workspaces": _run({"workspace": workspace_cases})["workspace"]}


def test_no_role_sets_an_engine_buffer_below_what_the_wheel_computes(wheel):
    """Every role of every stack: an explicit workspace env at least the wheel's
    ``compute_trtllm_sparse_mla_workspace_bytes`` for the role's DCP, heads and batch limit."""
    failures = []
    for (stack, role, _, env, _), computed in zip(wheel["roles"], wheel["role_workspaces"], strict=True):
        failures += [f"{stack}/{role}: {f}" for f in below_engine(env, computed)]
    assert not failures, failures
    assert any(c > 2 * 1024**3 for c in wheel["role_workspaces"]), "no DCP role: the check would not bite"


def test_the_role_check_catches_the_old_b300_prod_env(wheel):
    """b300-prod's former 2 GiB env is below what the wheel computes for its DCP8 role (3.6 GB at
    16,384 batched tokens): the check above reports it."""
    computed = next(c for (stack, _, _, _, _), c in zip(wheel["roles"], wheel["role_workspaces"], strict=True)
                    if stack == "b300-prod")
    assert below_engine(OLD_B300_PROD_ENV, computed)


def test_batch_defaults_are_the_wheel_s(wheel):
    """The defaults the memory terms are sized at (``batch_limits``) are the wheel's for every GPU."""
    from components.core.engine_memory import batch_limits

    for gpu, engine in wheel["defaults"].items():
        limits = batch_limits((), GPUS[gpu], 1_048_576)
        assert [limits.max_num_batched_tokens, limits.max_num_seqs] == engine, gpu


def test_plan_terms_are_the_wheel_s():
    """Workspace, indexer logits and K-gather buffers and the KV sizing, for TP and DCP8 at the
    defaults and with smaller batch limits and speculative tokens: the plan's functions give the
    wheel's bytes."""
    from components.core.engine_memory import (
        FLASHINFER_WORKSPACE_DEFAULT_BYTES,
        BatchLimits,
        indexer_gather_workspace_bytes,
        indexer_logits_bytes,
        measure_kv_cache_bytes,
        trtllm_sparse_mla_workspace_bytes,
    )

    workspace_cases = [[8, 12, 16384], [8, 12, 8192], [1, 12, 16384], [4, 24, 70000], [2, 48, 4096]]
    indexer_cases = [
        {"max_model_len": ml, "max_num_seqs": seqs, "max_num_batched_tokens": tokens, "num_speculative_tokens": spec,
         "dcp": dcp, "sm10x": sm10x, "topk": 2048, "head_dim": 128}
        for ml, seqs, tokens, spec, dcp, sm10x in [
            (1_048_576, 1024, 16384, 0, 1, True), (1_048_576, 1024, 16384, 0, 8, True), (1_048_576, 128, 4096, 0, 1, False),
            (1_048_576, 64, 16384, 0, 8, True), (262_144, 256, 8192, 2, 1, True), (200_000, 1024, 16384, 0, 1, True),
        ]
    ]
    kv_cases = [
        {"total_bytes": 288_400_000_000, "requested_bytes": r, "non_kv_used_bytes": n, "transient_peak_bytes": t}
        for r, n, t in [(288_400_000_000, 200_000_000_000, 6_000_000_000), (288_400_000_000, 201_000_000_000, 500_000_000),
                        (273_980_000_000, 200_000_000_000, 14_000_000_000)]
    ]
    engine = _run({"workspace": workspace_cases, "indexer": indexer_cases, "kv": kv_cases})
    assert engine["workspace_default"] == FLASHINFER_WORKSPACE_DEFAULT_BYTES
    base = FLASHINFER_WORKSPACE_DEFAULT_BYTES
    assert [trtllm_sparse_mla_workspace_bytes(base, *c) for c in workspace_cases] == engine["workspace"]
    mine = []
    for c in indexer_cases:
        limits = BatchLimits(c["max_num_batched_tokens"], c["max_num_seqs"], c["num_speculative_tokens"], "test")
        mine.append({
            "logits_bytes": indexer_logits_bytes(c["max_model_len"], limits, decode_context_parallel_size=c["dcp"],
                                                 sm10x=c["sm10x"], index_topk=c["topk"]),
            "gather_bytes": indexer_gather_workspace_bytes(c["max_model_len"], c["head_dim"] + 4),
        })
    assert mine == engine["indexer"]
    assert [measure_kv_cache_bytes(vendor="nvidia", **c) for c in kv_cases] == engine["kv"]


def test_b300_budget_names_every_term_and_renders_no_utilization():
    """b300 at TP8: no --gpu-memory-utilization rendered, the budget at 1.0 x HBM, and the KV range
    from the named terms (indexer logits buffer 2,148,532,224 B included)."""
    from components.core.engine_memory import INDEXER_LOGITS
    from components.core.sizing import compute_sizing

    spec = load_stack("b300", now=FIXED_NOW)
    sizing = compute_sizing(spec)
    argv = build_vllm_command(spec, sizing).role("server").argv
    assert "--gpu-memory-utilization" not in argv
    memory = sizing.memory
    assert memory.gpu_memory_utilization == 1.0 and memory.utilization_source.startswith("engine default")
    assert memory.term(INDEXER_LOGITS).low_bytes == 2_148_532_224
    low, high = sizing.kv_cache_tokens_range
    assert 2_411_742 < low < high and sizing.kv_cache_tokens == low
    assert all(t.source for t in memory.terms)


def test_extra_args_batch_limits_resize_the_terms():
    """``--max-num-seqs`` / ``--max-num-batched-tokens`` in extraArgs change the indexer buffer and
    the DCP workspace the plan sizes (the effective values are read from the command)."""
    from components.core.engine_memory import FLASHINFER_WORKSPACE, INDEXER_LOGITS
    from components.core.load import parse_spec
    from components.core.sizing import compute_sizing
    from tests.test_config import base

    def sizing(extra: list[str]):
        ns = base("b300-prod")
        ns["vllm"] = {**ns["vllm"], "extraArgs": extra}
        return compute_sizing(parse_spec(ns, stack="t", now=FIXED_NOW))

    default, small = sizing([]), sizing(["--max-num-seqs", "64", "--max-num-batched-tokens=8192"])
    assert small.memory.term(INDEXER_LOGITS).low_bytes < default.memory.term(INDEXER_LOGITS).low_bytes
    assert small.memory.term(FLASHINFER_WORKSPACE).low_bytes < default.memory.term(FLASHINFER_WORKSPACE).low_bytes
    assert small.kv_cache_tokens > default.kv_cache_tokens
    assert default.max_num_seqs_option is not None and small.max_num_seqs_option is None


def test_batch_limits_read_the_last_flag_of_either_spelling_and_refuse_bad_values():
    from components.core.engine_memory import batch_limits
    from components.core.errors import ConfigError
    from components.core.load import parse_spec
    from components.core.sizing import compute_sizing
    from tests.test_config import base

    b300 = GPUS["B300"]
    limits = batch_limits(("--max-num-seqs", "64", "--max-num-seqs=32", "--speculative-config", '{"num_speculative_tokens":3}'),
                          b300, 1_048_576)
    assert (limits.max_num_batched_tokens, limits.max_num_seqs, limits.num_speculative_tokens) == (16_384, 32, 3)
    assert batch_limits(("--max-num-batched-tokens", "8K"), b300, 1_048_576).max_num_batched_tokens == 8_192
    ns = base("b300")
    ns["vllm"] = {**ns["vllm"], "extraArgs": ["--max-num-batched-tokens", "lots"]}
    with pytest.raises(ConfigError) as info:
        compute_sizing(parse_spec(ns, stack="t", now=FIXED_NOW))
    assert str(info.value).startswith("kimi-deploy:vllm.extraArgs:") and "lots" in str(info.value)
