"""``make test``'s runner: the suite in one pytest process, the VM tier beside it in a second, then
the live Prometheus tier in a third; one exit status for all three.

Why two processes at once: the VM tier is a third of the suite's wall time (13.5 min of 41 on a quiet
2-core machine, docs/testing.md) and spends it in QEMU, while the rest of the suite uses about one
core (41 CPU min in 45 wall min). Run side by side, the two share the machine's two cores instead of
taking turns, the guests with one vCPU each (``KIMI_VM_CPUS=1``, tests/vm/guest.py): a 2-vCPU guest
beside the busy suite took 2.3 times as long (the VM tier 30.7 min) and 30% more CPU. The VM tier's
guests talk only to services it starts on 127.0.0.1 ports of its own (tests/vm/services.py), so
nothing is shared with the other process.

What a person sees: the suite's own output, with the VM tier's progress lines (its tier start and
end, each boot) relayed between tests as ``[+ mm:ss] (VM tier, beside the suite) ...``
(``tests/progress.py``: the VM process appends them to ``KIMI_PROGRESS_FILE``, the suite follows that
file through ``KIMI_PROGRESS_FOLLOW``). When the suite ends first, the runner keeps relaying until the
VM tier ends, then prints the VM tier's whole output (its log, kept in the VM cache directory).

Exit status: the first non-zero of the suite, the VM tier and the live tier, in that order; pytest's 5
(no tests collected) passes through as 5 (``.ci/run`` fails on it). An interrupt (Ctrl-C) stops the
VM tier's pytest too (SIGINT, so its fixtures power the guests off; SIGKILL after 60 s).

Run: ``python -m tests.suite`` (the Makefile's ``test`` target, with its environment). Arguments
after ``--`` go to every pytest process (``python -m tests.suite -- -x``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

VM_TIER = "tests/test_vm_boot.py"
LIVE_TIER = "tests/test_prometheus_live.py"
# How often the runner looks at the VM tier's progress file once the suite has ended (seconds);
# the wait itself ends on the process's exit, not on a window of time.
POLL_SECONDS = 2.0
# How long an interrupted VM tier gets to power its guests off before SIGKILL (seconds).
INTERRUPT_GRACE_SECONDS = 60


@dataclass(frozen=True)
class Plan:
    """The three pytest runs of ``make test``.

    ``suite``: arguments of the main run; ``beside``: arguments of the run started first and left
    running beside it (empty: none); ``last``: arguments of the run after both (empty: none);
    ``log_dir``: where the beside run's output and progress file go; ``beside_env``: environment
    defaults of the beside run (the caller's environment wins).
    """

    suite: Sequence[str]
    beside: Sequence[str]
    last: Sequence[str]
    log_dir: Path
    beside_name: str = "VM tier"
    beside_env: Mapping[str, str] = field(default_factory=dict)


def default_plan(extra: Sequence[str] = ()) -> Plan:
    """``make test``: everything but the VM and live tiers; the VM tier beside it; the live tier last."""
    from tests.vm.image import cache_root

    return Plan(
        suite=["-q", f"--ignore={VM_TIER}", f"--ignore={LIVE_TIER}", *extra],
        beside=["-q", VM_TIER, *extra],
        last=["-q", LIVE_TIER, *extra],
        log_dir=cache_root(),
        # One vCPU per guest beside the suite (tests/vm/guest.py, CPUS): the guest takes one core and
        # leaves the other to the suite.
        beside_env={"KIMI_VM_CPUS": "1"},
    )


def _pytest(args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", *args]


def _say(started: float, text: str) -> None:
    from tests.progress import _clock  # the suite's own `[+ mm:ss]` format

    print(f"[+{_clock(time.monotonic() - started)}] {text}", flush=True)


class _Follower:
    """Relays lines appended to the beside run's progress file (what the suite's plugin does between
    tests, done here once the suite has ended)."""

    def __init__(self, path: Path, prefix: str, started: float) -> None:
        self.path, self.prefix, self.started = path, prefix, started

    def relay(self) -> None:
        from tests.progress import read_relayed

        for line in read_relayed(self.path):
            _say(self.started, f"({self.prefix}) {line}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=INTERRUPT_GRACE_SECONDS)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def run(plan: Plan) -> int:
    """Run ``plan``; returns the exit status ``make test`` ends with (see the module's docstring)."""
    started = time.monotonic()
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    beside: subprocess.Popen[bytes] | None = None
    log_path = plan.log_dir / "make-test-beside.log"
    progress_path = plan.log_dir / "make-test-beside.progress"
    env = dict(os.environ)
    try:
        if plan.beside:
            progress_path.write_text("")
            Path(f"{progress_path}.read").unlink(missing_ok=True)  # what an earlier run's suite had read
            _say(started, f"{plan.beside_name}: started beside the suite, in a pytest process of its own "
                          f"(output: {log_path})")
            with open(log_path, "wb") as log:
                beside = subprocess.Popen(
                    _pytest(plan.beside), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env={**plan.beside_env, **env, "KIMI_PROGRESS_FILE": str(progress_path)},
                    start_new_session=True)
        suite_env = {**env, "KIMI_PROGRESS_FOLLOW": str(progress_path),
                     "KIMI_PROGRESS_FOLLOW_NAME": f"{plan.beside_name}, beside the suite"} if beside else env
        suite = subprocess.call(_pytest(plan.suite), env=suite_env)
        beside_status = 0
        if beside is not None:
            follower = _Follower(progress_path, f"{plan.beside_name}, beside the suite", started)
            if beside.poll() is None:
                _say(started, f"the suite has ended; waiting for the {plan.beside_name} (its progress follows)")
            while beside.poll() is None:
                follower.relay()
                try:
                    beside.wait(timeout=POLL_SECONDS)
                except subprocess.TimeoutExpired:
                    pass
            follower.relay()
            beside_status = beside.returncode
            _say(started, f"{plan.beside_name}: exit {beside_status}; its output ({log_path}):")
            sys.stdout.write(log_path.read_text(errors="replace"))
            sys.stdout.flush()
        last = 0
        if plan.last:
            _say(started, "the live Prometheus tier, in a pytest process (and with a vLLM server) of its own")
            last = subprocess.call(_pytest(plan.last), env=env)
    except KeyboardInterrupt:
        if beside is not None:
            _stop(beside)
        return 130
    finally:
        if beside is not None and beside.poll() is None:
            _stop(beside)
    for status in (suite, beside_status, last):
        if status != 0:
            return status
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.suite [-- PYTEST_ARGS...]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    return run(default_plan(args))


if __name__ == "__main__":
    sys.exit(main())
