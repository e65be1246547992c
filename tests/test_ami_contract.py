"""The AMI contracts (components/aws/ami_contract.py), one per role: the rendered scripts of each
role's user data call nothing its contract does not list, and its check fails early with one line
naming what is missing. That the lists are complete on a real system is proven by the VM tier
(tests/test_vm_boot.py), whose guest is built from them and boots both roles' user data."""

from __future__ import annotations

import base64
import re
import shutil
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


@pytest.fixture(scope="module")
def stager_files() -> dict[str, str]:
    """The stager's user data (b300, phase: stage) as its files: path -> content."""
    run = plan_for("b300", overrides={"kimi-deploy:phase": "stage"})
    instance = next(r for r in run.resources if r.type == "aws:ec2/instance:Instance")
    doc = yaml.safe_load(base64.b64decode(instance.inputs["userDataBase64"]).decode())
    return {f["path"]: f["content"] for f in doc["write_files"]}


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
    listed = {r.name for r in ami_contract.CONTRACTS["serve"].requirements if r.kind == "command"}
    called = set().union(*(commands_called(t) for t in scripts.values()))
    # the parser sees them, inside substitutions too
    assert {"aws", "blkid", "cat", "dirname", "docker", "mdadm", "mkfs.xfs", "sha256sum", "systemctl"} <= called
    assert called <= listed, f"not in components/aws/ami_contract.py: {sorted(called - listed)}"


def test_every_listed_command_is_used_by_the_user_data(scripts):
    text = "\n".join(scripts.values()) + "\n".join(userdata.systemd_units(_cfg()).values())
    unused = [r.name for r in ami_contract.CONTRACTS["serve"].requirements if r.kind == "command" and r.name not in text
              and r.name not in ("bash", "cloud-init", "nvidia-container-runtime-hook", "sh")]
    assert not unused  # bash, cloud-init, sh: run the scripts; the hook: run by docker --gpus


def test_the_stagers_scripts_call_only_what_its_own_contract_lists_and_it_has_no_gpu_item(stager_files):
    contract = ami_contract.CONTRACTS["stage"]
    listed = {r.name for r in contract.requirements if r.kind == "command"}
    scripts = {p: t for p, t in stager_files.items() if p.endswith(".sh")}
    units = "\n".join(t for p, t in stager_files.items() if p.endswith(".service"))
    called = set().union(*(commands_called(t) for t in scripts.values()))
    assert {"aws", "docker", "mdadm", "mkfs.xfs", "systemctl", "dnf"} <= called
    assert called <= listed, f"not in the stage contract: {sorted(called - listed)}"
    unused = [n for n in listed if n not in "\n".join(scripts.values()) + units and n not in ("bash", "cloud-init", "sh")]
    assert not unused, unused
    names = {r.name for r in contract.requirements}
    assert "nvidia-container-runtime-hook" not in names and ami_contract.EFA_DEVICE_PATH not in names
    assert "nvidia" not in scripts[userdata.AMI_CHECK_SCRIPT]
    # what the standard AL2023 AMI lacks is installed by its own user data; the GPU AMI installs nothing
    assert contract.installs == ("docker", "mdadm") and ami_contract.CONTRACTS["serve"].installs == ()
    assert scripts[userdata.AMI_CHECK_SCRIPT] == ami_contract.check_script("stage")


def _cfg() -> userdata.Ec2BootConfig:
    return userdata.Ec2BootConfig(region="us-east-1", image="img:tag", vllm_argv=("vllm", "serve"), vllm_env={},
                                  port=8000, sync_steps=(), tools_uri="s3://b/_tools/w.pyz", tools_sha256="0" * 64,
                                  api_key_parameter="/p/a", hub_token_parameter=None, hub_token_env="HF_TOKEN",
                                  nvme_devices=8)


