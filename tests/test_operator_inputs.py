"""What the operator commands do with what a new user types: the offline config overlay named in the
first line of every command that reads config (and applied to one side of a diff), an empty
``--now``, a misspelt flag in ``vllm-argv``, a copy into its own source, benchmark sizes of 0, a
closed pipe, RST in ``--help``, notes that follow the terminal's width, a missing price said once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.ops import _cli
from tests.conftest import FIXED_NOW, REPO_ROOT, TEST_ENGINE_TAG

# An overlay of two keys, as a user would try an engine build on a stack (and the suite's own engine).
OVERLAY = {"kimi-deploy:vllm": {"imageTag": TEST_ENGINE_TAG}, "kimi-deploy:owner": "trial-team"}
OVERLAY_KEYS = "kimi-deploy:vllm.imageTag, kimi-deploy:owner"
NOTICE = f"note: KIMI_DEPLOY_CONFIG_OVERLAY is active: {OVERLAY_KEYS} set "


def _env(overlay: dict | None = OVERLAY, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KIMI_DEPLOY_CONFIG_OVERLAY"}
    if overlay is not None:
        env["KIMI_DEPLOY_CONFIG_OVERLAY"] = json.dumps(overlay)
    return {**env, **extra}


def _kimi(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scripts.cli", *args], cwd=REPO_ROOT, env=env or _env(),
                          capture_output=True, text=True, timeout=timeout)


# --- KIMI_DEPLOY_CONFIG_OVERLAY: said first, by every command that reads config -----------------------


@pytest.mark.parametrize(
    "args,stream",
    [
        (["plan", "--stack", "b300", "--now", "2026-12-01T00:00:00Z"], "stdout"),  # the table's own first line
        (["plan", "--stack", "b300", "--format", "json", "--now", "2026-12-01T00:00:00Z"], "stderr"),
        (["plan", "--all", "--now", "2026-12-01T00:00:00Z"], "stderr"),
        (["cost", "--stack", "b300"], "stderr"),
        (["iam-policy", "--stack", "b300"], "stderr"),  # stdout is the policy alone
    ],
    ids=["plan-table", "plan-json", "plan-all", "cost", "iam-policy"],
)
def test_a_command_that_reads_config_names_the_overlay_in_its_first_line(args, stream):
    out = _kimi(*args)
    assert out.returncode in (0, 2), out.stderr
    first = getattr(out, stream).splitlines()[0]
    if stream == "stdout":
        assert first.startswith("overlay: KIMI_DEPLOY_CONFIG_OVERLAY sets kimi-deploy:vllm.imageTag,"), first
    else:
        assert first.startswith(NOTICE) and "`pulumi up` reads the stack file alone" in first, first
    if args[0] == "iam-policy":
        json.loads(out.stdout)  # still the policy document alone
    without = _kimi(*args, env=_env(None))
    assert "KIMI_DEPLOY_CONFIG_OVERLAY" not in without.stdout + without.stderr


@pytest.mark.parametrize("command", ["preflight", "engine"])
def test_preflight_and_engine_verify_name_the_overlay_before_reading_a_stack(command, monkeypatch, capsys):
    from components.core.errors import ConfigError
    from scripts.ops import engine_verify, preflight

    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", json.dumps(OVERLAY))

    def stop(*_args, **_kwargs):
        raise ConfigError("--stack", "b300", "stops here (test)")

    if command == "preflight":
        monkeypatch.setattr(preflight, "load_stack", stop)
        code = _cli.run_cli(preflight.main, ["--stack", "b300"])
    else:
        monkeypatch.setattr(engine_verify, "stacks_for_image", stop)
        code = _cli.run_cli(engine_verify.main, ["verify", "--image", f"vllm/vllm-openai:{TEST_ENGINE_TAG}"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and err[0].startswith(NOTICE) and err[1].startswith("error: --stack"), err


def test_a_plan_document_lists_the_overlays_keys_and_markdown_says_it_first(monkeypatch):
    from scripts.ops.plan import build_plan_document, render_markdown

    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", json.dumps(OVERLAY))
    doc = build_plan_document("b300", now=FIXED_NOW)
    assert doc["config_overlay"] == ["kimi-deploy:vllm.imageTag", "kimi-deploy:owner"]
    assert render_markdown(doc).startswith("> overlay: KIMI_DEPLOY_CONFIG_OVERLAY sets kimi-deploy:vllm.imageTag")


def test_diff_applies_the_overlay_to_the_working_trees_side_only():
    """Applied to both sides, an overlay cancels out and the diff says "no changes"; applied to the
    working tree's side, the diff shows what writing it into the stack file would change, and says
    so in its first line."""
    image = "vllm/vllm-openai:nightly-" + "1" * 40
    overlay = {"kimi-deploy:vllm": {"image": image}}
    out = _kimi("diff", "--against", "HEAD", "--stack", "b300", "--format", "json", "--now", "2026-12-01T00:00:00Z",
                env=_env(overlay), timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith("note: KIMI_DEPLOY_CONFIG_OVERLAY is active: kimi-deploy:vllm.image set over the working "
                                 "tree's stack files only (the base at HEAD is read as committed)")
    diff = json.loads(out.stdout)
    assert diff["config_overlay"] == ["kimi-deploy:vllm.image"]
    # The overlay's build is the working tree's, not the base's: the diff shows the image change.
    from components.core.versions import VLLM_VERSION

    assert {"path": "image", "old": f"vllm/vllm-openai:v{VLLM_VERSION}", "new": image} in diff["vllm"]["fields"]
    assert diff["summary"]["changed"] > 0
    from scripts.ops.diff.render import render_markdown

    assert render_markdown(diff, "b300", "HEAD").startswith(
        "> KIMI_DEPLOY_CONFIG_OVERLAY sets kimi-deploy:vllm.image on the working tree's side only")


# --- command-line values ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["plan", "--stack", "b300"], ["diff", "--against", "HEAD", "--stack", "b300"],
                                     ["sweep", "--region", "us-east-1"]])
@pytest.mark.parametrize("now", ["", "  "])
def test_an_empty_now_is_refused_not_read_as_the_clock(command, now):
    out = _kimi(*command, "--now", now, env=_env(None))
    assert out.returncode == 2, out.stderr
    assert f"--now: {now!r} is empty" in out.stderr and "Traceback" not in out.stderr


def test_vllm_argv_exits_1_when_the_parser_refuses_an_argv(monkeypatch, capsys):
    """Without the real parser (tests/test_vllm_contract.py runs it for real): the exit code follows
    the report, the first refusal in one line on stderr."""
    from scripts.ops import vllm_parser

    report = {"vllm_version": "0.34.0", "results": [
        {"ok": True, "error": None, "stage": None},
        {"ok": False, "error": "unrecognized arguments: --max-num-seqz", "stage": "argparse"},
    ]}
    monkeypatch.setattr(vllm_parser, "find_vllm_python", lambda: Path(sys.executable))
    monkeypatch.setattr(vllm_parser, "run_argv_check", lambda python, request, timeout: report)
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO('{"argvs": [["m"], ["m", "--max-num-seqz", "1"]]}'))
    assert vllm_parser.main([]) == 1
    out = capsys.readouterr()
    assert json.loads(out.out)["results"][1]["ok"] is False
    assert out.err.strip() == ("error: vLLM 0.34.0's parser refused 1 of 2 argv(s); argv 1 [argparse]: unrecognized "
                               "arguments: --max-num-seqz")
    report["results"].pop()
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO('{"argvs": [["m"]]}'))
    assert vllm_parser.main([]) == 0


@pytest.mark.parametrize(
    "source,dest,words",
    [
        ("file://{tmp}/w", "{tmp}/w/copy", "is inside --source"),
        ("file://{tmp}/w", "{tmp}/w", "is --source itself"),
        ("file://{tmp}/w/../w", "{tmp}/w/x/..", "is --source itself"),
        ("file://{tmp}/w/sub", "{tmp}/w", "holds --source"),
        ("s3://bucket/models/kimi", "s3://bucket/models/kimi/rev", "is inside --source"),
        ("s3://bucket/models/kimi/", "s3://bucket/models/kimi", "is --source itself"),
    ],
)
def test_a_weight_sync_into_its_own_source_is_a_usage_error(tmp_path, capsys, source, dest, words):
    from scripts.node import weight_sync as ws

    (tmp_path / "w" / "sub").mkdir(parents=True)
    (tmp_path / "w" / "x").mkdir()
    args = ["--source", source.format(tmp=tmp_path), "--dest", dest.format(tmp=tmp_path), "--quiet"]
    assert ws.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("weight_sync: usage error: --dest") and words in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "source,dest",
    [("file://{tmp}/w", "{tmp}/w2"), ("s3://bucket/models/kimi", "s3://bucket/models/kimi2"),
     ("s3://bucket/a", "s3://other/a/b"), ("hf://org/repo@main", "{tmp}/w")],
)
def test_neighbours_are_not_nested(tmp_path, source, dest):
    from scripts.node.weight_sync.cli import check_not_nested

    check_not_nested(source.format(tmp=tmp_path), dest.format(tmp=tmp_path))  # no error


@pytest.mark.parametrize(
    "args,words",
    [(["--total-gb", "0"], "--total-gb: 0 must be more than 0"), (["--total-gb", "-1"], "--total-gb: -1"),
     (["--total-gb", "nan"], "--total-gb: nan"), (["--files", "0"], "--files: 0 must be between 1"),
     (["--repeat", "0"], "--repeat: 0 must be between 1"), (["--workers", "0"], "--workers: 0"),
     (["--total-gb", "0.0000001", "--files", "112"], "cannot hold 112 files")],
)
def test_benchmark_sizes_of_zero_or_below_are_usage_errors(args, words):
    out = _kimi("bench", *args, env=_env(None), timeout=60)
    assert out.returncode == 2 and words in out.stderr and out.stderr.count("\n") == 1, out.stderr


# --- output -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_plan_into_a_pipe_that_closes_early_exits_0_quietly(fmt):
    """`kimi-deploy plan | head` exits 0 with nothing on stderr, as `git log | head` does."""
    cmd = (f"{sys.executable} -m scripts.cli plan --stack b300 --format {fmt} --now 2026-12-01T00:00:00Z | head -c 20 "
           ">/dev/null; exit ${PIPESTATUS[0]}")
    out = subprocess.run(["bash", "-c", cmd], cwd=REPO_ROOT, env=_env(None), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr


def test_run_cli_maps_a_closed_pipe_from_rich_to_exit_0(monkeypatch):
    from rich.console import Console

    def main(_argv):
        Console().on_broken_pipe()  # what rich calls on EPIPE (its default exits 1)
        return 1

    assert _cli.run_cli(main, []) == 0


def test_no_help_shows_rst_markup():
    for args in [[name, "--help"] for name in ("plan", "diff", "preflight", "validate", "cost", "sweep", "sync", "bench",
                                               "engine", "iam-policy", "vllm-argv")] + [["engine", "verify", "--help"]]:
        out = _kimi(*args, env=_env(None), timeout=60)
        assert out.returncode == 0 and "``" not in out.stdout and ":func:" not in out.stdout, args


def test_notes_follow_the_terminal_width(monkeypatch, capsys):
    from scripts.ops import sweep

    note = ("no AWS credentials set: using dummy credentials for the local endpoint http://127.0.0.1:5999 "
            "(a moto server; nothing reaches AWS)")

    class FakeSweeper:
        def __init__(self, *args, **kwargs):
            pass

        def run(self):
            sweep.SESSION_NOTES.append(note)
            return {"exit_code": 0}

    monkeypatch.setattr(sweep, "Sweeper", FakeSweeper)
    monkeypatch.setattr(sweep, "SESSION_NOTES", [])
    monkeypatch.setenv("COLUMNS", "60")
    assert sweep.main(["--region", "us-east-1", "--json"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("note: no AWS credentials") and all(len(line) <= 60 for line in lines), lines
    assert " ".join(line.strip() for line in lines) == f"note: {note}"


def test_cost_says_a_missing_price_once_with_the_fix_once():
    out = _kimi("cost", "--stack", "mi355x", env=_env(None, COLUMNS="200"))
    text = out.stdout + out.stderr
    assert out.returncode == 2
    assert text.count("no public price for BM.GPU.MI355X.8") == 1, text
    assert text.count("usd-per-hour") == 1 and text.count("compute.usdPerHour") == 1, text
    assert out.stderr.startswith("error: stack mi355x: no self-hosted price")


@pytest.mark.parametrize("args,words", [
    (["bench", "--workdir", "/nonexistent/x"], "error: --workdir: '/nonexistent/x' is not a directory"),
    (["preflight", "--stack", "mi355x", "--check-cluster", "--kubeconfig", "/etc/passwd", "--runtime", "none", "--json"],
     "error: --kubeconfig: /etc/passwd is not "),
])
def test_a_file_or_directory_that_is_not_what_the_flag_needs_is_one_line(args, words):
    """New-user trial: both ended in a traceback (FileNotFoundError from mkdtemp, a TypeError inside the kube client)."""
    out = _kimi(*args, env=_env(None), timeout=120)
    assert out.returncode == 2 and out.stderr.startswith(words) and "Traceback" not in out.stderr, out.stderr[-800:]
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize("text,words", [
    ("root:x:0:0:root:/root:/bin/bash\n", "is not a kubeconfig (one line of text)"),
    ("- a\n- b\n", "is not a kubeconfig (a list)"),
    ("apiVersion: v1\nkind: Config\n", "is not a kubeconfig (a map without a contexts list)"),
    ("a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n"
                                             for p, c in zip("abcde", "bcdef", strict=True)), "expands its aliases"),
])
def test_a_kubeconfig_is_checked_before_the_client_reads_it(text, words, tmp_path):
    from scripts.ops import preflight

    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(_cli.UsageError, match=re.escape(words)):
        preflight._check_kubeconfig_shape(path)


@pytest.mark.parametrize("args,words", [
    (["plan", "--stack", "b300", "--stack", "gb300"], "error: --stack is given twice ('b300', then 'gb300'): give it once"),
    (["diff", "--against", "HEAD", "--header", "x", "--format", "json"], "error: --header is read only with --format markdown"),
    (["sweep", "--no-pulumi"], "error: --no-pulumi is read only with --destroy"),
    (["preflight", "--stack", "b300-prod", "--checkip-url", "file:///etc/passwd"],
     "error: --checkip-url: 'file' URLs are not read"),
])
def test_a_flag_that_would_be_ignored_is_refused_in_one_line(args, words):
    """New-user trial: each was accepted and ignored (the last --stack won; the header vanished; a dry run took
    --no-pulumi; --checkip-url file:///etc/passwd printed the file's first bytes)."""
    out = _kimi(*args, env=_env(None), timeout=120)
    assert out.returncode == 2 and out.stderr.startswith(words) and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "root:" not in out.stdout + out.stderr


def test_a_region_given_twice_is_swept_once(monkeypatch):
    from scripts.ops import sweep

    seen: list[list[str]] = []

    class Stop(Exception):
        pass

    def sweeper(clients, regions, *args, **kwargs):
        seen.append(list(regions))
        raise Stop

    monkeypatch.setattr(sweep, "Sweeper", sweeper)
    with pytest.raises(Stop):
        sweep.main(["--region", "us-east-1", "--region", "us-west-2", "--region", "us-east-1"])
    assert seen == [["us-east-1", "us-west-2"]]


def test_a_hubs_html_answer_is_named_not_a_bare_json_error():
    """New-user trial: a proxy's HTML page where the hub's JSON belongs ended as a bare JSONDecodeError."""
    from scripts.node import weight_sync

    err = json.JSONDecodeError("Expecting value", "<html>login</html>", 0)
    message = weight_sync.hub_error_message(err, "hf", "org/m", "main")
    assert message is not None and message.startswith("hf://org/m@main on ") and "not the hub's JSON API" in message


@pytest.mark.parametrize("value", ["-1", "0", "nan"])
def test_vllm_argv_refuses_a_timeout_that_is_not_a_time(value):
    """New-user trial: --timeout-seconds -1 ran and reported "took more than -1 s"."""
    out = _kimi("vllm-argv", "--timeout-seconds", value, env=_env(None), timeout=60)
    assert out.returncode == 2 and "--timeout-seconds: " in out.stderr and "more than 0" in out.stderr, out.stderr
