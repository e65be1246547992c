"""The plan's table for people: a screen or two at 80-120 columns, no word broken, the blockers
said once, the vLLM command as a shell command one can paste, every resource under --details;
and the text layout it is built from (scripts/ops/_text.py)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest
from rich.text import Text

from components.core.versions import VLLM_VERSION
from scripts.ops import plan as plan_script
from scripts.ops._text import fold_word, shell_command, wrap, wrap_items
from tests.conftest import DEPLOYER_ONLY_OVERLAY, FIXED_NOW, REPO_ROOT, STACKS

NOW = "2026-12-01T00:00:00Z"
WIDTHS = (80, 120)
# The bound is two screens at 120 columns (about 100 lines), and about two 65-row screens at
# 80 columns (blockers and warnings wrap most). gb300 (a capacity block, two roles, the bill, what a
# trial's expiry stops, the NVLink placement) is the longest: 97 and 128 lines.
MAX_LINES = {80: 130, 120: 100}


@pytest.fixture(scope="module")
def default_docs():
    """Every stack's plan as a user gets it with the default engine pin, without the test suite's
    stand-in engine (tests/conftest.py): the CUDA stacks deployable, mi355x refused by `pulumi up`
    (the pinned release lacks the sparse indexer on ROCm)."""
    saved = os.environ.get("KIMI_DEPLOY_CONFIG_OVERLAY")
    # The stand-in egress address alone (the shipped EKS stacks' example range is a blocker of its own).
    os.environ["KIMI_DEPLOY_CONFIG_OVERLAY"] = DEPLOYER_ONLY_OVERLAY
    try:
        return {name: plan_script.build_plan_document(name, now=FIXED_NOW) for name in STACKS}
    finally:
        if saved is None:
            os.environ.pop("KIMI_DEPLOY_CONFIG_OVERLAY", None)
        else:
            os.environ["KIMI_DEPLOY_CONFIG_OVERLAY"] = saved


def table(doc, width, details=False) -> str:
    out = io.StringIO()
    plan_script.render_table(doc, file=out, width=width, details=details)
    return out.getvalue()


def words(text: str) -> set[str]:
    """Runs of letters, digits and _ (the critical-path bars, one token with ``━`` each, left out:
    their letters are checked against the legend in test_default_table_sections)."""
    return set(re.findall(r"[A-Za-z0-9_]+", " ".join(t for t in text.split() if "━" not in t)))


def unwrapped(doc, details: bool) -> str:
    """The table's sections laid out where nothing needs to wrap (no clamp to the widest table)."""
    view = plan_script.View(doc, 100_000, details)
    return "\n".join(str(line) for section in plan_script.TABLE_SECTIONS for line in section(view))


def _env_without_overlay() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "KIMI_DEPLOY_CONFIG_OVERLAY" and not k.startswith("PYTHON")}


# --- size and words ------------------------------------------------------------------------------


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", STACKS)
def test_the_table_fits_a_screen_or_two(default_docs, name, width):
    lines = table(default_docs[name], width).splitlines()
    assert len(lines) <= MAX_LINES[width], f"{name} at {width} columns: {len(lines)} lines"
    assert max(len(line) for line in lines) <= width
    for details in (False, True):
        assert all(len(line) <= width for line in table(default_docs[name], width, details).splitlines())


@pytest.mark.parametrize("name", STACKS)
def test_no_word_is_broken(default_docs, name):
    """Every word (run of letters, digits, _) of the table at 80 and 120 columns is a whole word
    of the plan's data or of the same table drawn where nothing wraps: a name cut across lines
    (``BucketLifecycleConfig`` / ``uration``) is neither."""
    doc = default_docs[name]
    for details in (False, True):
        vocabulary = words(json.dumps(doc)) | words(unwrapped(doc, details))
        for width in WIDTHS:
            broken = words(table(doc, width, details)) - vocabulary
            assert not broken, f"{name} at {width} columns (details={details}): {sorted(broken)}"


