"""The vLLM command builder: flags per vendor, multi-node roles, no secrets in argv."""

from __future__ import annotations

import copy

import pytest

from components.core.config import namespace_config, read_stack_config
from components.core.load import load_stack, parse_spec
from components.core.sizing import compute_sizing
from components.core.vllm import LEADER_ADDRESS_REF, WORKER_INDEX_REF, build_vllm_command
from tests.conftest import FIXED_NOW, STACKS, TEST_ENGINE_TAG

NVIDIA_ONLY_FLAGS = ("--attention-config", "--no-enable-flashinfer-autotune", "fastsafetensors")
NVIDIA_ONLY_ENV = ("VLLM_ALLREDUCE_USE_FLASHINFER", "NCCL_MNNVL_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_CUMEM_ENABLE")


def flag_value(argv, flag):
    i = list(argv).index(flag)
    return argv[i + 1]


def command(stack, **vllm):
    ns, _ = namespace_config(read_stack_config(stack))
    if vllm:
        ns = copy.deepcopy(ns)
        ns["vllm"] = {**ns.get("vllm", {}), **vllm}
    spec = parse_spec(ns, stack=stack, now=FIXED_NOW)
    return spec, build_vllm_command(spec)


@pytest.mark.parametrize("name", STACKS)
def test_common_flags_every_stack(name):
    spec = load_stack(name, now=FIXED_NOW)
    cmd = build_vllm_command(spec)
    for role in cmd.roles:
        argv = role.argv
        assert argv[:2] == ("vllm", "serve") and argv[2] == cmd.model_path
        assert flag_value(argv, "--tensor-parallel-size") == "8"
        assert flag_value(argv, "--tool-call-parser") == "kimi_k3"
        assert flag_value(argv, "--reasoning-parser") == "kimi_k3"
        assert "--trust-remote-code" in argv and "--enable-auto-tool-choice" in argv
        assert flag_value(argv, "--max-model-len") == "1048576"
        assert not any("api-key" in a or "TESTSECRET" in a for a in argv)
        assert role.secret_env.get("VLLM_API_KEY") == "apiKey" or not role.serves_http
        assert int(role.env["VLLM_ENGINE_READY_TIMEOUT_S"]) == compute_sizing(spec).startup_budget_seconds
        assert role.env["HF_HUB_OFFLINE"] == "1"


def test_b300_uses_the_blackwell_recipe():
    _, cmd = command("b300")
    argv = cmd.role("server").argv
    assert flag_value(argv, "--load-format") == "fastsafetensors"
    assert flag_value(argv, "--kv-cache-dtype") == "fp8"
    assert "--gpu-memory-utilization" not in argv  # 0.34.0 sizes the KV cache from measured memory
    assert '"mla_prefill_backend":"flashinfer"' in flag_value(argv, "--attention-config")
    assert "--enable-prefix-caching" in argv and "--no-enable-flashinfer-autotune" in argv
    env = cmd.role("server").env
    assert env["VLLM_ALLREDUCE_USE_FLASHINFER"] == "1"
    # The recipe's V2-runner switch (redundant in vLLM 0.34.0) is not set, and the Rust frontend (which
    # refuses the API guard) is pinned off, whatever an image sets: the Python frontend serves
    # (tests/test_vllm_contract.py runs both frontends' code).
    assert "VLLM_USE_V2_MODEL_RUNNER" not in env and env["VLLM_USE_RUST_FRONTEND"] == "0"
    assert cmd.image == "vllm/vllm-openai:" + TEST_ENGINE_TAG  # the stand-in engine (conftest.py)


