"""One command (scripts/cli.py, `kimi-deploy`): subcommands, --help at every level, exit codes,
the packaging metadata behind `pip install -e .`, and no sys.path edits anywhere."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib

import pytest

from scripts import cli
from tests.conftest import REPO_ROOT, without_overlay_notice

SUBCOMMANDS = ["plan", "diff", "preflight", "validate", "cost", "measure", "sweep", "sync", "bench", "engine", "iam-policy",
               "config", "vllm-argv"]


def test_top_level_help_lists_every_subcommand(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kimi-deploy <command>")
    for name in SUBCOMMANDS:
        assert f"\n  {name} " in out
    assert cli.main([]) == 0 and "commands:" in capsys.readouterr().out
    assert list(cli.SUBCOMMANDS) == SUBCOMMANDS


def test_unknown_command_is_one_line_and_exit_2(capsys):
    assert cli.main(["deploy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown command 'deploy'" in err and "plan, diff, preflight" in err


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_subcommand_has_its_scripts_help(name, capsys):
    """`kimi-deploy NAME --help` is the script's own parser and help text (exit 0)."""
    try:
        code = cli.main([name, "--help"])
    except SystemExit as exc:  # argparse's --help
        code = exc.code
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("usage: ") and "--help" in out
    module = __import__(cli.SUBCOMMANDS[name].module, fromlist=["main"])
    first_line = (module.__doc__ or "").strip().splitlines()[0].rstrip(".")
    assert out.count("\n") > 5 and first_line, name  # the script's own, documented parser


def test_subcommand_calls_the_scripts_main_with_the_rest_of_argv(monkeypatch):
    from scripts.ops import cost

    seen = []
    monkeypatch.setattr(cost, "main", lambda argv: seen.append(list(argv)) or 1)
    assert cli.main(["cost", "--stack", "b300", "--json"]) == 1  # the script's exit code, unchanged
    assert seen == [["--stack", "b300", "--json"]]


def test_config_error_is_exit_2_one_line():
    proc = without_overlay_notice(subprocess.run([sys.executable, "-m", "scripts.cli", "cost", "--stack", "no-such-stack"],
                                                 capture_output=True, text=True, timeout=120))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_plan_runs_from_another_directory(tmp_path):
    """The package, not the working directory, locates the stacks: run from an empty directory."""
    proc = subprocess.run([sys.executable, "-m", "scripts.cli", "plan", "--stack", "mi355x", "--format", "json",
                           "--now", "2026-12-01T00:00:00Z"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["stack"] == "mi355x" and doc["resources"]


def test_pyproject_declares_one_console_script_and_the_packages():
    meta = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert meta["project"]["scripts"] == {"kimi-deploy": "scripts.cli:console_main"}
    # Dependencies: the pins of requirements.txt, read from that file (one place).
    assert "dependencies" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["dependencies"] == {"file": ["requirements.txt"]}
    include = meta["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in ("components", "scripts", "policy"):
        assert f"{package}*" in include
        assert (REPO_ROOT / package / "__init__.py").is_file(), f"{package} must be a regular package"


def _sys_path_edits(tree: ast.AST) -> list[int]:
    """Lines that change sys.path: sys.path.insert/append/extend(...), sys.path[...] = ..., sys.path = ..."""
    def is_sys_path(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        )

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value) \
                and node.func.attr in ("insert", "append", "extend"):
            lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)):
                    lines.append(node.lineno)
    return sorted(lines)