def _check(tmp_path, present: set[str], *, dlami: bool = False, efa: bool = False, docker_unit: bool = True,
           role: ami_contract.Role = "serve"):
    """Run ``role``'s check with only ``present`` on PATH (stubs); ``mountpoint`` reports the DLAMI
    array; ``systemctl cat docker.service`` finds the unit when ``docker_unit`` or once the ``dnf``
    stub installed docker (it records its arguments and puts each package's command and unit in place)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in present | {"mountpoint", "systemctl"}:
        body = "exit 0"
        if name == "mountpoint":
            body = f"exit {0 if dlami else 1}"
        elif name == "systemctl":
            body = (f'[ "$1" = cat ] || exit 0; [ {int(docker_unit)} = 1 ] || [ -e "{tmp_path}/docker.service" ]')
        elif name == "dnf":
            body = (f'echo "$*" >>"{tmp_path}/dnf.log"\nfor p in "$@"; do case "$p" in -*|install) ;; '
                    f'*) printf "#!/bin/bash\\n" >"{bin_dir}/$p"; {shutil.which("chmod")} 755 "{bin_dir}/$p"; '
                    f': >"{tmp_path}/$p.service" ;; esac; done')
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    script = bin_dir.parent / "ami-check.sh"
    script.write_text(ami_contract.check_script(role, efa))
    return subprocess.run(["/bin/bash", str(script)], capture_output=True, text=True, env={"PATH": str(bin_dir)})


ALL = {r.name for r in ami_contract.AMI_REQUIREMENTS if r.kind == "command"}
# A plain Amazon Linux 2023 instance (the stager's AMI): no NVIDIA Container Toolkit, no docker, no mdadm.
PLAIN_AL2023 = ALL - {"nvidia-container-runtime-hook", "docker", "mdadm"}


def test_a_complete_ami_passes_with_one_line(tmp_path):
    result = _check(tmp_path, ALL - {"dnf"})
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == "kimi-deploy: AMI contract (serve): every item present\n"


def test_the_stagers_contract_holds_on_plain_al2023_after_installing_docker_and_mdadm(tmp_path):
    result = _check(tmp_path, PLAIN_AL2023, docker_unit=False, role="stage")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["kimi-deploy: installing docker mdadm (not on this AMI)",
                                          "kimi-deploy: AMI contract (stage): every item present"]
    assert (tmp_path / "dnf.log").read_text().split() == ["install", "-y", "-q", "docker", "mdadm"]
    # The serve contract on the same instance: the GPU item is named, nothing is installed.
    serve = _check(tmp_path / "serve", PLAIN_AL2023, role="serve")
    assert serve.returncode == 1 and "nvidia-container-runtime-hook (package nvidia-container-toolkit)" in serve.stderr
    assert "contract: serve" in serve.stderr and not (tmp_path / "serve" / "dnf.log").exists()


def test_the_stagers_contract_names_what_it_cannot_install_in_one_line(tmp_path):
    result = _check(tmp_path, PLAIN_AL2023 - {"dnf", "mkfs.xfs"}, docker_unit=False, role="stage")
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line == (f"{ami_contract.CHECK_SCRIPT_MESSAGE} dnf (package dnf), docker (package docker), docker.service "
                    "(package docker), mdadm (package mdadm), mkfs.xfs (package xfsprogs); contract: stage "
                    "(docs/operations.md: AMI contract)")
    # Present already (the VM guest's Debian packages): nothing installed, dnf not needed.
    present = _check(tmp_path / "debian", ALL - {"dnf"}, role="stage")
    assert present.returncode == 0 and "installing" not in present.stdout


def test_what_is_missing_is_named_in_one_line_with_its_package(tmp_path):
    result = _check(tmp_path, ALL - {"mdadm", "aws"}, docker_unit=False)
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(ami_contract.CHECK_SCRIPT_MESSAGE)
    assert "aws (package awscli-2), docker.service (package docker), mdadm (package mdadm); contract: serve" in line


def test_the_dlami_array_makes_the_raid_tools_unnecessary_and_efa_needs_its_devices(tmp_path):
    raid_tools = {r.name for r in ami_contract.AMI_REQUIREMENTS if r.when == "no-dlami-array" and r.kind == "command"}
    assert _check(tmp_path, ALL - raid_tools, dlami=True).returncode == 0
    assert _check(tmp_path, ALL - raid_tools, dlami=False).returncode == 1
    result = _check(tmp_path, ALL - {"dnf"}, efa=True)
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
