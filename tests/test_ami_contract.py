"""The AMI contract (components/aws/ami_contract.py): the rendered scripts call nothing it does
not list, and its check fails early with one line naming what is missing. That the list is
complete on a real system is proven by the VM tier (tests/test_vm_boot.py), whose guest is built
from it."""

from __future__ import annotations

import base64
import re
import subprocess

import pytest
import yaml

from components.aws import ami_contract, userdata
from tests.conftest import plan_for

# Shell words that are not commands on PATH: keywords and bash builtins the scripts use.
SHELL_WORDS = {"if", "then", "fi", "else", "elif", "for", "do", "done", "case", "esac", "in", "while", "echo", "exit",
               "set", "trap", "return", "printf", "local", "shift", "command", "[", "[[", "test", "true", "false",
               "export", "read", "exec", "umask", "continue", "break", "!", "{", "}"}


@pytest.fixture(scope="module")
def scripts() -> dict[str, str]:
    doc = yaml.safe_load(base64.b64decode(plan_for("b300").named("gpu-lt").inputs["userData"]).decode())
    return {f["path"]: f["content"] for f in doc["write_files"] if f["path"].endswith(".sh")}


def commands_called(text: str) -> set[str]:
    """The first word of every simple command in a bash script, inside command substitutions too
    (quoted text and variable assignments skipped; functions it defines left out)."""
    functions = set(re.findall(r"^\s*([\w-]+)\(\)\s*\{", text, re.M))
    found = set()
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        pieces = [line]
        while m := re.search(r"\$\(([^()]*)\)", pieces[0]):  # innermost substitutions first
            pieces.append(m.group(1))
            pieces[0] = pieces[0][:m.start()] + " '' " + pieces[0][m.end():]
        for piece in pieces:
            piece = re.sub(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"", " '' ", piece)
            for segment in re.split(r"\|\||&&|\||;|\bthen\b|\bdo\b|\belse\b|[{}()]", piece):
                words = segment.split()
                while words and (words[0] in ("if", "!", "exec", "while", "elif") or re.match(r"^\w+(\+)?=", words[0])):
                    words = words[1:]
                if words and re.fullmatch(r"[A-Za-z][\w.+-]*", words[0]) and words[0] not in SHELL_WORDS | functions:
                    found.add(words[0])
    return found


def test_the_rendered_scripts_call_only_commands_the_contract_lists(scripts):
    listed = {r.name for r in ami_contract.AMI_REQUIREMENTS if r.kind == "command"}
    called = set().union(*(commands_called(t) for t in scripts.values()))
    # the parser sees them, inside substitutions too
    assert {"aws", "blkid", "cat", "dirname", "docker", "mdadm", "mkfs.xfs", "sha256sum", "systemctl"} <= called
    assert called <= listed, f"not in components/aws/ami_contract.py: {sorted(called - listed)}"


def test_every_listed_command_is_used_by_the_user_data(scripts):
    text = "\n".join(scripts.values()) + "\n".join(userdata.systemd_units(_cfg()).values())
    unused = [r.name for r in ami_contract.AMI_REQUIREMENTS if r.kind == "command" and r.name not in text
              and r.name not in ("bash", "cloud-init", "nvidia-container-runtime-hook", "sh")]
    assert not unused  # bash, cloud-init, sh: run the scripts; the hook: run by docker --gpus


def _cfg() -> userdata.Ec2BootConfig:
    return userdata.Ec2BootConfig(region="us-east-1", image="img:tag", vllm_argv=("vllm", "serve"), vllm_env={},
                                  port=8000, sync_steps=(), tools_uri="s3://b/_tools/w.pyz", tools_sha256="0" * 64,
                                  api_key_parameter="/p/a", hub_token_parameter=None, hub_token_env="HF_TOKEN",
                                  nvme_devices=8)


def _check(tmp_path, present: set[str], *, dlami: bool = False, efa: bool = False, docker_unit: bool = True):
    """Run the check with only ``present`` on PATH (stubs); ``mountpoint`` reports the DLAMI array."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in present | {"mountpoint", "systemctl"}:
        body = "exit 0"
        if name == "mountpoint":
            body = f"exit {0 if dlami else 1}"
        elif name == "systemctl":
            body = f"exit {0 if docker_unit else 1}"
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "ami-check.sh"
    script.write_text(ami_contract.check_script(efa))
    return subprocess.run(["/bin/bash", str(script)], capture_output=True, text=True, env={"PATH": str(bin_dir)})


ALL = {r.name for r in ami_contract.AMI_REQUIREMENTS if r.kind == "command"}


def test_a_complete_ami_passes_silently(tmp_path):
    result = _check(tmp_path, ALL)
    assert result.returncode == 0 and result.stdout == result.stderr == ""


def test_what_is_missing_is_named_in_one_line_with_its_package(tmp_path):
    result = _check(tmp_path, ALL - {"mdadm", "aws"}, docker_unit=False)
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(ami_contract.CHECK_SCRIPT_MESSAGE)
    assert "aws (package awscli-2), docker.service (package docker), mdadm (package mdadm)" in line


def test_the_dlami_array_makes_the_raid_tools_unnecessary_and_efa_needs_its_devices(tmp_path):
    raid_tools = {r.name for r in ami_contract.AMI_REQUIREMENTS if r.when == "no-dlami-array" and r.kind == "command"}
    assert _check(tmp_path, ALL - raid_tools, dlami=True).returncode == 0
    assert _check(tmp_path, ALL - raid_tools, dlami=False).returncode == 1
    result = _check(tmp_path, ALL, efa=True)
    assert result.returncode == (0 if __import__("os").path.exists(ami_contract.EFA_DEVICE_PATH) else 1)
    if result.returncode:
        assert f"{ami_contract.EFA_DEVICE_PATH} (package aws-efa-installer)" in result.stderr


def test_the_guest_image_is_built_from_the_contract():
    from tests.vm.image import GUEST_PACKAGES

    assert set(ami_contract.DEBIAN_PACKAGES) <= set(GUEST_PACKAGES)
    assert {"awscli", "docker.io", "mdadm", "xfsprogs", "cloud-init", "systemd"} <= set(ami_contract.DEBIAN_PACKAGES)


def test_the_readme_lists_every_requirement():
    from tests.user_docs import section as doc_section

    section = doc_section("AMI contract")
    missing = [r.name for r in ami_contract.AMI_REQUIREMENTS if f"`{r.name}`" not in section and r.name not in section]
    assert not missing, f"the docs' section 'AMI contract' does not name {missing}"