def test_nothing_edits_sys_path():
    """The package is imported as installed (`pip install -e .`) or from the repository root
    (pytest's pythonpath, `python -m`); no module patches the import path. (plan_diff's
    _ISOLATED_PLAN is a program text run in another interpreter for another tree, not code here.)"""
    offenders = []
    for folder in ("components", "scripts", "policy", "tests"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            for line in _sys_path_edits(ast.parse(path.read_text(), str(path))):
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{line}")
    assert offenders == []


def test_the_sys_path_detector_can_fail():
    code = "import sys\nsys.path.insert(0, 'x')\nsys.path[:0] = ['y']\nsys.path.append('z')\n"
    assert _sys_path_edits(ast.parse(code)) == [2, 3, 4]


def test_the_pure_core_imports_nothing_from_scripts_or_pulumi():
    """components/core is the pure core: no Pulumi, and never the operator scripts (scripts/
    depends on the core, not the other way round)."""
    import ast
    from pathlib import Path

    core = Path(__file__).resolve().parents[1] / "components" / "core"
    offenders = []
    for path in sorted(core.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            forbidden = ("scripts", "pulumi", "pulumi_aws", "pulumi_kubernetes")
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in forbidden]
    assert offenders == []


def test_version_is_the_installed_distributions(capsys):
    from importlib.metadata import version

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"kimi-deploy {version('kimi-deploy')}\n"


# --- --output is never an input of the command (new-user trial: `plan --output stacks/Pulumi.S.yaml`
# replaced the stack's config, secure: ciphertexts included, with the plan text and exited 0)


@pytest.mark.parametrize("command", [["plan", "--stack", "b300"], ["diff", "--against", "HEAD", "--stack", "b300"]])
@pytest.mark.parametrize("how", ["the stack file", "a link to it", "a spelling with .. and //", "a new stack file"])
def test_an_output_that_is_a_stack_file_is_refused_and_the_file_kept(command, how, tmp_path):
    stack_file = REPO_ROOT / "stacks" / "Pulumi.b300.yaml"
    before = stack_file.read_bytes()
    link = tmp_path / "link.yaml"
    link.symlink_to(stack_file)
    output = {"the stack file": "stacks/Pulumi.b300.yaml", "a link to it": str(link),
              "a spelling with .. and //": "docs/..//stacks/./Pulumi.b300.yaml",
              "a new stack file": "stacks/Pulumi.plan-output.yaml"}[how]
    proc = subprocess.run([sys.executable, "-m", "scripts.cli", *command, "--output", output], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert without_overlay_notice(proc).stderr.startswith(f"error: --output: {output!r} is ") and "stacks" in proc.stderr
    assert len(proc.stderr.splitlines()) <= 2 and stack_file.read_bytes() == before
    assert not (REPO_ROOT / "stacks" / "Pulumi.plan-output.yaml").exists()


@pytest.mark.parametrize("text", ["config:\n  kimi-deploy:hfToken:\n    secure: v1:abc==\n",
                                  'config:\n  kimi-deploy:hfToken: {secure: "v1:abc=="}\n',
                                  '{"kimi-deploy:hfToken": {"secure": "v1:abc=="}}'])
def test_an_output_file_holding_secure_values_is_not_overwritten(text, tmp_path):
    from scripts.ops import _cli

    copy = tmp_path / "Pulumi.backup.yaml"
    copy.write_text(text)
    with pytest.raises(_cli.UsageError, match="holds secure: values"):
        _cli.check_output_path("--output", str(copy))
    assert copy.read_text() == text
    plain = tmp_path / "plan.txt"
    plain.write_text("an old plan: secure values stay out of plans\n")  # prose naming the word is no secret
    _cli.check_output_path("--output", str(plain))
    _cli.check_output_path("--output", str(tmp_path / "new.txt"))
    with pytest.raises(_cli.UsageError, match="is a directory"):
        _cli.check_output_path("--output", str(tmp_path))


@pytest.mark.parametrize("output", ["__main__.py", "components/core/versions.py", "components/core/config/reader.py",
                                    "pyproject.toml", "Makefile", "README.md", ".git/config", ".venv/bin/kimi-deploy",
                                    "docs/plan.md", "tests/new_file.py"])
def test_an_output_that_is_the_program_is_refused(output):
    """A fresh new-user trial: `plan --output __main__.py` exited 0 and replaced the program (and
    versions.py, pyproject.toml, .git/config...): the program the command runs is an input too."""
    from scripts.ops import _cli

    with pytest.raises(_cli.UsageError, match=": write the output elsewhere") as info:
        _cli.check_output_path("--output", str(REPO_ROOT / output))
    # Said as what it is (new-user trial t632: README.md was called something the command reads).
    kind = {"README.md": "a file of the project's checkout", "docs/plan.md": "a file of the project's checkout",
            "tests/new_file.py": "a file of the project's checkout", "Makefile": "a file of the project's checkout",
            ".git/config": "the checkout's git metadata"}.get(output, "part of the program this command runs")
    assert kind in str(info.value) and "this command reads" not in str(info.value), str(info.value)
    _cli.check_output_path("--output", str(REPO_ROOT / "plan.txt"))  # a new file beside them is fine


def test_plan_output_onto_the_program_exits_2_and_keeps_it():
    main = REPO_ROOT / "__main__.py"
    before = main.read_bytes()
    proc = subprocess.run([sys.executable, "-m", "scripts.cli", "plan", "--stack", "b300", "--output", "__main__.py"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "__main__.py" in proc.stderr and main.read_bytes() == before


@pytest.mark.parametrize("value", ["[" * 50_000 + "]" * 50_000, "9" * 5_000, '{"a": "[[[[ \\" ]]]]"}'])
def test_an_overlay_too_deep_or_too_long_is_one_line(value):
    """A fresh new-user trial: 50,000 nested brackets (RecursionError) and a 5,000-digit integer
    (ValueError) in KIMI_DEPLOY_CONFIG_OVERLAY ended in tracebacks."""
    env = {**os.environ, "KIMI_DEPLOY_CONFIG_OVERLAY": '{"kimi-deploy:prices": ' + value + "}"}
    proc = subprocess.run([sys.executable, "-m", "scripts.cli", "plan", "--stack", "b300"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    # Brackets inside a JSON string do not nest: that value reaches the key's own check.
    assert ("prices.a" if value.startswith("{") else "KIMI_DEPLOY_CONFIG_OVERLAY") in proc.stderr, proc.stderr


@pytest.mark.parametrize("overlay,key", [
    ('{"kimi-deploy:HFToken": "hf_abcdefghijklmnopqrstuvwxyz123456"}', "kimi-deploy:HFToken"),
    ('{"kimi-deploy:vllm": {"hf_token": "hf_abcdefghijklmnopqrstuvwxyz123456"}}', "kimi-deploy:vllm.hf_token"),
])
def test_an_unknown_key_never_prints_its_value_which_may_be_a_misfiled_token(overlay, key):
    """A fresh trial's `kimi-deploy:HFToken: hf_...` (hfToken misspelt) printed the token in the error line."""
    env = {**os.environ, "KIMI_DEPLOY_CONFIG_OVERLAY": overlay}
    proc = subprocess.run([sys.executable, "-m", "scripts.cli", "plan", "--stack", "b300"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"error: {key}: " in proc.stderr and "not a known key" in proc.stderr, proc.stderr
    assert "hf_abcdefghij" not in proc.stderr + proc.stdout
