#!/usr/bin/env python3
"""What the INSTALLED vLLM's own sizing functions compute for the memory terms of
``components/core/engine_memory.py`` (CPU only, offline). Imports nothing of this repository.

Run with the python of the vLLM venv (``KIMI_VLLM_PYTHON``; ``tests/test_engine_memory.py`` does)::

    echo '{"workspace": [[8, 12, 16384]], "batch_defaults": [[288400000000, "NVIDIA B300"]],
           "indexer": [{"max_model_len": 1048576, "max_num_seqs": 1024, "max_num_batched_tokens": 16384,
                        "num_speculative_tokens": 0, "dcp": 1, "sm10x": true, "topk": 2048, "head_dim": 128}],
           "kv": [{"total_bytes": 1, "requested_bytes": 1, "non_kv_used_bytes": 0, "transient_peak_bytes": 0}]}' \\
        | .venv-vllm/bin/python tests/vllm_memory_probe.py

Called as they are: ``compute_trtllm_sparse_mla_workspace_bytes`` and ``_DEFAULT_WORKSPACE_BUFFER_SIZE``
(flashinfer_mla_sparse.py), ``EngineArgs.get_batch_defaults`` (arg_utils.py, its device query
answered with the given memory and name), ``measure_kv_cache_bytes`` (extensible_kv_cache.py),
``get_max_prefill_buffer_size`` (v1/attention/backends/mla/indexer.py) and ``sparse_attn_indexer``'s
profile-run branch (model_executor/layers/sparse_attn_indexer.py) with its device, forward context
and workspace manager replaced by recorders: the bytes it asks ``torch.empty`` and the workspace
manager for are its answer.

stdout, one JSON object::

    {"workspace_default": int, "workspace": [int], "batch_defaults": [[tokens, seqs]],
     "indexer": [{"logits_bytes": int, "gather_bytes": int}], "kv": [int]}

Exit codes: 0 report written; 2 bad input; 3 vLLM could not be imported.
"""

from __future__ import annotations

import json
import os
import sys
import types
from typing import Any

os.environ.update({"VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "VLLM_NO_USAGE_STATS": "1"})


def _indexer(mod: Any, torch: Any, prefill_buffer_size: Any, case: dict[str, Any]) -> dict[str, int]:
    """The bytes the indexer's profile run reserves for ``case`` (see the module docstring)."""
    asked: list[int] = []
    workspaces: list[int] = []

    class Platform:
        def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
            return bool(case["sm10x"]) and capability == 100

        def fp8_dtype(self) -> Any:
            return torch.float8_e4m3fn

    class Workspaces:
        def get_simultaneous(self, *specs: Any) -> None:
            for shape, dtype in specs:
                n = 1
                for d in shape:
                    n *= d
                workspaces.append(n * dtype.itemsize)

    class Torch:
        def __getattr__(self, name: str) -> Any:
            return getattr(torch, name)

        def empty(self, n: int, **_: Any) -> None:
            asked.append(int(n))

    sched = types.SimpleNamespace(max_num_seqs=case["max_num_seqs"], max_num_batched_tokens=case["max_num_batched_tokens"])
    cfg = types.SimpleNamespace(scheduler_config=sched, num_speculative_tokens=case["num_speculative_tokens"])
    vcfg = types.SimpleNamespace(
        model_config=types.SimpleNamespace(max_model_len=case["max_model_len"]),
        attention_config=types.SimpleNamespace(
            sparse_mla_prefill_workspace_factor=5 if case["max_model_len"] <= 256 * 1024 else 2),
    )
    total_seq_lens = prefill_buffer_size(vcfg)
    patches = {
        "get_forward_context": lambda: types.SimpleNamespace(attn_metadata=None),
        "current_platform": Platform(),
        "current_workspace_manager": lambda: Workspaces(),
        "use_fused_mqa_topk": lambda **_: False,
        "get_current_vllm_config_or_none": lambda: cfg,
        "sparse_attn_indexer_fake": lambda *a, **k: None,
        "_resolve_layer_name": lambda name: name,
        "torch": Torch(),
    }
    saved = {k: getattr(mod, k) for k in patches}
    try:
        for k, v in patches.items():
            setattr(mod, k, v)
        fn = getattr(mod.sparse_attn_indexer, "__wrapped__", mod.sparse_attn_indexer)
        meta = torch.empty(1, 8, device="meta")
        fn(meta, "layer.k_cache", meta, meta, None, None, meta, 128, "ue8m0", case["topk"], case["head_dim"],
           case["max_model_len"], total_seq_lens, meta, True, False, False, "", False,
           0, case["dcp"], 1, topk_backend="auto")
    finally:
        for k, v in saved.items():
            setattr(mod, k, v)
    return {"logits_bytes": max(asked), "gather_bytes": sum(workspaces)}


def main() -> int:
    try:
        request = json.load(sys.stdin)
    except ValueError as err:
        print(f"bad input: {err}", file=sys.stderr)
        return 2
    try:
        import torch
        import vllm.model_executor.layers.sparse_attn_indexer as indexer_mod
        from vllm.engine import arg_utils
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.attention.backends.mla import flashinfer_mla_sparse as fi
        from vllm.v1.attention.backends.mla.indexer import get_max_prefill_buffer_size
        from vllm.v1.worker.extensible_kv_cache import measure_kv_cache_bytes
    except Exception as err:  # noqa: BLE001 - any import failure means no answer
        print(f"vLLM could not be imported: {err!r}", file=sys.stderr)
        return 3
    out: dict[str, Any] = {"workspace_default": fi._DEFAULT_WORKSPACE_BUFFER_SIZE}
    out["workspace"] = [
        fi.compute_trtllm_sparse_mla_workspace_bytes(fi._DEFAULT_WORKSPACE_BUFFER_SIZE, dcp, heads, tokens)
        for dcp, heads, tokens in request.get("workspace", [])
    ]
    defaults = []
    for memory, name in request.get("batch_defaults", []):
        platform = arg_utils.current_platform

        class Device:
            def __getattr__(self, attr: str, _p: Any = platform) -> Any:
                return getattr(_p, attr)

            def get_device_total_memory(self, device_id: int = 0, _m: int = memory) -> int:
                return _m

            def get_device_name(self, device_id: int = 0, _n: str = name) -> str:
                return _n

            def is_device_capability(self, capability: Any, device_id: int = 0) -> bool:
                return False

            def is_tpu(self) -> bool:
                return False

            def is_cpu(self) -> bool:  # the GPU the stack runs on, not this machine
                return False

        arg_utils.current_platform = Device()
        try:
            tokens, seqs = arg_utils.EngineArgs.get_batch_defaults(8)
        finally:
            arg_utils.current_platform = platform
        defaults.append([tokens[UsageContext.OPENAI_API_SERVER], seqs[UsageContext.OPENAI_API_SERVER]])
    out["batch_defaults"] = defaults
    out["indexer"] = [_indexer(indexer_mod, torch, get_max_prefill_buffer_size, case) for case in request.get("indexer", [])]
    # After warm-up the committed prefix is released (gpu_worker.py:1087-1098): free = total - non-KV.
    out["kv"] = [
        measure_kv_cache_bytes(
            init_free_memory=c["total_bytes"], free_memory=c["total_bytes"] - c["non_kv_used_bytes"], committed_bytes=0,
            requested_memory=c["requested_bytes"], transient_peak_bytes=c["transient_peak_bytes"],
        )
        for c in request.get("kv", [])
    ]
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
