#!/usr/bin/env python3
"""What the INSTALLED vLLM's own code says about a DSA model's KV cache (CPU only, offline).

Run with the python of the vLLM venv (``KIMI_VLLM_PYTHON``; ``tests/test_kv_layout.py`` does)::

    echo '{"mla_head_size": 576, "index_head_dim": 128, "kv_cache_dtypes": ["fp8", "auto"],
           "backends": ["FLASHMLA_SPARSE"], "capabilities": {"B300": [10, 3]}}' \\
        | .venv-vllm/bin/python tests/vllm_kv_probe.py

It imports nothing of this repository. Classes and functions that import on a CPU-only parser venv
are called as they are (``MLAAttentionSpec``, ``MLAAttentionImpl.get_fp8_ds_mla_row_bytes``,
``dsa_indexer_uses_fp4``, ``AttentionConfig``); those whose module pulls packages the parser venv
lacks or needs a GPU at import (``mla_attention.py``'s ``_canonicalize_sparse_mla_kv_cache_dtype``,
``models/kimi_k3/common/dsa_cache.py``, ``DeepseekV32IndexerCache``, ``platforms/cuda.py``, the
backend classes) are compiled from the
installed source file alone (the function or the class attribute, by name), so their code is the
wheel's own and a change in the wheel changes the answer.

stdout, one JSON object::

    {"vllm_version": str,
     "mla": {"<kv dtype>|<backend or ''>": {"format": str, "bytes_per_token": int, "dcp_sharded": bool,
                                            "max_tp_shards": int}},
     "fp8_ds_mla_row_bytes": int,
     "indexer": {"fp8": {"entry_bytes": int, "bytes_per_token": int, "dcp_sharded": bool, "max_tp_shards": int},
                 "mxfp4": {...}},
     "mxfp4_gate": {"<gpu>": true | "<the ValueError vLLM raises>"},
     "kimi_mxfp4": {"k3.1": true | "<error>", "rmsnorm keys": ...},
     "attention_config_indexer_kv_dtype": str,
     "sm10x_sparse_order": {"<kv dtype>": [backend names, in vLLM's order]},
     "sparse_kv_dtypes": {"<backend>": [kv dtypes it lists]}}

Exit codes: 0 report written; 2 bad input; 3 vLLM could not be imported.
"""

from __future__ import annotations
import __future__

import ast
import importlib.util
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

