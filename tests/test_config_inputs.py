"""Inputs a new user gets wrong, each refused in one line that names the key, the value and what is
allowed (or, where valid, accepted): spellings of owned vLLM flags in ``vllm.extraArgs``, keys
the stack's platform does not read, resource ids, URLs, empty strings and booleans.

Every ``parse_spec`` call here is harvested into the recorded corpus (tests/config_corpus.py).
"""

from __future__ import annotations

import copy

import pytest

from components.core.config import ConfigError, namespace_config, parse_spec, read_stack_config
from components.core.vllm_options import OWNED_DESTS, OWNED_OPTIONS, owned_option
from tests.conftest import FIXED_NOW


def base(stack: str = "b300") -> dict:
    ns, _ = namespace_config(read_stack_config(stack))
    return copy.deepcopy(ns)


def reject(config: dict, key: str, *fragments: str, stack: str = "test") -> str:
    with pytest.raises(ConfigError) as info:
        parse_spec(config, stack=stack, now=FIXED_NOW)
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(f"kimi-deploy:{key}:") or message.startswith(f"{key}:"), message
    for fragment in fragments:
        assert fragment in message, message
    return message


def accept(config: dict, stack: str = "test"):
    return parse_spec(config, stack=stack, now=FIXED_NOW)


def with_extra(args: list[str], stack: str = "b300") -> dict:
    cfg = base(stack)
    cfg["vllm"] = {**cfg.get("vllm", {}), "extraArgs": args}
    return cfg


# --- vllm.extraArgs: by the destination vLLM's parser maps a spelling to --------------------------


@pytest.mark.parametrize(
    "args,option,how",
    [
        (["-tp", "4"], "-tp", ""),  # the short alias: vLLM reads TP 4, the plan sizes TP 8
        (["-tp=4"], "-tp", ""),
        (["--tensor_parallel_size", "4"], "--tensor-parallel-size", ""),  # `_` read as `-`
        (["--tensor-parallel=4"], "--tensor-parallel-size", "abbreviated"),  # argparse allow_abbrev
        (["--tensor-par", "4"], "--tensor-parallel-size", "abbreviated"),
        (["-t", "4"], "-tp", "abbreviated"),
        (["-pp", "2"], "-pp", ""),  # twice the GPUs of the copy the plan sizes
        (["-dp", "2"], "-dp", ""),
        (["-pcp", "2"], "-pcp", ""),
        (["-dcp", "8"], "-dcp", ""),
        (["--device-memory-utilization", "0.8"], "--device-memory-utilization", ""),  # an alias of --gpu-memory-...
        (["--max-model-len", "4096"], "--max-model-len", ""),
        (["--max_model_len=4096"], "--max-model-len", ""),
        (["--disable-prefix-caching"], "--disable-prefix-caching", ""),
        (["--no-enable-prefix-caching"], "--no-enable-prefix-caching", ""),
        (["--kv-cache-dtype", "auto"], "--kv-cache-dtype", ""),
        (["-n2"], "-n", "with its value attached"),  # --nnodes 2
        (["-r", "1"], "-r", ""),
        (["--port.x", "1"], "--port", ""),  # a dotted JSON argument is its option
        (["--served-model", "other"], "--served-model-name", "abbreviated"),
        (["--config", "/etc/vllm.yaml"], "--config", ""),
        (["--hf-token", "x"], "--hf-token", ""),
    ],
)
def test_extra_args_refuse_every_spelling_of_an_owned_flag(args, option, how):
    msg = reject(with_extra(["--max-num-seqs", "64", *args]), "vllm.extraArgs", f"sets {option}", "toolkit owns", how)
    assert repr(args[0]) in msg
    assert OWNED_DESTS[owned_option(args[0]).dest].instead in msg  # type: ignore[union-attr]


def test_extra_args_tp_names_where_the_layout_comes_from():
    msg = reject(with_extra(["-tp", "4"]), "vllm.extraArgs")
    assert msg == (
        "kimi-deploy:vllm.extraArgs: '-tp' sets -tp, vLLM's tensor_parallel_size, which the toolkit owns: the parallel "
        "layout is the target's (TP = GPUs per copy); more copies: compute.replicas"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--max-num-seqs", "64"],
        ["--max-num-batched-tokens=8192"],
        ["--enable-chunked-prefill"],
        ["-dc", "{}"],  # --diffusion-config: an exact option wins over being a prefix of -dcp
        ["-q", "fp8"],  # --quantization
        ["--compilation-config.mode", "3"],
        ["--override-generation-config", '{"temperature": 0.6}'],
        ["--middleware", "my.Extra"],  # appended after the API guard, not in place of it
    ],
)
def test_extra_args_accept_options_the_toolkit_does_not_own(args):
    spec = accept(with_extra(args))
    assert spec.config.vllm.extra_args == tuple(args)


def test_extra_args_refuse_a_flag_and_value_in_one_item():
    reject(with_extra(["--max-num-seqs 64"]), "vllm.extraArgs", "'--max-num-seqs 64'", "its own list item")


def test_every_owned_option_string_is_refused_exactly():
    for option, dest in OWNED_OPTIONS.items():
        owned = owned_option(option)
        assert owned is not None and owned.dest == dest and owned.how == "exact", option
        assert owned_option(option + "=1") == owned
