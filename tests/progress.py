"""Progress of ``make test`` that a person can follow: each tier's name as it starts and ends, with
the suite's elapsed time, and what a long tier is doing meanwhile (the VM tier's boot in progress).

A tier is a test module that starts something heavy (a QEMU guest, the real vLLM engine, Prometheus,
podman); ``TIERS`` names them. The unit, contract and schema modules between them keep pytest's own
progress (dots and percentages). Lines look like::

    [+ 12:03] tier started: real vLLM server (tests/test_real_engine.py)
    [+ 16:40] tier ended: real vLLM server: 31 passed in 4 m 37 s
    [+ 31:12] VM tier: booting the stager (first boot; budget 1,140 s)

``announce(text)`` prints such a line from inside a test or fixture (output capture is lifted for
that line only); outside a pytest run, or with ``-p no:kimi_progress``, it prints nothing.
Registered from ``tests/conftest.py`` (``pytest_plugins``).

Two processes, one terminal (``make test`` runs the VM tier beside the suite, ``tests/suite.py``): with
``KIMI_PROGRESS_FILE`` set, every line is also appended to that file; with ``KIMI_PROGRESS_FOLLOW``
set, the lines another process appended there are printed between tests, after the name in
``KIMI_PROGRESS_FOLLOW_NAME``, and at the end of the session.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field

import pytest

# Test modules that start a heavy tier, with the name a person reads.
TIERS: dict[str, str] = {
    "tests/test_engine_verify.py": "engine verify on podman",
    "tests/test_prometheus_live.py": "live Prometheus (real server scraped, rules and alerts)",
    "tests/test_real_engine.py": "real vLLM server (CPU engine, tiny model)",
    "tests/test_vm_boot.py": "VM boots (QEMU: the stager, the first boot from its mirror, stop/start, power-off at expiry)",
    "tests/test_weight_sync_boot.py": "weight sync under systemd",
}

_state: dict[str, object] = {}


def read_relayed(path: str | os.PathLike[str]) -> list[str]:
    """The complete lines appended to the progress file ``path`` since the last call by any process
    (the offset read so far is kept beside it, in ``<path>.read``); [] when the file does not exist."""
    marker = f"{os.fspath(path)}.read"
    try:
        with open(path, "rb") as stream:
            try:
                with open(marker) as m:
                    offset = int(m.read().strip() or 0)
            except (FileNotFoundError, ValueError):
                offset = 0
            if offset > os.fstat(stream.fileno()).st_size:  # the file was started again: read it from the start
                offset = 0
            stream.seek(offset)
            data = stream.read()
    except FileNotFoundError:
        return []
    complete = data[: data.rfind(b"\n") + 1]
    if not complete:
        return []
    with open(marker, "w") as m:
        m.write(str(offset + len(complete)))
    return complete.decode(errors="replace").splitlines()


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:3d}:{secs:02d}"


def _span(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes} m {secs:02d} s" if minutes else f"{secs} s"


@dataclass
class _Tier:
    module: str
    name: str
    started: float
    outcomes: dict[str, int] = field(default_factory=dict)


class TierProgress:
    """The plugin: tier start and end lines, outcome counts per tier, ``announce`` lines."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.suite_started = time.monotonic()
        self.current: _Tier | None = None
        self.relay_to = os.environ.get("KIMI_PROGRESS_FILE") or None
        self.follow = os.environ.get("KIMI_PROGRESS_FOLLOW") or None
        self.follow_name = os.environ.get("KIMI_PROGRESS_FOLLOW_NAME") or "beside the suite"

    def _write(self, line: str, relay: bool = True) -> None:
        if relay and self.relay_to is not None:
            with open(self.relay_to, "a") as stream:
                stream.write(line.replace("\n", " ") + "\n")
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        capman = self.config.pluginmanager.get_plugin("capturemanager")
        text = f"[+{_clock(time.monotonic() - self.suite_started)}] {line}"
        with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():
            if reporter._tw.width_of_current_line:  # after pytest's dots: a line of its own
                reporter._tw.line()
            reporter.write_line(text)

    def _follow(self) -> None:
        if self.follow is None:
            return
        for line in read_relayed(self.follow):
            self._write(f"({self.follow_name}) {line}", relay=False)

    def _end_current(self) -> None:
        tier, self.current = self.current, None
        if tier is None:
            return
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(tier.outcomes.items())) or "no tests run"
        self._write(f"tier ended: {tier.name}: {counts} in {_span(time.monotonic() - tier.started)}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        module = nodeid.split("::", 1)[0]
        if self.current is not None and self.current.module == module:
            return
        self._end_current()
        name = TIERS.get(module)
        if name is not None:
            self.current = _Tier(module, name, time.monotonic())
            self._write(f"tier started: {name} ({module})")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            self._follow()
        tier = self.current
        if tier is None or report.nodeid.split("::", 1)[0] != tier.module:
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            outcome = "errors" if report.when == "setup" and report.failed else report.outcome
            tier.outcomes[outcome] = tier.outcomes.get(outcome, 0) + 1

    def pytest_sessionfinish(self) -> None:
        self._end_current()
        self._follow()

    def announce(self, text: str) -> None:
        self._write(text)


def pytest_configure(config: pytest.Config) -> None:
    plugin = TierProgress(config)
    config.pluginmanager.register(plugin, "kimi_tier_progress")
    _state["plugin"] = plugin


def pytest_unconfigure(config: pytest.Config) -> None:
    _state.pop("plugin", None)


def announce(text: str) -> None:
    """Print ``text`` as one progress line of the running suite (with its elapsed time), through
    output capture; nothing outside a pytest run."""
    plugin = _state.get("plugin")
    if isinstance(plugin, TierProgress):
        plugin.announce(text)