os.environ.update({"VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "VLLM_NO_USAGE_STATS": "1"})


def _source_function(path: Path, name: str, namespace: dict[str, Any], cls: str | None = None) -> Any:
    """The function ``name`` (a method of class ``cls`` if given) compiled from ``path`` alone,
    decorators dropped, its globals ``namespace`` (what the module would have imported)."""
    tree = ast.parse(path.read_text(), str(path))
    scope: list[ast.stmt] = tree.body
    if cls is not None:
        scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    func = next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)
    func.decorator_list = []
    module = ast.Module(body=[func], type_ignores=[])
    code = compile(module, str(path), "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)  # noqa: S102 - the installed wheel's own source, by design
    return namespace[name]


def _class_literal(path: Path, cls: str, attribute: str) -> Any:
    """A literal class attribute (``supported_kv_cache_dtypes = [...]``) read from ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    for node in body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == attribute and node.value is not None:
            return ast.literal_eval(node.value)
    raise KeyError(f"{cls}.{attribute} in {path}")


class _Platform:
    """A stand-in for ``vllm.platforms.current_platform`` on a GPU of the given capability."""

    def __init__(self, capability: list[int] | None) -> None:
        self.capability = capability

    def is_rocm(self) -> bool:
        return self.capability is None

    def is_device_capability_family(self, family: int) -> bool:
        return self.capability is not None and self.capability[0] * 10 == family


def main() -> int:
    try:
        request = json.load(sys.stdin)
        head_size = int(request["mla_head_size"])
        index_head_dim = int(request["index_head_dim"])
        dtypes = list(request["kv_cache_dtypes"])
        backends = list(request["backends"])
        capabilities = dict(request["capabilities"])
    except (ValueError, KeyError, TypeError) as err:
        print(json.dumps({"error": f"bad request: {err}"}))
        return 2
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever vLLM prints goes to stderr
    try:
        import torch
        import vllm
        import vllm.v1.attention.backends.mla.indexer as indexer_module
        from vllm.config.attention import AttentionConfig
        from vllm.model_executor.layers.sparse_attn_indexer import MXFP4_BLOCK_SIZE
        from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
        from vllm.v1.attention.backend import MLAAttentionImpl
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        from vllm.v1.kv_cache_interface import MLAAttentionSpec, SparseCacheRole, get_kv_quant_mode, is_quantized_kv_cache
    except Exception as err:  # noqa: BLE001 - reported as data
        out.write(json.dumps({"error": f"cannot import vllm: {type(err).__name__}: {err}"}) + "\n")
        return 3
    spec_origin = importlib.util.find_spec("vllm")
    assert spec_origin is not None and spec_origin.origin is not None
    root = Path(spec_origin.origin).parent
    model_config = types.SimpleNamespace(dtype=torch.bfloat16)  # K3.1 serves in BF16 ("auto")
    row_bytes = MLAAttentionImpl.get_fp8_ds_mla_row_bytes(None)  # type: ignore[arg-type]

    # The MLA latent: the format the layer settles on for a backend (mla_attention.py
    # _canonicalize_sparse_mla_kv_cache_dtype), then the spec get_kv_cache_spec builds from it.
    canonicalize = _source_function(root / "model_executor/layers/attention/mla_attention.py",
                                    "_canonicalize_sparse_mla_kv_cache_dtype", {"is_quantized_kv_cache": is_quantized_kv_cache})
    mla: dict[str, Any] = {}
    for dtype in dtypes:
        for backend in [*backends, ""]:
            stub = type("Backend", (), {"get_name": staticmethod(lambda b=backend: b)})
            fmt = canonicalize(stub, dtype)
            spec = MLAAttentionSpec(
                block_size=1, num_kv_heads=1, max_tp_shards=1, head_size=head_size,
                dtype=kv_cache_dtype_str_to_dtype(fmt, model_config), cache_dtype_str=fmt,
                kv_quant_mode=get_kv_quant_mode(fmt),
                state_content_bytes=row_bytes if fmt == "fp8_ds_mla" else {"nvfp4_ds_mla": 352}.get(fmt),
            )
            mla[f"{dtype}|{backend}"] = {"format": fmt, "bytes_per_token": spec.page_size_bytes,
                                         "dcp_sharded": spec.dcp_sharded, "max_tp_shards": spec.max_tp_shards}

    # The indexer key cache: K3.1's entry size (dsa_cache.py) in DeepseekV32IndexerCache's spec.
    entry_bytes = _source_function(root / "models/kimi_k3/common/dsa_cache.py", "indexer_cache_entry_bytes",
                                   {"MXFP4_BLOCK_SIZE": MXFP4_BLOCK_SIZE})
    get_spec = _source_function(root / "model_executor/models/deepseek_v2.py", "get_kv_cache_spec",
                                {"MLAAttentionSpec": MLAAttentionSpec, "SparseCacheRole": SparseCacheRole},
                                cls="DeepseekV32IndexerCache")
    indexer: dict[str, Any] = {}
    for name, fp4 in (("fp8", False), ("mxfp4", True)):
        entry = entry_bytes(index_head_dim, fp4)
        cache = types.SimpleNamespace(cache_config=types.SimpleNamespace(block_size=1), head_dim=entry, dtype=torch.uint8)
        spec = get_spec(cache, None)
        indexer[name] = {"entry_bytes": entry, "bytes_per_token": spec.page_size_bytes,
                         "dcp_sharded": spec.dcp_sharded, "max_tp_shards": spec.max_tp_shards}

    # MXFP4 indexer keys: vLLM's gate (dsa_indexer_uses_fp4) on each GPU, then K3.1's own checks.
    config = types.SimpleNamespace(
        attention_config=AttentionConfig(indexer_kv_dtype="mxfp4"),
        model_config=types.SimpleNamespace(hf_config=types.SimpleNamespace(model_type="kimi_k3"),
                                           hf_text_config=types.SimpleNamespace(dsa_config=None)),
        parallel_config=types.SimpleNamespace(prefill_context_parallel_size=1),
    )
    gate: dict[str, Any] = {}
    real_platform = indexer_module.current_platform
    # On ROCm the gate imports these first (they probe a GPU at import): an MI355X (CDNA4) with aiter on.
    rocm_stubs = {
        "vllm.platforms.rocm": types.SimpleNamespace(get_cdna_version=lambda: 4),
        "vllm._aiter_ops": types.SimpleNamespace(rocm_aiter_ops=types.SimpleNamespace(is_enabled=lambda: True)),
    }
    saved = {name: sys.modules.get(name) for name in rocm_stubs}
    try:
        sys.modules.update(rocm_stubs)  # type: ignore[arg-type]
        for gpu, capability in capabilities.items():
            indexer_module.current_platform = _Platform(capability)  # type: ignore[assignment]
            try:
                gate[gpu] = indexer_module.dsa_indexer_uses_fp4(config)  # type: ignore[arg-type]
            except ValueError as err:
                gate[gpu] = str(err)
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        indexer_module.current_platform = _Platform([10, 3])  # type: ignore[assignment]
        kimi_uses_fp4 = _source_function(root / "models/kimi_k3/common/dsa_cache.py", "kimi_k3_indexer_uses_fp4",
                                         {"dsa_indexer_uses_fp4": indexer_module.dsa_indexer_uses_fp4})
        kimi: dict[str, Any] = {}
        for label, norm in (("k3.1", "layernorm"), ("rmsnorm keys", "rmsnorm")):
            config.model_config.hf_text_config.dsa_config = types.SimpleNamespace(index_k_norm_type=norm, index_rope_dim=0)
            try:
                kimi[label] = kimi_uses_fp4(config)
            except ValueError as err:
                kimi[label] = str(err)
    finally:
        indexer_module.current_platform = real_platform

    # vLLM's sparse MLA choice on SM10x when no backend is named (platforms/cuda.py), and the KV
    # dtypes each sparse backend lists (their class attributes).
    priorities = _source_function(root / "platforms/cuda.py", "_get_backend_priorities",
                                  {"AttentionBackendEnum": AttentionBackendEnum})
    from vllm.platforms.interface import DeviceCapability

    order = {d: [b.name for b in priorities(True, DeviceCapability(10, 3), 16, d) if "SPARSE" in b.name] for d in dtypes}
    backend_files = {
        "FLASHINFER_MLA_SPARSE": ("v1/attention/backends/mla/flashinfer_mla_sparse.py", "FlashInferMLASparseTRTLLMBackend"),
        "FLASHMLA_SPARSE": ("v1/attention/backends/mla/flashmla_sparse.py", "FlashMLASparseBackend"),
    }
    sparse_dtypes = {name: _class_literal(root / rel, cls, "supported_kv_cache_dtypes")
                     for name, (rel, cls) in backend_files.items()}

    out.write(json.dumps({
        "vllm_version": vllm.__version__,
        "mla": mla,
        "fp8_ds_mla_row_bytes": row_bytes,
        "indexer": indexer,
        "mxfp4_gate": gate,
        "kimi_mxfp4": kimi,
        "attention_config_indexer_kv_dtype": AttentionConfig(indexer_kv_dtype="mxfp4").resolve_indexer_kv_dtype("fp8"),
        "sm10x_sparse_order": order,
        "sparse_kv_dtypes": sparse_dtypes,
    }) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