def test_the_width_follows_the_terminal():
    """Without a width the table takes the terminal's: COLUMNS when set (rich), else 80."""
    env = {**_env_without_overlay(), "COLUMNS": "90"}
    proc = subprocess.run([sys.executable, "scripts/ops/plan.py", "--stack", "mi355x", "--now", NOW],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) == 90  # the bars fill the width


# --- what the default table holds ---------------------------------------------------------------


def test_blockers_are_said_once(default_docs):
    """The `blocked:` text appears once on the terminal: in the table, not again on stderr; with
    JSON (not read on the terminal) on stderr only."""
    blocker = " ".join(default_docs["mi355x"]["blockers"][0].split())
    base = [sys.executable, "scripts/ops/plan.py", "--stack", "mi355x", "--now", NOW]
    for extra, stream in (([], "both"), (["--format", "markdown"], "both"), (["--format", "json"], "stderr")):
        proc = subprocess.run(base + extra, cwd=REPO_ROOT, env={**_env_without_overlay(), "COLUMNS": "80"},
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        seen = proc.stderr if stream == "stderr" else proc.stdout + "\n" + proc.stderr
        assert " ".join(seen.split()).count(blocker) == 1, (extra, proc.stderr)
    strict = subprocess.run(base + ["--strict"], cwd=REPO_ROOT, env=_env_without_overlay(),
                            capture_output=True, text=True, timeout=300)
    assert strict.returncode == 2 and " ".join(strict.stdout.split()).count(blocker) == 1
    assert strict.stderr == ("error: `pulumi up` refuses this stack: kimi-deploy:model.revision, kimi-deploy:vllm.image "
                             "(why: above); exit 2 (--strict)\n")


@pytest.mark.parametrize("name", STACKS)
def test_default_table_sections(default_docs, name):
    """Summary, blockers, the command per role, one critical-path bar per scenario, resources by
    type; the phases' sources and the outputs only with --details."""
    doc = default_docs[name]
    text = table(doc, 120)
    scenarios = plan_script._alternative_scenarios(doc)
    bars = [line for line in text.splitlines() if "━" in line]
    assert len(bars) == len(scenarios)
    for key in scenarios:
        assert any(line.strip().startswith(plan_script.scenario_title(key, doc, short=True)) for line in bars), key
    legend = set(re.findall(r"(?:^ *|, )([A-Z]) [a-z]", text[text.index("critical path"):], re.M))
    for line in bars:
        assert set(line.split()[-1].replace("━", "")) <= legend, line
    assert text.count("BLOCKED: `pulumi up` refuses this stack") == (1 if doc["blockers"] else 0)
    # mi355x: no engine serves it yet; b300-prod: prod runs the shipped release tag, not a digest
    assert bool(doc["blockers"]) is (name in ("mi355x", "b300-prod"))
    assert f"resources ({len(doc['resources'])})" in text
    assert "vllm serve" in text and sum(f"vLLM {r['name']}" in text for r in doc["vllm"]["roles"]) == len(doc["vllm"]["roles"])
    assert "\n      source: " not in text and "\noutputs" not in text
    details = table(doc, 120, details=True)
    assert "\n      source: " in details and "\noutputs" in details


@pytest.mark.parametrize("name", STACKS)
def test_scenario_titles_name_a_mirror_only_where_one_exists(default_docs, name):
    doc = default_docs[name]
    titles = [plan_script.scenario_title(key, doc) for key in plan_script._alternative_scenarios(doc)]
    if plan_script.has_mirror(doc):
        assert "first deploy (empty mirror)" in titles and "repeat trial (mirror full)" in titles
    else:
        assert not any("mirror" in t for t in titles), titles
        assert titles[:3] == ["first deploy (hub download)", "repeat trial (hub download again)",
                              "replaced node (hub download)"]
    md = plan_script.render_markdown(doc)
    assert all(f"*{t}*" in md for t in titles)


def _resources_in_details(text: str) -> set[tuple[str, str]]:
    """``(type, name)`` pairs of the --details resource list (types at 2 spaces, names at 4;
    folded type tokens joined again)."""
    section = text[text.index("\nresources ("):text.index("\noutputs")]
    section = re.sub(r"(?<=[/:,;=&?])\n {2,}(?=\S)", "", section)
    pairs: set[tuple[str, str]] = set()
    current = None
    for line in section.splitlines()[2:]:
        if re.fullmatch(r"  \S+", line):
            current = line.strip()
        elif re.match(r"    \S", line):
            pairs.add((current, line.split()[0].split(":")[0]))  # "name: key inputs" (names have no colon)
    return pairs


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", STACKS)
def test_details_list_every_resource(default_docs, name, width):
    doc = default_docs[name]
    assert _resources_in_details(table(doc, width, details=True)) == {(r["type"], r["name"]) for r in doc["resources"]}


def test_resource_counts_by_type(default_docs):
    doc = default_docs["b300"]
    text = " ".join(table(doc, 120).split())
    assert "aws:ec2 (19): DefaultSecurityGroup, Eip, Instance," in text and "Subnet x3" in text
    assert "aws:iam (7): InstanceProfile, Role x2, RolePolicy x4" in text  # the expiry stop's role too
    assert plan_script._resource_group("kubernetes:core/v1:ServiceAccount") == ("kubernetes", "ServiceAccount")
    assert plan_script._resource_group("pulumi:providers:kubernetes") == ("pulumi:providers", "kubernetes")


def test_a_new_section_is_one_function(default_docs, monkeypatch):
    """The table is TABLE_SECTIONS in order: a section added there is drawn, with a blank line before."""
    monkeypatch.setattr(plan_script, "TABLE_SECTIONS", (*plan_script.TABLE_SECTIONS, lambda view: [Text(f"extra {view.width}")]))
    lines = table(default_docs["b300"], 100).splitlines()
    assert lines[-2:] == ["", "extra 100"]


# --- the vLLM command is a shell command ---------------------------------------------------------


def _command_blocks(text: str) -> dict[str, list[str]]:
    """Role name -> the lines of its command as printed under ``vLLM <role> (...)``."""
    lines = text.splitlines()
    blocks: dict[str, list[str]] = {}
    for i, line in enumerate(lines):
        m = re.match(r"vLLM (\w+) \(", line)
        if not m or i + 1 >= len(lines) or not lines[i + 1].endswith("\\"):
            continue
        j = i + 1
        while lines[j].endswith("\\"):
            j += 1
        blocks[m.group(1)] = lines[i + 1:j + 1]
    return blocks


def _run_in_bash(block: list[str], env_keys: list[str]) -> tuple[list[str], dict[str, str]]:
    """What bash makes of ``block`` when ``vllm`` is a function that prints its arguments and the
    given environment variables (NUL-separated)."""
    show_env = " ".join(f'"{k}=${{{k}-<unset>}}"' for k in env_keys)
    script = f"vllm() {{ printf '%s\\0' vllm \"$@\"; printf '%s\\0' --ENV-- {show_env}; }}\n" + "\n".join(block) + "\n"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "VLLM_API_KEY": "key-from-the-caller"})
    assert proc.returncode == 0, proc.stderr
    parts = proc.stdout.split("\0")[:-1]
    cut = parts.index("--ENV--")
    return parts[:cut], dict(p.split("=", 1) for p in parts[cut + 1:])


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", STACKS)
def test_the_command_pastes_into_a_shell_as_the_plan_declares_it(default_docs, name, width):
    """Each role's printed command, run by bash, gives exactly the argv and environment the plan
    declares (the secret from the caller's environment), at 80 and 120 columns, packed (default)
    and one option per line (--details)."""
    doc = default_docs[name]
    for details in (False, True):
        blocks = _command_blocks(table(doc, width, details))
        roles = doc["vllm"]["roles"] if details else doc["vllm"]["roles"][:1]
        for role in roles:
            keys = [*role["env"], *role["secret_env"]]
            argv, env = _run_in_bash(blocks[role["name"]], keys)
            assert argv == role["argv"], (role["name"], details)
            assert env == {**role["env"], **{k: "key-from-the-caller" for k in role["secret_env"]}}


