#!/usr/bin/env python3
"""Check `vllm serve` command lines with the REAL vLLM argument parser (CPU only, offline).

Run it with the python of the vLLM venv (scripts/dev/install_vllm_cpu.sh makes ``.venv-vllm``):

    echo '{"argvs": [["/models/m", "--tensor-parallel-size", "8"]]}' \\
        | .venv-vllm/bin/python scripts/ops/vllm_argv_check.py

stdin: ``{"argvs": [ARGV, ...], "envs": [ENV or null, ...], "attention": [LAYERS or null, ...],
"options": bool, "resolve": [ARG, ...]}``.
Each ARGV is what follows ``vllm serve``: the model path first, then flags (a leading
``"vllm", "serve"`` or ``"serve"`` is dropped; an argv that starts with a flag is passed as it is,
as vLLM allows ``--model`` and ``--config``). ``envs`` is optional: per argv, the role's
environment, set while that argv is checked (some checks read ``VLLM_*`` variables, e.g.
``VLLM_USE_RUST_FRONTEND``); the settings this script forces (CPU, no devices, hub off) are not
overridden by them. ``attention`` is optional: per argv, the attention layers the model serves and
the GPU it runs on (``components.core.engine.attention_facts``)::

    {"use_mla": true, "use_sparse": true, "head_size": 576, "num_heads": 96, "dtype": "bfloat16",
     "device_capability": [10, 3], "hf_text_config": {"qk_nope_head_dim": 128, ...}}

stdout, one JSON object::

    {"vllm_version": str, "torch_version": str,
     "tool_parsers": [...], "reasoning_parsers": [...], "env_vars": [names vllm.envs knows],
     "removed_env_vars": {name: hint} (vllm.envs.removed_environment_variables),
     "seconds": {"import": float, "check": float},
     "results": [{"ok": bool, "error": str | null, "stage": str | null,
                  "parsed": {dest: value} | null, "warnings": [str],
                  "environ": {...} | null, "frontend": {...} | null, "attention": {...} | null}],
     "allow_abbrev": bool,
     "option_dests": {option string: dest},             # with "options": true
     "resolved": [{"arg": str, "dest": str | null, "option": str | null, "error": str | null}]}  # with "resolve"

``options`` asks for every option string of the ``serve`` parser and the argparse destination it
sets (its ``_option_string_actions``, hidden spellings included). ``resolve`` asks how the parser
reads single arguments (each as ``vllm serve MODEL ARG 1``): ``FlexibleArgumentParser``'s own
rewriting (``_`` for ``-``, dotted JSON arguments, ``--model`` moved to the model position), then
argparse's ``_parse_optional`` (exact strings, a value attached to a short option, unique
prefixes); ``dest`` null with ``error`` null is an argument the parser does not know, ``error``
an ambiguous prefix or a rewrite that fails. components/core/vllm_options.py holds the owned part
of this mapping; tests/test_vllm_contract.py compares the two.

Each argv goes through the steps ``vllm serve`` takes before it looks at a model or a GPU;
``stage`` names the first that failed:

- ``argparse``: ``FlexibleArgumentParser`` with the ``serve`` subcommand added exactly as
  ``vllm/entrypoints/cli/main.py`` does (``ServeSubcommand().subparser_init``), so the positional
  ``model_tag``, ``--config``, dotted JSON flags and ``--model`` handling are vLLM's own.
  argparse errors are returned, never ``sys.exit``.
- ``validate``: ``ServeSubcommand.validate`` (``validate_parsed_serve_args``).
- ``registry``: ``--tool-call-parser`` / ``--reasoning-parser`` are registered names (what
  ``validate_api_server_args`` checks when the API server starts).
- ``engine_args``: ``AsyncEngineArgs.from_cli_args`` (builds the JSON config objects).
- ``config``: ``CacheConfig`` from the engine args, the model-independent part of
  ``create_engine_config`` (in the pinned release, ``components/core/versions.py`` VLLM_VERSION,
  ``--kv-cache-dtype`` is a free string for argparse; the dtype is only checked here).
- ``scheduler``: the scheduler limits through the wheel's own code (``check_scheduler``):
  ``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`` with the defaults of the GPU in
  ``attention`` (``device_memory_bytes``, ``device_name``; without them the wheel's fallback for a
  device it cannot query), then ``SchedulerConfig`` as ``create_engine_config`` builds it: it refuses
  ``--max-num-seqs 0`` and fewer batched tokens than sequences, which the parser passes. ``scheduler``
  reports ``{"max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill", "error"}``; skipped
  without ``--max-model-len``.
- ``environ``: the role's environment through vLLM's own ``Platform.validate_environ`` (what
  ``create_engine_config`` runs), strictly: a removed variable
  (``vllm.envs.removed_environment_variables``), one it refuses or calls redundant
  (``VLLM_USE_V2_MODEL_RUNNER``), or an unknown ``VLLM_*`` name fails. ``environ`` reports
  ``{"errors": [str], "warnings": [str]}``. Skipped when the vLLM has no such method.
- ``attention``: with ``attention`` facts, every backend the command names (``--attention-backend``,
  ``attention_config.backend``, ``backend_per_kind``) is validated with its own class as
  ``platforms/cuda.py`` ``get_attn_backend_cls`` does (``validate_configuration`` over an
  ``AttentionSelectorConfig`` built as ``v1/attention/selector.py`` builds it, in a vLLM config
  context holding the parallel sizes and the model's MLA dimensions), and a named
  ``mla_prefill_backend`` with its class (``prefill/selector.py``). Reasons that only say a GPU
  package is missing on this machine (flashinfer, tokenspeed_mla) are reported apart as
  ``environment_reasons`` and do not fail. Without a named backend it reports what vLLM would pick:
  the first of ``platforms/cuda.py`` ``_get_backend_priorities`` that validates (``auto``). Always,
  ``selection``: what the wheel's own ``CudaPlatform.get_attn_backend_cls`` picks with no backend named
  (``wheel_selection``), to compare with the one the command names.
- ``frontend``: which API frontend the role's environment selects, evaluated with vLLM's own
  reader (``envs.VLLM_RUST_FRONTEND_PATH if envs.VLLM_USE_RUST_FRONTEND else None``, as
  ``entrypoints/cli/serve.py``); ``python`` (``vllm serve`` itself), ``rust``, or ``none``
  (``--headless``). For ``rust``, the arguments are converted by vLLM's own
  ``RustFrontendProcessManager`` (``vllm/v1/utils.py``; a recorder stands in for the binary it
  starts) and then given to the wheel's real ``vllm-rs frontend``, with the model path pointed at a
  stand-in directory (a tokenizer and a config: the weights are not here) and listener descriptors
  that are not open: it validates the arguments, loads the tokenizer and the chat renderer, and
  stops where it would connect to the engine. Reaching that point is acceptance; exit 2 with an
  ``--args-json`` error is refusal (``"not implemented in Rust frontend yet: - middleware"``).
  ``frontend`` reports ``{"selected", "binary", "accepted", "exit_code", "error", "ignored"}``
  (``ignored``: arguments the binary says have no effect in it).

It never touches a GPU, the network or model files: ``VLLM_TARGET_DEVICE=cpu``, no visible
devices, hub calls disabled and pointed at a closed local port; the model path is a string (the
Rust frontend is given a local stand-in directory, with the hub offline).
Everything vLLM prints goes to stderr; stdout carries only the JSON.

Exit codes: 0 report written (whatever the results); 2 bad input; 3 vLLM could not be imported.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Set before vLLM (and huggingface_hub, which reads them at import) is imported.
_FORCED_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "CUDA_VISIBLE_DEVICES": "",
    "HIP_VISIBLE_DEVICES": "",
    "ROCR_VISIBLE_DEVICES": "",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # Off on purpose: with HF_HUB_OFFLINE=1, EngineArgs.__post_init__ resolves the model through
    # the local hub cache (a model file lookup). Nothing here downloads; should anything try,
    # it meets a closed local port instead of the internet.
    "HF_HUB_OFFLINE": "0",
    "HF_ENDPOINT": "http://127.0.0.1:9",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
_MAX_DEPTH = 6
# Reasons vLLM's backend classes give that only say a GPU package is absent from this CPU venv
# (flashinfer, tokenspeed_mla, ...): the image carries them; they are reported, not failed.
_ENVIRONMENT_REASON_RE = re.compile(
    r"not installed|No module named|required dependencies not available|ImportError|cannot import|libcuda"
    r"|not compiled with CUDA|_C is not available",
    re.I,
)
# RustFrontendProcessManager's own exclusions and the env-driven keys it adds (vllm/v1/utils.py).
_RUST_TIMEOUT_SECONDS = 60
_RUST_FD_FLAGS = ("--listen-fd", "--input-listener-fd", "--output-listener-fd", "--grpc-listen-fd")
_RUST_FREE_FD = 1000
# The stand-in model the Rust frontend loads: a one-word tokenizer and a config naming the model type.
_STAND_IN_TOKENIZER: dict[str, Any] = {
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
    "pre_tokenizer": None, "post_processor": None, "decoder": None,
    "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"},
}
_STAND_IN_CONFIG: dict[str, Any] = {"model_type": "kimi_k3", "vocab_size": 2}
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


class ArgparseFailure(Exception):
    """argparse wanted to exit (error, --help, --version)."""


def _jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy of a parsed value (config objects become dicts)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth >= _MAX_DEPTH:
        return repr(value)
    if isinstance(value, enum.Enum):  # str-valued enums by value, others by name
        return value.value if isinstance(value.value, str) else value.name
    if isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [_jsonable(v, depth + 1) for v in items]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _jsonable(getattr(value, f.name, None), depth + 1)
            for f in dataclasses.fields(value)
            if not f.name.startswith("_")
        }
    dump = getattr(value, "model_dump", None)  # pydantic BaseModel
    try:
        dumped = dump() if callable(dump) else None
    except Exception:  # noqa: BLE001 - fall back to the repr
        dumped = None
    return _jsonable(dumped, depth + 1) if isinstance(dumped, dict) else repr(value)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.messages.append(f"{record.levelname}: {record.getMessage()}")
        except Exception:  # noqa: BLE001
            self.messages.append(f"{record.levelname}: {record.msg!r}")


def _is_environment_reason(reason: str) -> bool:
    return bool(_ENVIRONMENT_REASON_RE.search(reason))


@contextmanager
def _only_env(env: dict[str, str]) -> Iterator[None]:
    """``os.environ`` holds exactly ``env`` inside (restored after)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def check_environ(env: dict[str, str]) -> dict[str, Any] | None:
    """The role's environment through vLLM's own ``Platform.validate_environ(hard_fail=True)``:
    ``{"errors": [...], "warnings": [...]}``, or None when this vLLM has no such method."""
    from vllm.platforms import current_platform

    validate = getattr(current_platform, "validate_environ", None)
    if validate is None:
        return None
    records: list[str] = []

    class _Records(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = _Records(level=logging.WARNING)
    logger = logging.getLogger("vllm")
    logger.addHandler(handler)
    errors: list[str] = []
    try:
        with _only_env(env):
            validate(True)
    except Exception as err:  # noqa: BLE001 - vLLM's refusal is the answer
        errors.append(f"{type(err).__name__}: {err}")
    finally:
        logger.removeHandler(handler)
    return {"errors": errors, "warnings": records}


def _stand_in_model(root: str) -> str:
    path = os.path.join(root, "stand-in-model")
    os.makedirs(path, exist_ok=True)
    for name, content in (("tokenizer.json", _STAND_IN_TOKENIZER), ("config.json", _STAND_IN_CONFIG)):
        with open(os.path.join(path, name), "w", encoding="utf-8") as f:
            json.dump(content, f)
    return path


def rust_frontend_command(args: Any, workdir: str) -> list[str]:
    """The ``vllm-rs`` argv that vLLM's own ``RustFrontendProcessManager`` builds for ``args`` (the
    parsed serve namespace after ``ServeSubcommand.cmd``'s changes), without the binary path:
    the class is run with a recorder in the binary's place and sockets of this process."""
    import socket

    from vllm.v1.utils import RustFrontendProcessManager

    record = os.path.join(workdir, "rust-frontend-argv.json")
    recorder = os.path.join(workdir, "record-argv")
    with open(recorder, "w", encoding="utf-8") as f:
        f.write(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({record!r}, 'w'))\n")
    os.chmod(recorder, 0o700)

    class _Listener:
        """What the class reads of a ZmqListener: a socket with a descriptor."""

        def __init__(self) -> None:
            self.socket = socket.socket()

        def close(self) -> None:
            pass

        def cleanup(self) -> None:
            self.socket.close()

    listeners = [_Listener(), _Listener()]
    with socket.socket() as sock:
        manager = RustFrontendProcessManager(
            binary_path=recorder, sock=sock, args=args, input_listener=listeners[0], output_listener=listeners[1],
            engine_start_index=0, engine_count=1, data_parallel_size=1,
        )
        try:
            manager._proc.wait(timeout=_RUST_TIMEOUT_SECONDS)
        finally:
            manager.shutdown()
    with open(record, encoding="utf-8") as f:
        return list(json.load(f))


def run_rust_frontend(binary: str, frontend_argv: list[str], model: str, workdir: str) -> dict[str, Any]:
    """Run the real ``vllm-rs`` over ``frontend_argv`` (from ``rust_frontend_command``), with the
    model at ``model`` replaced by a local stand-in directory, the hub offline and the inherited
    descriptors not open. Returns ``{"accepted", "exit_code", "error", "ignored"}``."""
    argv = list(frontend_argv)
    # The descriptors were this process's sockets; in the binary's process they are numbers that are
    # surely not open (subprocess closes every descriptor above 2), so it stops at the first one it uses.
    for n, flag in enumerate(_RUST_FD_FLAGS):
        if flag in argv:
            argv[argv.index(flag) + 1] = str(_RUST_FREE_FD + n)
    i = argv.index("--args-json") + 1
    payload = json.loads(argv[i])
    stand_in = _stand_in_model(workdir)
    for key in ("model", "model_tag"):
        if payload.get(key) == model:
            payload[key] = stand_in
    argv[i] = json.dumps(payload, sort_keys=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HF_"))}
    env.update({"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9", "NO_COLOR": "1"})
    try:
        proc = subprocess.run([binary, *argv], capture_output=True, text=True, timeout=_RUST_TIMEOUT_SECONDS,
                              env=env, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return {"accepted": False, "exit_code": None, "error": f"vllm-rs ran over {_RUST_TIMEOUT_SECONDS} s", "ignored": []}
    text = _ANSI_RE.sub("", (proc.stderr or "") + (proc.stdout or ""))
    ignored = sorted(set(re.findall(r"argument '([A-Za-z0-9_]+)' currently has no effect in Rust frontend", text)))
    if proc.returncode == 2 and "--args-json" in text:
        lines = [ln.strip() for ln in text.split("'--args-json <JSON>':", 1)[-1].splitlines() if ln.strip()]
        error = " ".join(ln for ln in lines if not ln.startswith("For more information"))
        return {"accepted": False, "exit_code": 2, "error": error, "ignored": ignored}
    if "failed to connect to engine core" in text:
        return {"accepted": True, "exit_code": proc.returncode, "error": None, "ignored": ignored}
    tail = " | ".join(ln.strip() for ln in text.strip().splitlines()[-4:])
    return {"accepted": False, "exit_code": proc.returncode,
            "error": f"vllm-rs stopped before the engine connection: {tail}", "ignored": ignored}


def check_frontend(args: Any, workdir: str) -> dict[str, Any]:
    """Which frontend the current environment selects for ``args`` (as ``vllm serve`` decides)
    and, for the Rust one, what the real binary says of the arguments vLLM hands it."""
    import vllm.envs as envs

    out: dict[str, Any] = {"selected": None, "binary": None, "accepted": None, "exit_code": None, "error": None,
                           "ignored": []}
    if getattr(args, "headless", False):
        out["selected"] = "none"
        return out
    try:
        binary = envs.VLLM_RUST_FRONTEND_PATH if envs.VLLM_USE_RUST_FRONTEND else None
    except Exception as err:  # noqa: BLE001 - e.g. FileNotFoundError: the binary is not in the package
        out.update(selected="rust", accepted=False, error=f"{type(err).__name__}: {err}")
        return out
    if not binary:
        out["selected"] = "python"
        return out
    out.update(selected="rust", binary=binary)
    if getattr(args, "api_server_count", None) is None:  # as ServeSubcommand.cmd does for the Rust frontend
        args.api_server_count = 1
    frontend_argv = rust_frontend_command(args, workdir)
    out.update(run_rust_frontend(binary, frontend_argv, args.model_tag or args.model, workdir))
    return out


def _cuda_priorities() -> Any:
    """``platforms/cuda.py`` ``_get_backend_priorities``. The module imports the CUDA extension
    ``vllm._C_stable_libtorch`` (it registers GPU ops and needs libcuda); a stub stands in for it
    so the pure priority function can be read on a CPU."""
    if "vllm._C_stable_libtorch" not in sys.modules:
        try:
            import vllm._C_stable_libtorch  # noqa: F401
        except Exception:  # noqa: BLE001 - no CUDA here
            sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")
    from vllm.platforms import cuda

    return cuda._get_backend_priorities


def check_scheduler(engine_args: Any, facts: dict[str, Any] | None) -> dict[str, Any] | None:
    """The scheduler limits vLLM resolves for ``engine_args`` and whether its ``SchedulerConfig``
    accepts them, by the wheel's own code: ``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``
    (the OpenAI API server's usage context, the defaults of ``get_batch_defaults`` for the GPU of
    ``facts``: ``device_memory_bytes`` and ``device_name``, read from a stand-in for the platform; without
    them 0 bytes, the wheel's own fallback when it cannot query the device) and ``SchedulerConfig``
    built as ``create_engine_config`` builds it, for a generative model (chunked prefill supported).
    ``{"max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill", "error"}`` (and ``skipped``
    when this vLLM's ``EngineArgs`` has no such step); None when the argv sets no ``--max-model-len``
    (the model's own length needs its checkpoint)."""
    import copy

    from vllm.config import SchedulerConfig
    from vllm.engine import arg_utils
    from vllm.usage.usage_lib import UsageContext

    max_model_len = getattr(engine_args, "max_model_len", None)
    if not isinstance(max_model_len, int):
        return None
    facts = facts or {}
    memory, name = int(facts.get("device_memory_bytes", 0)), str(facts.get("device_name", ""))
    stand_in = types.SimpleNamespace(
        get_device_total_memory=lambda *a, **k: memory, get_device_name=lambda *a, **k: name,
        is_device_capability=lambda *a, **k: False, is_tpu=lambda: False, is_cpu=lambda: False,
    )
    args = copy.copy(engine_args)
    if args.enable_chunked_prefill is None:  # ModelConfig.is_chunked_prefill_supported of a generative model
        args.enable_chunked_prefill = True
    model_config = types.SimpleNamespace(max_model_len=max_model_len, is_multimodal_model=False, is_mm_prefix_lm=False,
                                         is_encoder_decoder=False, runner_type="generate")
    out: dict[str, Any] = {"max_num_batched_tokens": None, "max_num_seqs": None,
                           "enable_chunked_prefill": args.enable_chunked_prefill, "error": None}
    saved = arg_utils.current_platform
    arg_utils.current_platform = stand_in
    try:
        args._set_default_max_num_seqs_and_batched_tokens_args(
            UsageContext.OPENAI_API_SERVER, model_config, types.SimpleNamespace(use_batched_dp_moe=False))
    except (AttributeError, TypeError) as err:  # another release's EngineArgs (engine verify): not answered here
        out["skipped"] = f"{type(err).__name__}: {err}"
        return out
    finally:
        arg_utils.current_platform = saved
    out.update(max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs)
    kwargs = {f: getattr(args, f) for f in (
        "max_num_batched_tokens", "max_num_scheduled_tokens", "max_num_seqs", "max_num_active_seqs",
        "max_num_inflight_kv_loads", "max_num_queued_reqs", "max_num_queued_tokens", "enable_chunked_prefill",
        "disable_chunked_mm_input", "scheduler_cls", "long_prefill_token_threshold",
        "long_prefill_token_threshold_adaptive", "scheduler_reserve_full_isl", "watermark", "prefill_schedule_interval",
        "cache_aware_admission_window", "cache_aware_admission_threshold", "disable_hybrid_kv_cache_manager",
        "async_scheduling", "stream_interval") if hasattr(args, f)}
    try:
        SchedulerConfig(runner_type="generate", max_model_len=max_model_len, is_multimodal_model=False,
                        is_encoder_decoder=False, policy=args.scheduling_policy, **kwargs)
    except Exception as err:  # noqa: BLE001 - the engine's refusal is the answer
        out["error"] = f"SchedulerConfig: {type(err).__name__}: {' '.join(str(err).split())}"
    return out


class _Unavailable(ImportError):
    """A backend class that cannot be imported on this CPU (a CUDA allocation at import)."""


def wheel_selection(selector: Any, capability: Any, num_heads: int | None, context: Any) -> dict[str, Any]:
    """The backend vLLM's own ``CudaPlatform.get_attn_backend_cls`` picks with none named, on a device
    of ``capability``: ``{"selected": name | None, "invalid": {name: [reasons]}, "error": str | None}``.

    Stand-ins for what the GPU image carries and this CPU lacks: a class whose import needs CUDA is
    reported unavailable (as the wheel reports a missing import; ``invalid`` keeps the reason), and
    FlashInfer and FA4's cute-DSL entry point are present (``has_flashinfer``,
    ``_fa4_cute_mla_available``), so FA4's own shape checks answer."""
    _cuda_priorities()
    import importlib

    from vllm.config import set_current_vllm_config
    from vllm.platforms import cuda
    from vllm.utils import flashinfer as flashinfer_utils

    flashattn_mla_sparse: Any = None
    for _ in range(2):  # the first import on a CPU fails in vllm_flash_attn's CUDA check; the module then loads
        try:
            flashattn_mla_sparse = importlib.import_module("vllm.v1.attention.backends.mla.flashattn_mla_sparse")
            break
        except ImportError:
            continue

    original = cuda._get_attn_backend_class

    def get_class(backend: Any) -> Any:
        try:
            return original(backend)
        except (AssertionError, RuntimeError) as err:  # "Torch not compiled with CUDA enabled"
            raise _Unavailable(f"{type(err).__name__}: {err}") from err

    patches: list[tuple[Any, str, Any]] = [
        (cuda, "_get_attn_backend_class", get_class),
        (cuda.CudaPlatform, "get_device_capability", classmethod(lambda cls, device_id=0: capability)),
        (flashinfer_utils, "has_flashinfer", lambda: True),
    ]
    if flashattn_mla_sparse is not None:
        patches += [(flashattn_mla_sparse, "has_flashinfer", lambda: True),
                    (flashattn_mla_sparse, "_fa4_cute_mla_available", lambda: None)]
    missing = object()
    saved = [(obj, attr, vars(obj).get(attr, missing)) for obj, attr, _ in patches]
    out: dict[str, Any] = {"selected": None, "invalid": {}, "error": None}
    try:
        for obj, attr, value in patches:
            setattr(obj, attr, value)
        with set_current_vllm_config(context):
            _, invalid = cuda.CudaPlatform.get_valid_backends(capability, selector, num_heads=num_heads)
            out["invalid"] = {b.name: reasons for b, (_, reasons) in invalid.items()}
            path = cuda.CudaPlatform.get_attn_backend_cls(None, selector, num_heads=num_heads)
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        out["selected"] = path
        for backend in AttentionBackendEnum:
            try:
                if backend.get_path() == path:
                    out["selected"] = backend.name
                    break
            except ValueError:  # a backend to be registered by a plugin (TORCH_SDPA)
                continue
    except Exception as err:  # noqa: BLE001 - "No valid attention backend found": data
        out["error"] = f"{type(err).__name__}: {' '.join(str(err).split())[:600]}"
    finally:
        for obj, attr, value in saved:
            if value is missing:
                delattr(obj, attr)
            else:
                setattr(obj, attr, value)
    return out


def check_attention(engine_args: Any, facts: dict[str, Any]) -> dict[str, Any]:
    """Validate the attention backends ``engine_args`` names against the model's layers (``facts``)
    with vLLM's own classes; ``{"ok", "backends": [...], "prefill": ... | None, "auto": ... | None}``."""
    import torch
    import vllm.envs as envs
    from vllm.config import ParallelConfig, set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    capability = DeviceCapability(*facts["device_capability"])
    dcp = int(getattr(engine_args, "decode_context_parallel_size", 1) or 1)
    pcp = int(getattr(engine_args, "prefill_context_parallel_size", 1) or 1)
    tp = int(getattr(engine_args, "tensor_parallel_size", 1) or 1)
    attention_config = engine_args.attention_config
    hf_text_config = types.SimpleNamespace(**facts.get("hf_text_config", {}))
    # What the backends read of the vLLM config: the parallel sizes and the model's text config
    # (no checkpoint here: its MLA dimensions come from facts).
    context = types.SimpleNamespace(
        parallel_config=ParallelConfig(tensor_parallel_size=tp, decode_context_parallel_size=dcp,
                                       prefill_context_parallel_size=pcp),
        model_config=types.SimpleNamespace(hf_text_config=hf_text_config, rswa_window=None,
                                           get_num_attention_heads=lambda parallel: int(facts.get("num_heads", 0)) // tp),
        attention_config=attention_config,
    )
    selector = AttentionSelectorConfig(
        head_size=int(facts["head_size"]),
        dtype=getattr(torch, facts.get("dtype", "bfloat16")),
        kv_cache_dtype=getattr(engine_args, "kv_cache_dtype", None),
        block_size=getattr(engine_args, "block_size", None),
        use_mla=bool(facts.get("use_mla", True)),
        use_sparse=bool(facts.get("use_sparse", False)),
        use_non_causal=bool(getattr(attention_config, "use_non_causal", False)),
        use_batch_invariant=bool(envs.VLLM_BATCH_INVARIANT),
        use_pcp=pcp > 1,
        use_dcp=dcp > 1,
    )

    def validate(backend: Any) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": backend.name, "reasons": [], "environment_reasons": []}
        try:
            cls = backend.get_class()
            with set_current_vllm_config(context):
                reasons = list(cls.validate_configuration(device_capability=capability, **selector._asdict()))
        except Exception as err:  # noqa: BLE001 - an import vLLM would report as unavailable
            reasons = [f"{type(err).__name__}: {err}"]
        for reason in reasons:
            entry["environment_reasons" if _is_environment_reason(reason) else "reasons"].append(reason)
        entry["ok"] = not entry["reasons"]
        entry["checked"] = not entry["environment_reasons"]  # False: the class could not fully answer here
        return entry

    named: dict[str, Any] = {}
    for backend in (getattr(engine_args, "attention_backend", None), getattr(attention_config, "backend", None),
                    *(getattr(attention_config, "backend_per_kind", None) or {}).values()):
        if backend is not None:
            backend = AttentionBackendEnum[backend] if isinstance(backend, str) else backend
            named[backend.name] = backend
    out: dict[str, Any] = {"backends": [validate(b) for b in named.values()], "prefill": None, "auto": None}
    heads = int(facts.get("num_heads", 0)) // tp or None
    try:
        out["selection"] = wheel_selection(selector, capability, heads, context)
    except Exception as err:  # noqa: BLE001 - another release's layout (engine verify): reported, not failed
        out["selection"] = {"selected": None, "invalid": {}, "error": f"{type(err).__name__}: {err}"}
    if not named:
        try:
            priorities = _cuda_priorities()(selector.use_mla, capability, int(facts.get("num_heads", 0)) // tp or None,
                                            selector.kv_cache_dtype)
            tried = [validate(b) for b in priorities]
            chosen = next((e["name"] for e in tried if e["ok"] and e["checked"]), None)
            out["auto"] = {"priorities": [e["name"] for e in tried], "tried": tried, "selected": chosen}
        except Exception as err:  # noqa: BLE001 - informative only
            out["auto"] = {"error": f"{type(err).__name__}: {err}"}
    prefill = getattr(attention_config, "mla_prefill_backend", None)
    if prefill is not None:
        from vllm.v1.attention.backends.mla.prefill.base import MLADimensions
        from vllm.v1.attention.backends.mla.prefill.selector import MLAPrefillSelectorConfig

        entry = {"name": prefill.name, "reasons": [], "environment_reasons": []}
        dims = MLADimensions(**{k: int(getattr(hf_text_config, k, 0)) for k in
                                ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")})
        try:
            reasons = list(prefill.get_class().validate_configuration(
                capability, MLAPrefillSelectorConfig(dtype=selector.dtype, mla_dimensions=dims)))
        except Exception as err:  # noqa: BLE001
            reasons = [f"{type(err).__name__}: {err}"]
        for reason in reasons:
            entry["environment_reasons" if _is_environment_reason(reason) else "reasons"].append(reason)
        entry["ok"] = not entry["reasons"]
        entry["checked"] = not entry["environment_reasons"]
        out["prefill"] = entry
    out["ok"] = all(e["ok"] for e in out["backends"]) and (out["prefill"] is None or out["prefill"]["ok"])
    return out


def _normalize(argv: list[Any]) -> list[str]:
    args = [str(a) for a in argv]
    if args[:2] == ["vllm", "serve"]:
        args = args[2:]
    elif args[:1] == ["serve"]:
        args = args[1:]
    return ["serve", *args]


def _read_request() -> tuple[list[list[str]], list[dict[str, str] | None], list[dict[str, Any] | None], bool, list[str]]:
    try:
        req = json.load(sys.stdin)
    except json.JSONDecodeError as err:
        raise ValueError(f"stdin is not JSON: {err}") from None
    resolve = req.get("resolve", []) if isinstance(req, dict) else []
    if not isinstance(resolve, list) or not all(isinstance(a, str) for a in resolve):
        raise ValueError('"resolve" must be a list of strings')
    options = bool(req.get("options")) if isinstance(req, dict) else False
    argvs = req.get("argvs", []) if isinstance(req, dict) else None
    if not isinstance(argvs, list) or not all(isinstance(a, list) for a in argvs):
        raise ValueError('stdin must be {"argvs": [[...], ...]}')
    envs = req.get("envs") or [None] * len(argvs)
    if not isinstance(envs, list) or len(envs) != len(argvs):
        raise ValueError('"envs" must be a list as long as "argvs"')
    for env in envs:
        if env is not None and not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
            raise ValueError('each "envs" item must be null or a {name: string} map')
    attention = req.get("attention") or [None] * len(argvs)
    if not isinstance(attention, list) or len(attention) != len(argvs):
        raise ValueError('"attention" must be a list as long as "argvs"')
    for facts in attention:
        if facts is not None and not (isinstance(facts, dict) and "head_size" in facts and "device_capability" in facts):
            raise ValueError('each "attention" item must be null or {"head_size", "device_capability", ...}')
    return argvs, envs, attention, options, resolve


class _Rewritten(Exception):
    """The argument list ``FlexibleArgumentParser.parse_args`` hands argparse (raised, not parsed)."""

    def __init__(self, args: list[str]) -> None:
        super().__init__("rewritten")
        self.rewritten = args


def _resolve(parser_class: Any, serve_parser: Any, arg: str) -> dict[str, Any]:
    """How ``vllm serve MODEL ARG 1`` reads ``arg``: the destination it sets, or why none."""
    out: dict[str, Any] = {"arg": arg, "dest": None, "option": None, "error": None}
    top = parser_class(prog="vllm")
    try:
        top.parse_args(["serve", "/m", arg, "1"])
    except _Rewritten as rewritten:
        args = rewritten.rewritten
    except BaseException as err:  # noqa: BLE001 - a rewrite that fails (--config without a YAML file) is data
        if isinstance(err, KeyboardInterrupt):
            raise
        out["error"] = f"{type(err).__name__}: {err}"
        return out
    optionals = [a for a in args[2:] if a.startswith("-")]
    if not optionals:
        if args[1] != "/m":  # --model VALUE moved to the model position (FlexibleArgumentParser)
            out.update(dest="model", option="--model")
        return out
    try:
        found = serve_parser._parse_optional(optionals[0])
    except BaseException as err:  # noqa: BLE001 - argparse's error (ambiguous option) is data
        if isinstance(err, KeyboardInterrupt):
            raise
        out["error"] = str(err)
        return out
    if isinstance(found, list):  # CPython 3.12.7+: a list of (action, option, sep, value) tuples
        found = found[0] if len(found) == 1 else None
    if found and found[0] is not None:
        out.update(dest=found[0].dest, option=found[1])
    return out


def main() -> int:
    if sys.argv[1:] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if sys.argv[1:]:  # the request comes on stdin only
        print(f"vllm_argv_check: usage error: no arguments are taken (got {len(sys.argv) - 1}); the request is "
              "JSON on stdin (see --help)", file=sys.stderr)
        return 2
    # Keep stdout for the JSON alone: anything vLLM or a native library prints goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def emit(obj: dict[str, Any], code: int) -> int:
        out.write(json.dumps(obj))
        out.write("\n")
        out.flush()
        return code

    try:
        argvs, envs, attention, want_options, resolve = _read_request()
    except ValueError as err:
        return emit({"error": str(err)}, 2)

    os.environ.update(_FORCED_ENV)
    started = time.perf_counter()
    try:
        import vllm
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.reasoning import ReasoningParserManager
        from vllm.tool_parsers import ToolParserManager
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except Exception as err:  # noqa: BLE001 - report any import failure as data
        return emit({"error": f"cannot import vllm: {type(err).__name__}: {err}"}, 3)
    try:
        from vllm.config import CacheConfig
    except ImportError:  # only the last check needs it
        CacheConfig = None
    try:
        import vllm.envs as vllm_envs

        env_vars = sorted(getattr(vllm_envs, "environment_variables", {}))
        removed_env_vars = dict(getattr(vllm_envs, "removed_environment_variables", {}))
    except Exception:  # noqa: BLE001
        env_vars, removed_env_vars = [], {}
    try:
        import torch

        torch_version = str(torch.__version__)
    except Exception:  # noqa: BLE001
        torch_version = None

    class RaisingParser(FlexibleArgumentParser):
        """vLLM's parser, raising instead of exiting (sub-parsers inherit the class)."""

        def exit(self, status: int = 0, message: str | None = None):
            if message:
                raise ArgparseFailure(message.strip())
            raise ArgparseFailure(f"argparse exited with status {status} (help or version requested?)")

    class RewriteOnlyParser(RaisingParser):
        """vLLM's parser that stops where argparse would start: after vLLM's own rewriting."""

        def parse_known_args(self, args=None, namespace=None):
            raise _Rewritten(list(args or []))

    def serve_parser_of(parser_class: Any) -> Any:
        top = parser_class(prog="vllm", description="vLLM CLI")
        subparsers = top.add_subparsers(required=False, dest="subparser")
        return ServeSubcommand().subparser_init(subparsers)

    tool_parsers = sorted(ToolParserManager.list_registered())
    reasoning_parsers = sorted(ReasoningParserManager.list_registered())
    import_seconds = time.perf_counter() - started

    capture = _Capture()
    logging.getLogger("vllm").addHandler(capture)

    workdir = tempfile.mkdtemp(prefix="kimi-argv-check-")

    def check(argv: list[str], env: dict[str, str], facts: dict[str, Any] | None) -> dict[str, Any]:
        result: dict[str, Any] = {"ok": False, "error": None, "stage": None, "parsed": None, "warnings": [],
                                  "environ": None, "frontend": None, "attention": None, "scheduler": None}
        stage = "argparse"
        try:
            # As vllm/entrypoints/cli/main.py builds it (fresh each time: argparse keeps state).
            parser = RaisingParser(prog="vllm", description="vLLM CLI")
            subparsers = parser.add_subparsers(required=False, dest="subparser")
            serve = ServeSubcommand()
            serve.subparser_init(subparsers).set_defaults(dispatch_function=serve.cmd)
            args = parser.parse_args(_normalize(argv))
            if getattr(args, "model_tag", None) is not None:  # as ServeSubcommand.cmd does
                args.model = args.model_tag
            result["parsed"] = {k: _jsonable(v) for k, v in sorted(vars(args).items()) if k != "dispatch_function"}
            stage = "validate"
            serve.validate(args)
            stage = "registry"
            tool = getattr(args, "tool_call_parser", None)
            if tool and tool not in tool_parsers:
                raise KeyError(f"invalid tool call parser: {tool} (choose from {', '.join(tool_parsers)})")
            reasoning = getattr(args, "reasoning_parser", None)
            if reasoning and reasoning not in reasoning_parsers:
                raise KeyError(f"invalid reasoning parser: {reasoning} (choose from {', '.join(reasoning_parsers)})")
            stage = "engine_args"
            engine_args = AsyncEngineArgs.from_cli_args(args)
            stage = "config"
            if CacheConfig is not None:
                kwargs = {}
                for f in dataclasses.fields(CacheConfig):
                    src = "kv_cache_dtype" if f.name == "cache_dtype" else f.name
                    value = getattr(engine_args, src, None)
                    if f.init and value is not None:
                        kwargs[f.name] = value
                CacheConfig(**kwargs)
            stage = "scheduler"
            scheduler = result["scheduler"] = check_scheduler(engine_args, facts)
            if scheduler is not None and scheduler["error"]:
                raise ValueError(scheduler["error"])
            result.update(ok=True, stage=None)
        except ArgparseFailure as err:
            result.update(error=str(err), stage=stage)
        except BaseException as err:  # SystemExit and friends become data too
            if isinstance(err, KeyboardInterrupt):
                raise
            text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
            result.update(error=f"{type(err).__name__}: {text}", stage=stage)
            return result

        # Independent of each other: each runs and reports; the first that fails names the stage.
        def environ_stage() -> str | None:
            environ = result["environ"] = check_environ(env)
            problems = [] if environ is None else environ["errors"] + environ["warnings"]
            return "; ".join(problems) or None

        def attention_stage() -> str | None:
            if facts is None:
                return None
            report = result["attention"] = check_attention(engine_args, facts)
            bad = [e for e in [*report["backends"], report["prefill"]] if e and not e["ok"]]
            return "; ".join(f"{e['name']}: {', '.join(e['reasons'])}" for e in bad) or None

        def frontend_stage() -> str | None:
            frontend = result["frontend"] = check_frontend(args, workdir)
            if frontend["accepted"] is False:
                return f"the {frontend['selected']} frontend refuses the arguments: {frontend['error']}"
            return None

        for name, run in (("environ", environ_stage), ("attention", attention_stage), ("frontend", frontend_stage)):
            try:
                problem = run()
            except Exception as err:  # noqa: BLE001 - the stage could not answer: a failure, as data
                problem = f"{type(err).__name__}: {err}"
            if problem and result["ok"]:
                result.update(ok=False, stage=name, error=problem)
        return result

    results = []
    check_started = time.perf_counter()
    for argv, role_env, facts in zip(argvs, envs, attention, strict=False):
        # The forced settings (CPU, offline, no devices) win over a role's own environment.
        env = {k: v for k, v in (role_env or {}).items() if k not in _FORCED_ENV}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        capture.messages = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = check(argv, dict(role_env or {}), facts)
            result["warnings"] = capture.messages + [f"{w.category.__name__}: {w.message}" for w in caught]
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        results.append(result)
    shutil.rmtree(workdir, ignore_errors=True)

    extra: dict[str, Any] = {}
    serve_parser = serve_parser_of(RaisingParser)
    extra["allow_abbrev"] = bool(serve_parser.allow_abbrev)
    if want_options:
        extra["option_dests"] = {option: action.dest for option, action in sorted(serve_parser._option_string_actions.items())}
    if resolve:
        extra["resolved"] = [_resolve(RewriteOnlyParser, serve_parser, arg) for arg in resolve]

    return emit(
        {
            **extra,
            "vllm_version": getattr(vllm, "__version__", None),
            "torch_version": torch_version,
            "tool_parsers": tool_parsers,
            "reasoning_parsers": reasoning_parsers,
            "env_vars": env_vars,
            "removed_env_vars": removed_env_vars,
            "seconds": {"import": round(import_seconds, 3), "check": round(time.perf_counter() - check_started, 3)},
            "results": results,
        },
        0,
    )


if __name__ == "__main__":
    sys.exit(main())