def test_mi355x_uses_the_rocm_recipe_and_nothing_nvidia():
    _, cmd = command("mi355x")
    role = cmd.role("server")
    argv = role.argv
    assert cmd.image.startswith("vllm/vllm-openai-rocm:")
    assert flag_value(argv, "--load-format") == "auto"
    assert flag_value(argv, "--max-num-seqs") == "128"
    assert flag_value(argv, "--max-num-batched-tokens") == "4096"
    assert flag_value(argv, "--mm-encoder-tp-mode") == "data"
    assert "FULL_DECODE_ONLY" in flag_value(argv, "--compilation-config")
    assert "--kv-cache-dtype" not in argv
    assert role.env["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0" and role.env["VLLM_ROCM_USE_AITER"] == "1"
    assert not any(f in " ".join(argv) for f in NVIDIA_ONLY_FLAGS)
    assert not any(k in role.env for k in NVIDIA_ONLY_ENV)


def test_gb300_leader_and_worker():
    spec, cmd = command("gb300")
    assert [r.name for r in cmd.roles] == ["leader", "worker"]
    leader, worker = cmd.roles
    assert leader.nodes == 1 and worker.nodes == spec.nodes_per_copy - 1 == 1
    for role in (leader, worker):
        assert flag_value(role.argv, "--nnodes") == "2"
        assert flag_value(role.argv, "--master-addr") == LEADER_ADDRESS_REF
        assert role.env["NCCL_MNNVL_ENABLE"] == "1" and role.env["NCCL_CUMEM_ENABLE"] == "1"
    assert flag_value(leader.argv, "--node-rank") == "0" and "--headless" not in leader.argv
    assert flag_value(worker.argv, "--node-rank") == WORKER_INDEX_REF and "--headless" in worker.argv
    assert "--port" in leader.argv and "--port" not in worker.argv
    assert not worker.serves_http and worker.secret_env == {}
    concrete = worker.concrete_argv()
    assert flag_value(concrete, "--node-rank") == "1" and flag_value(concrete, "--master-addr") == "10.0.0.1"


def test_dcp_flag_only_when_set():
    _, plain = command("b300")
    assert "--decode-context-parallel-size" not in plain.role("server").argv
    _, dcp = command("b300", decodeContextParallelSize=8)
    assert flag_value(dcp.role("server").argv, "--decode-context-parallel-size") == "8"


def test_prefix_caching_can_be_disabled():
    _, cmd = command("b300", enablePrefixCaching=False)
    argv = cmd.role("server").argv
    assert "--enable-prefix-caching" not in argv and "--no-enable-prefix-caching" in argv


def test_image_tag_override_and_extra_args():
    _, cmd = command("b300", imageTag="v0.34.0", extraArgs=["--max-num-seqs", "64"])
    assert cmd.image == "vllm/vllm-openai:v0.34.0"
    assert cmd.role("server").argv[-2:] == ("--max-num-seqs", "64")


def test_served_model_names():
    _, cmd = command("b300")
    assert cmd.served_model_names == ("kimi-k3.1-pro", "moonshotai/Kimi-K3.1-Pro")
    assert flag_value(cmd.role("server").argv, "--served-model-name") == "kimi-k3.1-pro"


def test_dcp_adds_the_recipe_settings_and_plain_tp_does_not():
    _, tp = command("b300", decodeContextParallelSize=1)
    _, dcp = command("b300", decodeContextParallelSize=8)
    tp_argv, dcp_argv = tp.role("server").argv, dcp.role("server").argv
    assert "--dcp-comm-backend" not in tp_argv and "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE" not in tp.role("server").env
    assert flag_value(dcp_argv, "--dcp-comm-backend") == "a2a"
    # K3.1's MLA layers are all DSA: a sparse decode backend that supports DCP and FP8 KV on SM10x, not
    # the K3 recipe's TOKENSPEED_MLA (validated with vLLM's own classes in tests/test_vllm_contract.py).
    assert flag_value(dcp_argv, "--attention-backend") == "FLASHINFER_MLA_SPARSE"
    assert dcp_argv.count("--attention-backend") == 1
    # Plain TP names it too: the one vLLM would pick (tests/test_vllm_contract.py runs the wheel's selection).
    assert flag_value(tp_argv, "--attention-backend") == "FLASHINFER_MLA_SPARSE"
    assert dcp_argv.count("--attention-config") == 1 and "TRTLLM_RAGGED" in flag_value(dcp_argv, "--attention-config")
    # The engine sizes the DCP workspace itself (tests/test_engine_memory.py checks every role).
    assert "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE" not in dcp.role("server").env


def test_gpu_memory_utilization_is_rendered_only_when_set_and_dcp_takes_any():
    _, tp = command("b300", gpuMemoryUtilization=0.9)
    assert flag_value(tp.role("server").argv, "--gpu-memory-utilization") == "0.9"
    spec, dcp = command("b300", decodeContextParallelSize=8, gpuMemoryUtilization=0.99)
    assert flag_value(dcp.role("server").argv, "--gpu-memory-utilization") == "0.99"
    assert any(w.startswith("DCP 8:") and "slower" in w for w in spec.warnings)


# --- The attention backend every CUDA role names, and extraArgs that change what was sized ----------


@pytest.mark.parametrize("name", STACKS)
def test_every_cuda_role_names_the_backend_its_cache_layout_is_sized_for(name):
    """Each CUDA role names exactly one --attention-backend, attention_backend.py's pick for the role's
    GPU, KV dtype and DCP, and the sizing's cache layout reads that same name from the command's flags
    (not vLLM's priorities); ROCm roles name none."""
    from components.core.attention_backend import role_attention_backend
    from components.core.sizing import kv_cache_dtype, kv_layout

    spec, cmd = command(name)
    expected = role_attention_backend(spec.model, spec.target, kv_cache_dtype(spec),
                                      spec.config.vllm.decode_context_parallel_size, spec.config.vllm.extra_args)
    for role in cmd.roles:
        if spec.target.image_family == "cuda":
            assert expected is not None and role.argv.count("--attention-backend") == 1, role.name
            assert flag_value(role.argv, "--attention-backend") == expected
        else:
            assert expected is None and "--attention-backend" not in role.argv
    layout = kv_layout(spec)
    if expected is not None:
        assert layout.attention_backend == expected and layout.backend_source == "named in the command"


def test_the_backend_follows_the_kv_dtype_heads_and_block_size():
    """The wheel's SM 10.x sparse priorities (platforms/cuda.py l.94-115) with each backend's own limits."""
    from components.core.attention_backend import cuda_attention_backend

    def pick(kv, heads=12, dcp=1, block=None, cc=(10, 3)):
        return cuda_attention_backend(compute_capability=cc, sparse=True, kv_cache_dtype=kv, heads_per_rank=heads,
                                      decode_context_parallel_size=dcp, block_size=block)

    assert pick("fp8") == pick("fp8", dcp=8) == pick("fp8_e4m3") == "FLASHINFER_MLA_SPARSE"
    assert pick("bfloat16") == "FLASHINFER_MLA_SPARSE"  # FA4 leads but refuses 12 gathered heads
    assert pick("bfloat16", heads=16) == "FLASH_ATTN_MLA_SPARSE_FA4"
    assert pick("bfloat16", heads=16, dcp=8) != "FLASH_ATTN_MLA_SPARSE_FA4"
    assert pick("bfloat16", heads=24) == "FLASHMLA_SPARSE"
    assert pick("fp8", block=64) == pick("fp8", block=96) == "FLASHINFER_MLA_SPARSE"
    assert pick("fp8", block=16) is None and pick("fp8_e5m2") is None
    assert pick("fp8", cc=(9, 0)) is None


@pytest.mark.parametrize(("extra", "needle"), [
    (["--block-size", "16"], "'--block-size 16' is a block size no sparse MLA backend"),
    (["--block-size=48"], "FLASHINFER_MLA_SPARSE: a multiple of 32"),
    (["--max-num-seqs", "0"], "'--max-num-seqs 0' is refused by vLLM 0.34.0's SchedulerConfig"),
    (["--max-num-batched-tokens", "16", "--max-num-seqs", "64"], r"'--max-num-batched-tokens 16'.*at least max_num_seqs \(64\)"),
    (["--max_num_batched_tokens=0"], r"'--max_num_batched_tokens=0' is refused by vLLM 0.34.0's SchedulerConfig.*at least 1"),
    (["--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"], r"max_model_len \(1,048,576\) without chunked"),
    (["--max-num-seqs", "many"], r"max_num_seqs\) must be a whole number"),
    (["--performance-mode", "fast"], "allowed: balanced, interactivity, throughput"),
    (["--speculative-config", '{"method":"mtp"}'], "--speculative-config.*no draft model"),
    (["-sc", '{"method":"mtp"}'], "speculative_config"),
    (["--kv-transfer-config", '{"kv_connector":"NixlConnector"}'], "no KV connector"),
    (["--kv-offloading-size", "64"], "no KV offloading"),
    (["--kv-cache-memory-bytes", "1000000000"], "kv_cache_memory_bytes"),
])
def test_extra_args_that_change_what_was_sized_are_refused_in_one_line(extra, needle):
    import re

    from components.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        command("b300", extraArgs=extra)
    text = str(err.value)
    assert "\n" not in text and "vllm.extraArgs" in text and re.search(needle, text), text


@pytest.mark.parametrize(("stack", "extra", "limits"), [
    ("b300", [], (16_384, 1_024)),  # vLLM's defaults for a GPU of 160 GiB or more
    ("b300", ["--max-num-seqs", "64"], (16_384, 64)),
    ("b300", ["--max-num-batched-tokens=8192"], (8_192, 1_024)),
    ("b300", ["--max-num-batched-tokens", "16"], (16, 16)),  # the default sequences shrink to the tokens
    ("b300", ["--performance-mode", "throughput"], (32_768, 2_048)),
    ("b300", ["--max-num-batched-tokens", "32K"], (32_768, 1_024)),  # vLLM's human-readable integers
    ("b300", ["--max-num-batched-tokens=2.5k"], (2_500, 1_024)),
    ("gb300", ["--max-num-seqs", "256"], (16_384, 256)),
    ("mi355x", [], (4_096, 128)),  # the ROCm recipe's own flags
    ("mi355x", ["--max-num-seqs", "64"], (4_096, 64)),
])
def test_the_plan_reads_the_effective_scheduler_limits(stack, extra, limits):
    from components.core.sizing import effective_scheduler_limits

    spec, _ = command(stack, extraArgs=extra) if extra else command(stack)
    assert effective_scheduler_limits(spec) == limits


def test_the_block_size_the_backend_accepts_is_kept():
    spec, cmd = command("b300", extraArgs=["--block-size", "64"])
    argv = cmd.role("server").argv
    assert flag_value(argv, "--block-size") == "64" and flag_value(argv, "--attention-backend") == "FLASHINFER_MLA_SPARSE"


# --- extraArgs read against the recorded table of the pinned parser (offline, no vLLM) ----------

def refused(stack, **vllm):
    from components.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        spec, _ = command(stack, **vllm)
        compute_sizing(spec)
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text, text
    return text


# Each passes today's plan: only preflight's vllm-argv ran the parser (issue 35, the fresh trial).
PARSER_REFUSES = [
    (["--definitely-not-a-flag"], r"'--definitely-not-a-flag' is not an option of vLLM 0.34.0's `vllm serve` parser"),
    (["--max-num-seqz", "8"], r"'--max-num-seqz' is not an option .*; did you mean --max-num-seqs\?"),
    (["/models/another-model"], r"'/models/another-model' is a positional argument"),
    (["--seed"], r"'--seed' is missing its value: --seed takes one value"),
    (["--seed", "--max-num-seqs", "8"], r"'--seed' is missing its value"),
    (["--disable-log-stats", "yes"], r"'yes' is a positional argument"),
    (["--disable-log-stats=true"], r"gives a value to --disable-log-stats, a flag that takes none"),
    (["--uvicorn-log-level", "loud"], r"is not a choice of --uvicorn-log-level .*allowed: critical, debug, error, info, trace"),
    (["--seed", "seven"], r"'--seed seven' is refused by .*--seed \(seed\) must be a whole number"),
    (["--max-num", "8"], r"'--max-num' is ambiguous .*--max-num-batched-tokens"),
    (["--api-server-count", "0"], r"'--api-server-count 0' is refused by this product: .*at least 1 .*headless"),
    (["-asc", "-1"], r"'-asc -1' is refused by this product"),
    (["--watermark", "1.0"], r"'--watermark 1.0' is refused by vLLM 0.34.0's SchedulerConfig: .*less than 1.0"),
    (["--max-num-scheduled-tokens", "0"], r"SchedulerConfig: --max-num-scheduled-tokens .*at least 1"),
    (["--", "--seed", "1"], r"'--' ends the options"),
    (["--compilation-config", '{"nonsense_key": 1}'], r"--compilation-config \(compilation_config\) has no field 'nonsense_key'"),
    (["--compilation-config.mod", "3"], r"has no field 'mod'; did you mean mode\?"),
    (["-cc", "nope"], r"must be a JSON object"),
]


@pytest.mark.parametrize(("extra", "needle"), PARSER_REFUSES, ids=[" ".join(e) for e, _ in PARSER_REFUSES])
def test_extra_args_the_pinned_parser_or_its_config_classes_refuse_are_refused_by_the_plan(extra, needle):
    import re

    text = refused("b300", extraArgs=extra)
    assert text.startswith("kimi-deploy:vllm.extraArgs: ") and re.search(needle, text), text


# Options this product refuses, with the place in vLLM 0.34.0's source that makes them dangerous.
DANGEROUS = [
    (["--enable-log-requests"], "request_logger.py"),
    (["--enable_log_requests"], "prompt"),
    (["--uvicorn-log-level", "trace"], "Authorization"),
    (["--uvicorn-log-level=trace"], "uvicorn/config.py l.541"),
    (["--hf-overrides", '{"num_hidden_layers": 2}'], "vllm/config/model.py"),
    (["--cpu-offload-gb", "64"], "vllm/config/offload.py"),
    (["--tool-server", "demo"], "tool_server.py"),
    (["--ssl-keyfile", "/etc/key.pem"], "TLS ends at the load balancer"),
    (["--ssl-certfile", "/etc/cert.pem"], "TLS"),
    (["--middleware", "mypkg.Logger"], "before the guard"),
    (["--allowed-local-media-path", "/"], "reads the container's files"),
    (["--tokenizer", "evil/repo"], "only model.repo at its commit"),
    ([" --port", "9000"], "positional"),  # a leading space is not an option to vLLM's parser
    (["\u2014port", "9000"], "positional"),  # an em dash, as a word processor writes --
]


@pytest.mark.parametrize(("extra", "needle"), DANGEROUS, ids=[" ".join(e) for e, _ in DANGEROUS])
def test_extra_args_dangerous_for_this_product_are_refused_with_the_reason(extra, needle):
    text = refused("b300", extraArgs=extra)
    assert ("is refused for this product" in text or needle == "positional") and needle in text, text


# Issue 35, the second trial (t362-t375): each passed the plan, `pulumi up` and preflight. One rule per
# kind (vllm_options._FOREIGN_CODE, _NOT_ON_NODE, _OUTBOUND); the needle is the wheel's source line.
FOREIGN_CODE = [
    (["--tool-parser-plugin", "/tmp/evil.py"], "cli_args.py l.617-618"),  # t362
    (["--logits-processors", "evil.mod:Cls"], "logits_processor/loader.py l.78-110"),  # t363
    (["--worker-extension-cls", "os.system"], "worker_base.py l.326-328"),  # t364
    (["--worker-cls", "evil.Worker"], "worker_base.py l.314-316"),  # t365
    (["--worker_cls=evil.Worker"], "worker_base.py l.314-316"),
    (["--scheduler-cls", "evil.Scheduler"], "config/scheduler.py l.289-291"),
    (["--reasoning-parser-plugin", "/tmp/evil.py"], "cli_args.py l.620-621"),
    (["--model-class-overrides", '{"KimiK3ForCausalLM": "evil.Model"}'], "config/model.py l.1190-1213"),
    (["--ec-transfer-config", '{"ec_connector": "Evil", "ec_connector_module_path": "evil"}'], "factory.py l.69-72"),
    (["--log-config-file", "/tmp/logging.json"], "vllm/logger.py l.261-277"),
    (["--logging-config", '{"pylogging_config_file": "/tmp/logging.json"}'], "vllm/logger.py l.218, 261-277"),
    (["--logging-config.pylogging_config_file", "/tmp/logging.json"], "vllm/logger.py l.218, 261-277"),
    (["--structured-outputs-config.reasoning_parser_plugin", "/tmp/evil.py"], "structured_output/__init__.py l.101-105"),
]
NOT_ON_NODE = [
    (["--chat-template", "/etc/shadow"], "chat_template.py l.73"),  # t366
    (["--enable-lora", "--lora-modules", "evil=evil-org/adapter"], "arg_utils.py l.2727-2729"),  # t371
    (["--lora-modules", "evil=evil-org/adapter"], "lora/utils.py l.345-391"),
    (["--default-mm-loras", '{"image": "evil-org/adapter"}'], "api_utils.py l.288-303"),
    (["--hf-config-path", "evil-org/config"], "config/model.py l.628-629"),  # t375
    (["--generation-config", "/tmp/evil"], "config/model.py l.1861-1876"),
    (["--spec-model", "evil-org/draft"], "arg_utils.py l.2141-2154"),
    (["--spec-method", "ngram"], "speculative decoding is not supported"),
]
OUTBOUND = [
    (["--otlp-traces-endpoint", "http://evil.example:4317"], "tracing/otel.py l.74, 84"),  # t368
    (["--kv-events-config", '{"enable_kv_cache_events": true, "endpoint": "tcp://evil.example:5557"}'],
     "kv_events.py l.56-59"),  # t369
    (["--kv-events-config.endpoint", "tcp://evil.example:5557"], "prompt token ids"),
]
KIND_WORDS = {"code": "code from outside the pinned image", "file": "HF_HUB_OFFLINE=1", "out": "past the network policy"}
BY_KIND = ([(e, n, "code") for e, n in FOREIGN_CODE] + [(e, n, "file") for e, n in NOT_ON_NODE]
           + [(e, n, "out") for e, n in OUTBOUND])


@pytest.mark.parametrize(("extra", "needle", "kind"), BY_KIND, ids=[" ".join(e)[:60] for e, _, _ in BY_KIND])
def test_extra_args_that_import_code_read_files_or_connect_out_are_refused_citing_the_wheel(extra, needle, kind):
    text = refused("b300", extraArgs=extra)
    assert "vllm.extraArgs" in text and "is refused for this product" in text and needle in text, text
    assert f"'{' '.join(extra[:2]) if extra[0] != '--enable-lora' else extra[0]}'" in text, text  # the item named
    assert KIND_WORDS[kind] in text or "speculative decoding" in text, text  # why, by its kind


def test_every_class_path_or_plugin_option_of_the_pinned_parser_is_refused():
    """An option of the recorded parser named for a class path or a plugin (``*_cls``, ``*_plugin``)
    is either the toolkit's or refused: vLLM imports what it names (the next such option fails here)."""
    from components.core.vllm_options import OWNED_DESTS, REFUSED_VALUES, option_table

    dests = {a.dest for a in option_table().by_option.values() if a.dest.endswith(("_cls", "_plugin", "_plugins"))}
    assert {"worker_cls", "worker_extension_cls", "scheduler_cls", "tool_parser_plugin"} <= dests, dests
    # --io-processor-plugin picks among plugins installed in the image's entry-point group
    # (vllm/plugins/io_processors/__init__.py l.58-60 load_plugins_by_group): it imports nothing from outside.
    left = dests - set(REFUSED_VALUES) - set(OWNED_DESTS) - {"io_processor_plugin"}
    assert not left, sorted(left)


@pytest.mark.parametrize("extra", [["--tool-parser-plugin", "/tmp/evil.py"], ["--hf-config-path", "evil-org/config"],
                                   ["--otlp-traces-endpoint", "http://evil.example:4317"]])
def test_refused_extra_args_stop_the_plan_pulumi_up_and_preflight_alike(extra, tmp_path, monkeypatch, capsys):
    """The same one-line error from the plan's loader, the Pulumi program (`pulumi up`) and
    `preflight --only vllm-argv` (which loads the stack before running the wheel's parser)."""
    import functools

    import yaml

    from components.core.errors import ConfigError
    from components.plan_engine import run_program
    from scripts.ops import preflight

    config = read_stack_config("b300")
    config["kimi-deploy:vllm"] = {**config.get("kimi-deploy:vllm", {}), "extraArgs": extra}
    (tmp_path / "Pulumi.evil.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    texts = []
    with pytest.raises(ConfigError) as plan_err:
        load_stack("evil", stacks_dir=tmp_path, now=FIXED_NOW)
    texts.append(str(plan_err.value))
    with pytest.raises(ConfigError) as up_err:
        run_program(config, stack="evil", now=FIXED_NOW)
    texts.append(str(up_err.value))
    monkeypatch.setattr(preflight, "load_stack", functools.partial(load_stack, stacks_dir=tmp_path))
    with pytest.raises(ConfigError) as preflight_err:
        preflight.main(["--stack", "evil", "--only", "vllm-argv", "--runtime", "none"])
    texts.append(str(preflight_err.value))
    assert len(set(texts)) == 1 and "vllm.extraArgs" in texts[0] and extra[1] in texts[0], texts
    assert "\n" not in texts[0]


@pytest.mark.parametrize("extra", [
    ["--disable-log-requests"], ["--uvicorn-log-level", "debug"], ["--max-num-seqs", "64"], ["--max_num_seqs=32"],
    ["-O3"], ["--compilation-config.mode", "3"], ["--logging-config", '{"log_level": "info"}'],
    ["--structured-outputs-config.backend", "xgrammar"], ["--seed", "7"], ["--generation-config", "vllm"],
    ["--enable-chunked-prefill", "--max-num-batched-tokens", "16K"], ["--limit-mm-per-prompt", '{"image": 0}'],
])
def test_extra_args_the_pinned_parser_takes_still_plan(extra):
    spec, cmd = command("b300", extraArgs=extra)
    compute_sizing(spec)
    assert cmd.role("server").argv[-len(extra):] == tuple(extra)


def test_the_recorded_table_holds_every_option_of_the_pinned_parser():
    from components.core.vllm_options import option_table

    table = option_table()
    assert table.vllm_version == "0.34.0" and table.allow_abbrev
    assert len(table.by_option) > 400 and table.by_option["--max-num-seqs"].bounds == {"ge": 1}
    assert table.by_option["-asc"].dest == "api_server_count"


# --- Ports the pod listens on ---

def test_vllm_port_on_the_multi_node_rendezvous_port_is_refused_naming_both():
    text = refused("gb300", port=29500)
    assert text.startswith("kimi-deploy:vllm.port: 29500 puts the OpenAI API"), text
    assert "gb300's multi-node rendezvous (the toolkit's --master-port 29500" in text


def test_a_port_option_of_extra_args_on_vllm_port_is_refused_naming_both():
    text = refused("b300", extraArgs=["--data-parallel-rpc-port", "8000"])
    assert text.startswith("kimi-deploy:vllm.extraArgs: '--data-parallel-rpc-port 8000' puts the OpenAI API"), text


def test_the_rendezvous_port_is_free_for_the_api_on_a_single_node_target():
    spec, cmd = command("b300", port=29500)
    assert flag_value(cmd.role("server").argv, "--port") == "29500"


def test_a_port_in_the_ephemeral_range_is_warned():
    from components.core.config.vllm import check_ports
    from components.core.targets import TARGETS

    warnings: list[str] = []
    check_ports(40_000, TARGETS["b300"], {}, warnings)
    assert len(warnings) == 1 and "ephemeral range 32768-60999" in warnings[0]


# --- A measured KV figure the GPUs cannot hold ---

@pytest.mark.parametrize("stack", ["b300", "gb300", "mi355x"])
def test_kv_cache_tokens_beyond_what_the_gpus_hold_are_refused(stack):
    text = refused(stack, kvCacheTokens=10_000_000_000)
    assert text.startswith("kimi-deploy:vllm.kvCacheTokens: 10000000000 is more than 8x ") and "can hold" in text, text


def test_a_measured_kv_figure_above_the_estimate_is_flagged_and_the_bound_is_the_memory_after_weights():
    from components.core.engine_memory import WEIGHTS
    from components.core.sizing import kv_tokens_hardware_bound

    spec, _ = command("b300")
    sizing = compute_sizing(spec)
    bound = kv_tokens_hardware_bound(sizing.memory, sizing.kv_layout, 1)
    free = sizing.memory.gpu_memory_bytes - sizing.memory.term(WEIGHTS).low_bytes
    assert bound == free // sizing.kv_layout.bytes_per_token_per_gpu > sizing.kv_cache_tokens_range[1]
    assert f"(allowed: 1 to {bound:,})" in refused("b300", kvCacheTokens=bound + 1)
    spec, _ = command("b300", kvCacheTokens=bound)
    measured = compute_sizing(spec)
    assert measured.kv_cache_tokens == bound and "above the plan's high estimate" in measured.kv_cache_source
    spec, _ = command("b300", kvCacheTokens=sizing.kv_cache_tokens_range[0])
    assert "above" not in compute_sizing(spec).kv_cache_source


def test_batched_tokens_alone_below_the_sequence_default_is_warned_with_both_figures():
    """The second trial's t383: `--max-num-batched-tokens 100` alone passes vLLM 0.34.0's
    SchedulerConfig, because the engine lowers its sequence default (1,024 on B300) to the batched
    tokens (arg_utils.py l.3269-3271; tests/test_vllm_contract.py runs it): the plan sizes 100
    sequences and says so. With --max-num-seqs 1024 written too the engine refuses it, and so does the plan."""
    from components.core.sizing import effective_scheduler_limits

    spec, _ = command("b300", extraArgs=["--max-num-batched-tokens", "100"])
    assert effective_scheduler_limits(spec) == (100, 100)
    said = [w for w in spec.warnings if "--max-num-seqs" in w]
    assert len(said) == 1 and "from 1,024 to 100" in said[0] and "l.3269-3271" in said[0], said
    assert "--max-num-batched-tokens 100" in said[0]
    text = refused("b300", extraArgs=["--max-num-batched-tokens", "100", "--max-num-seqs", "1024"])
    assert "SchedulerConfig" in text and "at least max_num_seqs (1,024)" in text, text
    for enough in (["--max-num-batched-tokens", "16K"], ["--max-num-batched-tokens", "100", "--max-num-seqs", "100"]):
        assert not [w for w in command("b300", extraArgs=enough)[0].warnings if "--max-num-seqs" in w], enough


def test_a_default_refused_because_of_a_written_flag_names_the_written_flag():
    """A fresh trial: `--max-num-seqs 100000` was refused as `--max-num-batched-tokens 16384`, a default
    the user never wrote, without naming what they did write."""
    text = refused("b300", extraArgs=["--max-num-seqs", "100000"])
    assert "which --max-num-seqs in vllm.extraArgs contradicts" in text, text


# The second trial's remaining extraArgs (t367, t372-t374, t394, t395): each was accepted without a word.
def test_a_client_s_own_chat_template_is_refused_with_the_wheel_s_line():
    text = refused("b300", extraArgs=["--trust-request-chat-template"])
    assert "is refused for this product" in text and "cli_args.py l.95-98" in text and "K3 tool and reasoning" in text


@pytest.mark.parametrize("extra,instead", [
    (["--revision", "refs/pr/1"], "model.revision"), (["--code-revision", "main"], "model.revision"),
    (["--tokenizer-revision", "v2"], "model.revision"), (["--download-dir", "/"], "the storage keys"),
])
def test_options_that_change_nothing_here_are_warned_with_the_key_to_set(extra, instead):
    spec, cmd = command("b300", extraArgs=extra)
    said = [w for w in spec.warnings if w.startswith(f"vllm.extraArgs {extra[0]} has no effect here")]
    assert said and "HF_HUB_OFFLINE=1" in said[0] and f"set {instead}" in said[0], spec.warnings
    assert not [w for w in command("b300")[0].warnings if "has no effect here" in w]


def test_an_extra_args_list_longer_than_the_bound_is_refused_with_its_length():
    from components.core.vllm_options import MAX_EXTRA_ARGS

    text = refused("b300", extraArgs=["--enforce-eager"] * 10_000)
    assert text.startswith("kimi-deploy:vllm.extraArgs: '10,000 items' is more than 256"), text
    spec, _ = command("b300", extraArgs=["--enforce-eager"] * MAX_EXTRA_ARGS)
    assert spec is not None
