"""``make test``'s runner (tests/suite.py): the tier beside the suite really runs at the same time,
its progress reaches the suite's output, and its failure (or a suite that collected nothing) is the
run's exit status. Each case runs small pytest files of its own through the real runner."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests import suite

REPO_ROOT = Path(__file__).resolve().parents[1]
# Upper bound on a file's wait for the other process (seconds); the waits end on the condition.
MEETING_SECONDS = 300

BESIDE = """
import pathlib, time
from tests.progress import announce

def test_beside():
    here = pathlib.Path(__file__).parent
    announce("hello from beside")
    (here / "beside-started").write_text("1")
    deadline = time.monotonic() + {seconds}
    while not (here / "suite-saw-beside").exists():
        assert time.monotonic() < deadline, "the suite never ran while this tier did"
        time.sleep(0.05)
    announce("beside saw the suite")
    assert {beside_passes}
"""

SUITE = """
import pathlib, time

def test_suite_meets_beside():
    here = pathlib.Path(__file__).parent
    deadline = time.monotonic() + {seconds}
    while not (here / "beside-started").exists():
        assert time.monotonic() < deadline, "the tier beside never ran while the suite did"
        time.sleep(0.05)
    (here / "suite-saw-beside").write_text("1")
"""

LAST = """
def test_last():
    pass
"""


def _plan(tmp_path: Path, *, beside_passes: bool = True, suite_collects: bool = True) -> suite.Plan:
    (tmp_path / "beside_test.py").write_text(textwrap.dedent(BESIDE.format(seconds=MEETING_SECONDS,
                                                                             beside_passes=beside_passes)))
    (tmp_path / "suite_test.py").write_text(textwrap.dedent(SUITE.format(seconds=MEETING_SECONDS)))
    (tmp_path / "last_test.py").write_text(LAST)
    common = ["-q", "-p", "no:cacheprovider", "-p", "tests.progress", "--rootdir", str(tmp_path)]
    suite_target = str(tmp_path / "suite_test.py") if suite_collects else str(tmp_path / "nothing_here_test.py")
    if not suite_collects:
        (tmp_path / "nothing_here_test.py").write_text("X = 1\n")
    return suite.Plan(suite=[*common, suite_target], beside=[*common, str(tmp_path / "beside_test.py")],
                      last=[*common, str(tmp_path / "last_test.py")], log_dir=tmp_path / "logs")


@pytest.fixture
def runner_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    for var in ("KIMI_PROGRESS_FILE", "KIMI_PROGRESS_FOLLOW", "KIMI_PROGRESS_FOLLOW_NAME", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


def test_the_tier_beside_runs_during_the_suite_and_its_progress_reaches_the_suite_output(
        runner_env, tmp_path, capfd):
    status = suite.run(_plan(tmp_path))
    out = capfd.readouterr().out
    assert status == 0, out
    # Both files waited for each other: only true if the two processes overlapped in time.
    assert (tmp_path / "suite-saw-beside").exists()
    assert "(VM tier, beside the suite) hello from beside" in out
    assert "beside saw the suite" in out
    # The beside run's own output is shown once it ends, after its exit status.
    assert "VM tier: exit 0; its output" in out
    assert out.index("VM tier: exit 0") < out.index("1 passed", out.index("VM tier: exit 0"))
    # Every relayed line appears once, whichever process relayed it.
    assert out.count("(VM tier, beside the suite) hello from beside") == 1


def test_a_failing_tier_beside_fails_the_run_though_the_suite_passed(runner_env, tmp_path, capfd):
    status = suite.run(_plan(tmp_path, beside_passes=False))
    out = capfd.readouterr().out
    assert status == 1, out
    assert "VM tier: exit 1" in out
    assert "1 failed" in out


def test_a_suite_that_collects_nothing_ends_the_run_with_pytest_s_exit_5(runner_env, tmp_path, capfd):
    plan = _plan(tmp_path, suite_collects=False)
    # Without the suite to meet, the beside file would wait its whole bound: give it a target that passes.
    (tmp_path / "beside_alone_test.py").write_text("def test_alone():\n    pass\n")
    plan = suite.Plan(suite=plan.suite, beside=[*plan.beside[:-1], str(tmp_path / "beside_alone_test.py")],
                      last=plan.last, log_dir=plan.log_dir)
    status = suite.run(plan)
    assert status == 5, capfd.readouterr().out


def test_make_test_runs_the_vm_tier_beside_and_the_live_tier_last_and_the_suite_skips_both():
    plan = suite.default_plan(["-x"])
    assert f"--ignore={suite.VM_TIER}" in plan.suite and f"--ignore={suite.LIVE_TIER}" in plan.suite
    assert suite.VM_TIER in plan.beside and suite.LIVE_TIER in plan.last
    assert all(args[-1] == "-x" for args in (plan.suite, plan.beside, plan.last))
    assert plan.beside_env == {"KIMI_VM_CPUS": "1"}
    makefile = (REPO_ROOT / "Makefile").read_text()
    recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "-m tests.suite" in recipe


def test_a_second_run_relays_its_own_progress_though_the_first_left_its_read_marker(runner_env, tmp_path, capfd):
    # The runner keeps its progress file and the suite's read offset beside it in the cache directory: a
    # second `make test` relayed nothing until its file outgrew the first run's offset.
    plan = _plan(tmp_path)
    plan.log_dir.mkdir(parents=True)
    (plan.log_dir / "make-test-beside.progress.read").write_text("1000000")
    assert suite.run(plan) == 0
    assert "(VM tier, beside the suite) hello from beside" in capfd.readouterr().out
