"""KV capacity from the engine's own cache layout (components/core/kv_layout.py): one term per cache
with its bytes per token per GPU and DCP sharding, checked against the installed vLLM's own code
(tests/vllm_kv_probe.py), the sizing and plan built on it, the recipe's claim beside it, the
measured override (vllm.kvCacheTokens) and the MXFP4 indexer key (vllm.indexerCacheDtype) from
config to argv to the plan's figure."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from components.core.kv_layout import (
    DEFAULT_BACKEND_SOURCE,
    FLASHINFER_MLA_SPARSE,
    FLASHMLA_SPARSE,
    FP8_DS_MLA_ROW_BYTES,
    KV_CACHE_ELEMENT_BYTES,
    SM10X_SPARSE_BACKEND_ORDER,
    SPARSE_BACKEND_KV_DTYPES,
    indexer_entry_bytes,
    mla_format,
    model_layout,
    mxfp4_indexer_supported,
    named_attention_backend,
    recipe_argv,
)
from components.core.load import parse_spec
from components.core.model import KIMI_K3_1_PRO
from components.core.sizing import compute_sizing
from components.core.targets import GPUS
from components.core.vllm import build_vllm_command, merge_attention_config
from scripts.ops import plan as plan_script
from tests.conftest import FIXED_NOW
from tests.test_config import base
from tests.vllm_contract import check_argvs, require_vllm_python

B300 = GPUS["B300"]
GEOMETRY = KIMI_K3_1_PRO.cache_geometry
PROBE = Path(__file__).with_name("vllm_kv_probe.py")


def spec_of(cfg: dict):
    return parse_spec(cfg, stack="test", now=FIXED_NOW, secrets_set=frozenset())


def with_vllm(stack: str = "b300", **keys) -> dict:
    cfg = base(stack)
    cfg["vllm"] = {**cfg.get("vllm", {}), **keys}
    return cfg


# --- the layout ---------------------------------------------------------------------------------


def test_b300_fp8_row_is_latent_plus_indexer_keys_in_flashinfer_format():
    """No backend named on an SM10x GPU with FP8 KV: vLLM picks FLASHINFER_MLA_SPARSE, which keeps
    the per-tensor FP8 latent (576 B); every DSA layer also caches a 132 B indexer key."""
    layout = model_layout(KIMI_K3_1_PRO, "fp8", B300)
    mla, index, kda = layout.terms
    assert (mla.layers, mla.format, mla.bytes_per_token_per_layer) == (24, "fp8", 576)
    assert (index.layers, index.format, index.bytes_per_token_per_layer) == (24, "fp8", 132)
    assert kda.per_sequence and kda.layers == 69 and kda.bytes_per_token_per_gpu == 0
    assert mla.dcp_sharded and index.dcp_sharded and not kda.dcp_sharded
    assert layout.bytes_per_token_per_gpu == 24 * (576 + 132) == 16_992
    assert layout.attention_backend == FLASHINFER_MLA_SPARSE and layout.backend_source == DEFAULT_BACKEND_SOURCE
    assert all("vLLM 0.34.0" in t.source for t in layout.terms)


def test_flashmla_sparse_stores_the_656_byte_fp8_ds_mla_row():
    """Named FLASHMLA_SPARSE (or given as the --attention-config backend): the fp8_ds_mla row,
    24 x (656 + 132) = 18,912 B per token: about 2.17M tokens at TP8 on b300."""
    for argv in (("--attention-backend", FLASHMLA_SPARSE), (f"--attention-backend={FLASHMLA_SPARSE}",),
                 ("--attention-config", json.dumps({"backend": FLASHMLA_SPARSE}))):
        layout = model_layout(KIMI_K3_1_PRO, "fp8", B300, argv=argv)
        assert layout.terms[0].format == "fp8_ds_mla" and layout.bytes_per_token_per_gpu == 18_912, argv
        assert layout.backend_source == "named in the command"
    budget = 41_000_000_000
    named = model_layout(KIMI_K3_1_PRO, "fp8", B300, argv=("--attention-backend", FLASHMLA_SPARSE))
    assert named.tokens(budget) == budget // 18_912 < model_layout(KIMI_K3_1_PRO, "fp8", B300).tokens(budget)


@pytest.mark.parametrize("dtype,indexer,expected", [
    ("auto", "fp8", 24 * (1_152 + 132)),
    ("bfloat16", "fp8", 24 * (1_152 + 132)),
    ("fp8", "mxfp4", 24 * (576 + 68)),
    ("fp8_e4m3", "fp8", 24 * (576 + 132)),
])
def test_bytes_per_token_by_dtype(dtype, indexer, expected):
    assert model_layout(KIMI_K3_1_PRO, dtype, B300, indexer_cache_dtype=indexer).bytes_per_token_per_gpu == expected


def test_dcp_divides_every_sharded_cache():
    """Both DSA caches shard over DCP ranks: DCP8 holds 8x the tokens of TP8 in the same memory
    (not the 0.89 x 8 the recipe's figures implied)."""
    budget = 41_000_000_000
    layout = model_layout(KIMI_K3_1_PRO, "fp8", B300)
    assert layout.tokens(budget, 8) == budget * 8 // layout.bytes_per_token_per_gpu
    assert layout.bytes_per_token_per_gpu_at(8) == layout.bytes_per_token_per_gpu / 8
    tp, dcp = layout.tokens(budget, 1), layout.tokens(budget, 8)
    assert 8 * tp <= dcp < 8 * (tp + 1)


def test_named_backend_is_the_last_one_argparse_keeps():
    assert named_attention_backend(()) is None
    assert named_attention_backend(("--attention-config", '{"use_prefill_query_quantization":true}')) is None
    assert named_attention_backend(("--attention-backend", "A", "--attention-backend=B")) == "B"
    assert named_attention_backend(("--attention-backend", "A", "--attention-config", '{"backend":"C"}')) == "C"
    assert named_attention_backend(("--attention-config", "not json", "--attention-backend", "D")) == "D"


def test_recipe_argv_takes_the_dcp_flags_in_place_of_the_recipe_ones():
    recipe = KIMI_K3_1_PRO.recipes["cuda"]
    tp, dcp = recipe_argv(recipe, 1), recipe_argv(recipe, 8)
    assert tp.count("--attention-config") == 1 and dcp.count("--attention-config") == 1
    assert dict(recipe.dcp_flags)["--attention-config"] in dcp
    assert "--dcp-comm-backend" not in tp


# --- the sizing and the plan ----------------------------------------------------------------------


def test_b300_plan_figure_includes_the_indexer_keys():
    """The plan's KV figure comes from the engine's layout (16,992 B/token at TP8 on b300, FP8, no
    backend named) over the KV bytes the named memory terms leave, low end first."""
    sizing = compute_sizing(spec_of(base("b300")))
    assert sizing.kv_cache_tokens_tp == sizing.memory.kv_bytes_low // 16_992
    assert sizing.kv_cache_tokens_range_tp == (sizing.kv_cache_tokens_tp, sizing.memory.kv_bytes_high // 16_992)
    assert sizing.kv_layout.bytes_per_token_per_gpu == 16_992
    assert sizing.kv_cache_source.startswith("estimate: ") and "16,992 B per token" in sizing.kv_cache_source


def test_the_recipe_claim_is_shown_beside_with_the_difference():
    claim = compute_sizing(spec_of(base("b300"))).kv_claim
    assert claim is not None
    assert (claim.claim_tokens_tp, claim.claim_tokens_dcp, claim.claim_bytes_per_token) == (2_600_000, 18_500_000, 15_744)
    assert claim.engine_bytes_per_token == 16_992 and claim.engine_tokens_tp[0] < claim.engine_tokens_tp[1]
    assert "15,744 B/token" in claim.difference and "indexer keys (24 x 132 B)" in claim.difference
    assert "16,992 B/token" in claim.difference and "\n" not in claim.difference


def test_plan_document_and_details_show_the_layout_and_the_claim():
    doc = plan_script.build_plan_document("b300", now=FIXED_NOW)
    sz = doc["sizing"]
    terms = {t["name"]: t for t in sz["kv_cache_layout"]["terms"]}
    assert terms["DSA indexer keys"]["bytes_per_token_per_gpu"] == 24 * 132 and terms["DSA indexer keys"]["dcp_sharded"]
    assert terms["MLA latent"]["bytes_per_token_per_gpu"] == 24 * 576
    assert terms["KDA state"]["per_sequence"]
    assert sz["kv_cache_claim"]["claim_tokens_tp"] == 2_600_000
    budget = sz["kv_cache_layout"]["budget"]
    assert budget["gpu_memory_utilization"] == 1.0 and budget["utilization_source"].startswith("engine default")
    named = {t["name"]: t for t in budget["terms"]}
    assert named["indexer logits buffer"]["low_bytes"] == 2_148_532_224 and not named["indexer logits buffer"]["estimate"]
    assert named["CUDA graphs"]["estimate"] and named["CUDA graphs"]["low_bytes"] < named["CUDA graphs"]["high_bytes"]
    assert sz["kv_cache_tokens_range"][0] < sz["kv_cache_tokens_range"][1]
    out = io.StringIO()
    plan_script.render_table(doc, file=out, details=True, width=160)
    text = out.getvalue()
    assert "KV per token" in text and "16,992 B per GPU" in text and "DSA indexer keys 24 x 132 B" in text
    assert "recipe's claim" in text and "15,744 B/token" in text and "indexer logits buffer 2.15 GB" in text
    low, high = sz["kv_cache_tokens_range"]
    assert f"{low:,}-{high:,} tokens per copy" in text
    short = io.StringIO()
    plan_script.render_table(doc, file=short, width=160)
    assert "(estimate)" in next(line for line in short.getvalue().splitlines() if "KV cache" in line)


def test_a_measured_kv_figure_replaces_the_estimate_and_says_measured(monkeypatch):
    sizing = compute_sizing(spec_of(with_vllm(kvCacheTokens=2_250_000)))
    assert sizing.kv_cache_tokens == sizing.kv_cache_tokens_tp == 2_250_000
    assert sizing.kv_cache_source.startswith("vllm.kvCacheTokens (measured")
    dcp = compute_sizing(spec_of(with_vllm(decodeContextParallelSize=8, kvCacheTokens=17_000_000)))
    assert dcp.kv_cache_tokens == dcp.kv_cache_tokens_dcp == 17_000_000 and dcp.kv_cache_tokens_tp != 17_000_000
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", json.dumps({"kimi-deploy:vllm": {"kvCacheTokens": 2_250_000}}))
    doc = plan_script.build_plan_document("b300", now=FIXED_NOW)
    row = dict(plan_script.summary_rows(doc, details=False))["KV cache"]
    assert row.startswith("2,250,000 tokens per copy") and row.endswith("(measured)"), row


def test_mxfp4_indexer_merges_into_the_recipe_attention_config():
    spec = spec_of(with_vllm(indexerCacheDtype="mxfp4"))
    argv = build_vllm_command(spec).role("server").argv
    assert argv.count("--attention-config") == 1
    value = json.loads(argv[argv.index("--attention-config") + 1])
    recipe = json.loads(dict(KIMI_K3_1_PRO.recipes["cuda"].flags)["--attention-config"])
    assert value == {**recipe, "indexer_kv_dtype": "mxfp4"} and list(value)[:len(recipe)] == list(recipe)
    default = build_vllm_command(spec_of(base("b300"))).role("server").argv
    assert "indexer_kv_dtype" not in " ".join(default)  # fp8 is vLLM's default: the recipe JSON as it was


def test_mxfp4_indexer_changes_the_plan_figure():
    fp8, mxfp4 = compute_sizing(spec_of(base("b300"))), compute_sizing(spec_of(with_vllm(indexerCacheDtype="mxfp4")))
    assert mxfp4.kv_layout.bytes_per_token_per_gpu == 24 * (576 + 68) == 15_456
    assert mxfp4.kv_cache_tokens_tp > fp8.kv_cache_tokens_tp


def test_mxfp4_indexer_reaches_every_role_of_a_multi_node_copy():
    command = build_vllm_command(spec_of(with_vllm("gb300", indexerCacheDtype="mxfp4")))
    for role in command.roles:
        value = json.loads(role.argv[role.argv.index("--attention-config") + 1])
        assert value["indexer_kv_dtype"] == "mxfp4", role.name


def test_merge_reaches_every_attention_config_and_adds_one_when_absent():
    assert merge_attention_config(["a", "--attention-config", '{"x":1}', "--attention-config={}"], {"k": "v"}) == [
        "a", "--attention-config", '{"x":1,"k":"v"}', '--attention-config={"k":"v"}']
    assert merge_attention_config(["a"], {"k": "v"}) == ["a", "--attention-config", '{"k":"v"}']
    assert merge_attention_config(["a"], {}) == ["a"]


def test_the_real_parser_takes_the_merged_attention_config():
    """vLLM's own parser (the pinned wheel, tests/vllm_contract.py) reads indexer_kv_dtype=mxfp4
    from the merged --attention-config, beside the recipe's keys."""
    spec = spec_of(with_vllm(indexerCacheDtype="mxfp4"))
    role = build_vllm_command(spec).role("server")
    report = check_argvs([role.concrete_argv()])
    result = report["results"][0]
    assert result["ok"], result
    attention = result["parsed"]["attention_config"]
    assert attention["indexer_kv_dtype"] == "mxfp4" and attention["use_prefill_query_quantization"] is True, attention


# --- the layout against the installed vLLM's own code ------------------------------------------------


@pytest.fixture(scope="module")
def probe():
    python = require_vllm_python()
    request = {
        "mla_head_size": GEOMETRY.mla_head_size,
        "index_head_dim": GEOMETRY.index_head_dim,
        "kv_cache_dtypes": ["fp8", "fp8_e4m3", "auto", "bfloat16"],
        "backends": [FLASHMLA_SPARSE, FLASHINFER_MLA_SPARSE],
        "capabilities": {name: list(gpu.compute_capability) if gpu.compute_capability else None for name, gpu in GPUS.items()},
    }
    proc = subprocess.run([str(python), str(PROBE)], input=json.dumps(request), capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


def test_mla_formats_are_the_engine_s(probe):
    assert probe["fp8_ds_mla_row_bytes"] == FP8_DS_MLA_ROW_BYTES
    for key, engine in probe["mla"].items():
        dtype, backend = key.split("|")
        fmt, nbytes = mla_format(dtype, backend or None, GEOMETRY.mla_head_size)
        assert nbytes == engine["bytes_per_token"], (key, nbytes, engine)
        assert fmt == {"auto": "bf16", "bfloat16": "bf16"}.get(engine["format"], engine["format"]), (key, fmt, engine)
        assert engine["dcp_sharded"] and engine["max_tp_shards"] == 1, key


def test_indexer_entries_are_the_engine_s(probe):
    for dtype in ("fp8", "mxfp4"):
        engine = probe["indexer"][dtype]
        assert indexer_entry_bytes(GEOMETRY.index_head_dim, dtype) == engine["entry_bytes"] == engine["bytes_per_token"]
        assert engine["dcp_sharded"] and engine["max_tp_shards"] == 1
    assert probe["attention_config_indexer_kv_dtype"] == "mxfp4"


def test_default_sparse_backend_and_dtypes_are_the_engine_s(probe):
    for dtype in ("fp8", "fp8_e4m3"):
        ours = [b for b in SM10X_SPARSE_BACKEND_ORDER if dtype in SPARSE_BACKEND_KV_DTYPES[b]]
        assert [b for b in probe["sm10x_sparse_order"][dtype] if b in ours] == ours, dtype
    for backend, dtypes in SPARSE_BACKEND_KV_DTYPES.items():
        quantized = [d for d in probe["sparse_kv_dtypes"][backend] if d in KV_CACHE_ELEMENT_BYTES and d.startswith("fp8")]
        assert sorted(dtypes) == sorted(quantized), backend


def test_mxfp4_gate_is_the_engine_s(probe):
    for name, gpu in GPUS.items():
        assert (probe["mxfp4_gate"][name] is True) == mxfp4_indexer_supported(gpu), (name, probe["mxfp4_gate"][name])
    assert probe["kimi_mxfp4"]["k3.1"] is True  # K3.1's LayerNorm keys, no indexer RoPE
    assert "layernorm" in probe["kimi_mxfp4"]["rmsnorm keys"]  # the check can refuse


def test_probe_runs_standalone():
    """The probe imports nothing of the repository (it runs in the vLLM venv)."""
    text = PROBE.read_text()
    assert "from components" not in text and "from scripts" not in text and "import tests" not in text