def test_a_second_role_that_differs_little_is_given_as_the_difference(default_docs):
    text = " ".join(table(default_docs["gb300"], 120).split())
    assert (f"vLLM worker (1 node per copy), image vllm/vllm-openai:v{VLLM_VERSION}: the leader's command, --node-rank "
            "'$(LWS_WORKER_INDEX)' --headless in place of --node-rank 0 --host 0.0.0.0 --port 8000 --middleware "
            "kimi_vllm_api_guard.RequireApiKey; without PYTHONPATH, VLLM_API_KEY (--details: in full)") in text
    assert "worker" in _command_blocks(table(default_docs["gb300"], 120, details=True))


# --- make plan-all / --all ----------------------------------------------------------------------


def test_plan_all_says_deployable_or_refused_once_per_stack():
    proc = subprocess.run([sys.executable, "scripts/ops/plan.py", "--all", "--now", NOW], cwd=REPO_ROOT,
                          env=_env_without_overlay(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(STACKS) and proc.stderr == ""
    for name, line in zip(STACKS, lines, strict=True):
        # The EKS stacks ship an example API source (a documentation range) that `pulumi up` refuses,
        # and every example value is refused too (components/core/examples.py); the pinned release
        # serves the CUDA targets, not ROCm.
        api, rev, cap = ("kimi-deploy:network.apiServerPublicCidrs", "kimi-deploy:model.revision",
                         "kimi-deploy:compute.capacity.reservationId")
        # b300-prod, a prod stack, also takes no release tag: its image must be pinned by digest.
        keys = {"gb300": f"{api}, {cap}", "b300-prod": f"{api}, {rev}, {cap}, kimi-deploy:vllm.image",
                "mi355x": f"{rev}, kimi-deploy:vllm.image"}.get(name)
        if keys:
            assert line.split(None, 1)[1] == f"refused by `pulumi up`: {keys} (`kimi-deploy plan --stack {name}` says why)"
        else:
            assert line.split(None, 1)[1] == "deployable", line
    assert "plan ok" not in proc.stdout
    # --strict gates a CI job on every stack as on one: the same lines, exit 2 naming the refused stacks.
    strict = subprocess.run([sys.executable, "scripts/ops/plan.py", "--all", "--strict", "--now", NOW], cwd=REPO_ROOT,
                            env=_env_without_overlay(), capture_output=True, text=True, timeout=600)
    assert strict.returncode == 2 and strict.stdout == proc.stdout
    assert strict.stderr == "error: `pulumi up` refuses b300-prod, gb300, mi355x; exit 2 (--strict)\n"


def test_verdict_of_a_deployable_and_a_leaking_plan(default_docs):
    doc = dict(default_docs["b300"], blockers=[])
    assert plan_script.verdict(doc) == "deployable"
    leak = {"secret": "hfToken", "resource": "gpu-lt", "path": "userData"}
    assert plan_script.verdict(dict(doc, secret_leaks=[leak])) == (
        "FAILED: a secret appears in a plain input (kimi-deploy:hfToken in gpu-lt.userData)")


@pytest.mark.parametrize("extra", [["--output", "x.json"], ["--stack", "gb300"]])
def test_all_takes_no_per_stack_output_flags(extra):
    proc = subprocess.run([sys.executable, "scripts/ops/plan.py", "--all", *extra], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--all takes no" in proc.stderr


def test_fold_word_breaks_only_after_separators():
    url = "docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance-guidelines.html"
    assert fold_word(url, 50) == ["docs.aws.amazon.com/AmazonS3/latest/userguide/", "optimizing-performance-guidelines.html"]
    token = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    assert fold_word(token, 60) == ["aws:s3/bucketServerSideEncryptionConfiguration:", "BucketServerSideEncryptionConfiguration"]
    assert fold_word("a" * 90, 40) == ["a" * 90]  # no fold point: whole, overflowing
    assert "".join(fold_word(url, 10)) == url


def test_wrap_keeps_words_and_phrases_whole():
    text = "one two three four five six seven eight nine ten"
    lines = wrap(text, 20, prefix="label: ", indent="  ")
    assert lines == ["label: one two three", "  four five six", "  seven eight nine", "  ten"]
    marker = "<known after pulumi up>"
    assert wrap(f"see {marker}/x now", 26, keep=(marker,)) == ["see", f"{marker}/x", "now"]
    assert wrap(f"see {marker}/x now", 26) == ["see <known after pulumi", "up>/x now"]
    assert wrap_items(["Route x2", "RouteTable x2", "Subnet x3"], 24, prefix="ec2: ", indent="  ") == [
        "ec2: Route x2,", "  RouteTable x2,", "  Subnet x3"]


@pytest.mark.parametrize("width", [40, 60, 100])
def test_shell_command_round_trips_through_bash(width):
    argv = ["prog", "serve", "/a path/with spaces", "--json-arg", '{"a":true,"b":"it\'s","c":[1,2,3],"d":"x"}',
            "--sub", "$(NOT_EXPANDED)", "--empty", "", "--long", "x" * 70, "--flag"]
    assignments = ["A=1", "B='two words'", 'S="${S:?set S}"']
    block = shell_command(assignments, argv, width, pack=width > 60)
    script = "prog() { printf '%s\\0' prog \"$@\" \"A=$A\" \"B=$B\" \"S=$S\"; }\n" + "\n".join(block) + "\n"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "S": "from-env"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\0")[:-1] == [*argv, "A=1", "B=two words", "S=from-env"]
    long_lines = [line for line in block if len(line) > width]
    assert all("x" * 70 in line for line in long_lines)  # only the word with no fold point overflows


# --- progress -----------------------------------------------------------------------------------


def test_a_plan_says_what_it_is_doing_on_stderr_and_stdout_keeps_the_plan():
    """A plan (2-11 s here, more under load) printed nothing until its text: it says which stack and
    which phase on stderr; the plan on stdout is the same byte for byte."""
    base = [sys.executable, "-m", "scripts.ops.plan", "--stack", "b300", "--now", NOW]
    env = {**_env_without_overlay(), "COLUMNS": "80"}
    runs = {mode: subprocess.run(base + ["--progress", mode], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                                 timeout=300) for mode in ("always", "never")}
    assert runs["always"].returncode == runs["never"].returncode == 0, runs["always"].stderr
    assert runs["always"].stdout == runs["never"].stdout
    said = [re.sub(r" \(\d+\.\d s\)$", "", line) for line in runs["always"].stderr.splitlines()]
    assert said == ["plan b300: reading the stack config", "plan b300: sizing (KV cache, memory, storage, vLLM command)",
                    "plan b300: running the Pulumi program under the mock engine",
                    "plan b300: pricing 46 resources; time to ready", "plan b300: rendering the table", "plan b300: done"], said
    assert runs["never"].stderr == ""


def test_progress_starts_once_a_plan_is_slow_and_not_before():
    """``auto``: nothing for a quick plan; a phase still running after the threshold is said, then each later one."""
    quick = io.StringIO()
    progress = plan_script.PlanProgress("s", quick, after_seconds=60)
    progress.phase("sizing")
    progress.done()
    assert quick.getvalue() == ""
    slow = io.StringIO()
    progress = plan_script.PlanProgress("s", slow, after_seconds=0.05)
    progress.phase("running the Pulumi program under the mock engine")
    import threading
    import time

    deadline, tick = time.monotonic() + 30, threading.Event()
    while not slow.getvalue() and time.monotonic() < deadline:  # until the waiting thread has spoken
        tick.wait(0.01)
    progress.phase("rendering the table")
    progress.done()
    lines = [re.sub(r" \(\d+\.\d s\)$", "", line) for line in slow.getvalue().splitlines()]
    assert lines == ["plan s: running the Pulumi program under the mock engine", "plan s: rendering the table",
                     "plan s: done"]
