"""What the kubelet runs is what the program rendered: every ``$`` of user text reaches a container
literally (Kubernetes expands ``$(VAR)`` and reduces ``$$`` in command, args, env values and exec
probes), and the only references left are the program's own, at the places it put them
(``VllmRole.references``), never found by matching text (``common.K8S_VAR_NAMES``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from components.core.load import load_stack
from components.core.vllm import EXAMPLE_REF_VALUES, build_vllm_command
from components.k8s.common import K8S_VAR_NAMES, k8s_argv, k8s_literal
from tests.conftest import STACKS, plan_for

K8S_STACKS = [s for s in STACKS if load_stack(s).platform != "aws-ec2"]
ALLOWED_NAMES = set(K8S_VAR_NAMES)
LWS_EXAMPLES = {ref[2:-1]: value for ref, value in EXAMPLE_REF_VALUES.items()}


def expand(text: str, mapping: Callable[[str], str | None]) -> str:
    """Kubernetes' expansion (third_party/forked/golang/expansion/expand.go, ported line by line):
    ``$$`` -> ``$``; ``$(NAME)`` -> its value, or left as written when ``mapping`` has none; an
    unclosed ``$(`` and any other ``$x`` stay as they are."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1:]
            if rest[0] == "$":
                read, advance = "$", 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                if close == -1:
                    read, advance = "$(", 1
                else:
                    name = rest[1:close]
                    value = mapping(name)
                    read, advance = (f"$({name})" if value is None else value), close + 1
            else:
                read, advance = "$" + rest[0], 1
            out.append(read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


@pytest.mark.parametrize("text", ["plain", "$(VLLM_API_KEY)", "a$$b", "$$(X)", "$", "x$", "$(unclosed", "$x$(Y)$$$",
                                  "{{ '$(HOME)' }} $PATH ${HOME}", "$(LWS_LEADER_ADDRESS)x", "$(LWS_LEADER_ADDRESS)",
                                  "$(LWS_WORKER_INDEX)", "--node-rank=$(LWS_WORKER_INDEX)"])
def test_escaped_text_expands_back_to_itself(text):
    """A port of the kubelet's expansion turns ``k8s_literal(text)`` back into ``text``, whatever the
    env holds, the LeaderWorkerSet's variables included (the last round kept a user's literal
    ``$(LWS_LEADER_ADDRESS)`` as a reference: it expanded to the leader's address)."""
    mapping = {"VLLM_API_KEY": "SECRET", "HOME": "/root", "X": "x", "Y": "y", **LWS_EXAMPLES}.get
    assert expand(k8s_literal(text), mapping) == text


def test_only_the_marked_positions_stay_references():
    """``k8s_argv`` leaves a reference only at the positions a builder marked; the same text
    elsewhere is literal, and a marked position that is not one of the program's references is refused."""
    argv = ["--master-addr", "$(LWS_LEADER_ADDRESS)", "--response-role", "$(LWS_LEADER_ADDRESS)"]
    got = [expand(a, LWS_EXAMPLES.get) for a in k8s_argv(argv, references={1})]
    assert got == ["--master-addr", "10.0.0.1", "--response-role", "$(LWS_LEADER_ADDRESS)"]
    with pytest.raises(ValueError, match="not one of the program's references"):
        k8s_argv(["$(VLLM_API_KEY)"], references={0})


def _containers(node: Any) -> Iterator[dict[str, Any]]:
    """Every container (init and sidecar included) of every pod spec under ``node``."""
    if isinstance(node, Mapping):
        if "containers" in node and isinstance(node["containers"], list):
            yield from node["containers"]
            yield from node.get("initContainers") or []
        for value in node.values():
            yield from _containers(value)
    elif isinstance(node, list):
        for value in node:
            yield from _containers(value)


def _expanded_items(container: dict[str, Any]) -> Iterator[str]:
    """Every string the kubelet expands in a container."""
    yield from container.get("command") or []
    yield from container.get("args") or []
    for env in container.get("env") or []:
        if "value" in env:
            yield env["value"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        yield from ((container.get(probe) or {}).get("exec") or {}).get("command") or []


USER_TEXT = "$(VLLM_API_KEY) $$ {{ '$(HOME)' }}"
# What a user may write in extraArgs (a root path, a role name): the LeaderWorkerSet's names too.
USER_LWS_TEXT = "{{ '$(LWS_LEADER_ADDRESS)' }} rank $(LWS_WORKER_INDEX)"


def _with_user_text(stack: str):
    from components.core.config import read_stack_config

    vllm = dict(read_stack_config(stack).get("kimi-deploy:vllm") or {})
    vllm["extraArgs"] = ["--response-role", USER_TEXT, "--root-path", USER_LWS_TEXT]
    return plan_for(stack, overrides={"kimi-deploy:vllm": vllm})


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_no_container_references_a_variable_but_the_programs_own(stack):
    """Every string the kubelet expands, in every container of every rendered pod, with user text
    holding ``$(VLLM_API_KEY)`` in extraArgs: the only ``$(NAME)`` the kubelet would resolve are
    the LeaderWorkerSet's (today's code left ``$(VLLM_API_KEY)`` in the vLLM argv: the key in argv)."""
    run = _with_user_text(stack)
    seen: set[str] = set()
    containers = [c for r in run.resources for c in _containers(r.inputs)]
    assert any(c["name"] == "vllm" for c in containers)
    for container in containers:
        for item in _expanded_items(container):
            expand(item, lambda name: seen.add(name) or None)  # type: ignore[func-returns-value]
    assert seen <= ALLOWED_NAMES, seen - ALLOWED_NAMES


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_the_vllm_container_runs_the_cores_argv_exactly(stack):
    """The kubelet's expansion of each rendered vLLM command (LWS variables set to examples) is the
    core's argv with those examples: user text with ``$(`` and ``$$`` included, byte for byte."""
    run = _with_user_text(stack)
    roles = build_vllm_command(run.context.spec).roles
    assert any(USER_TEXT in role.argv for role in roles)
    assert all(USER_LWS_TEXT in role.concrete_argv() for role in roles)
    expected = sorted(tuple(role.concrete_argv()) for role in roles)
    vllm = [c for r in run.resources for c in _containers(r.inputs) if c["name"] == "vllm"]
    got = sorted(tuple(expand(a, LWS_EXAMPLES.get) for a in c["command"]) for c in vllm)
    assert sorted(set(got)) == sorted(set(expected))
    # The user's text reaches every vLLM container byte for byte, LWS names included.
    assert all(USER_TEXT in cmd and USER_LWS_TEXT in cmd for cmd in got)
