"""Helper (not a test module): ``systemd-analyze verify`` over the units a user data writes, in a
root of their own (the distribution's units for targets, stand-ins for what the AMI provides)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path


def verify_units(units: Mapping[str, str], root: Path, executables: Iterable[str],
                 stand_in_units: Mapping[str, str]) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Write ``units`` and ``stand_in_units`` under ``root/etc/systemd/system``, the host's own units
    under ``root/usr/lib/systemd/system`` (sysinit.target, multi-user.target, ...) and an empty
    executable for each path of ``executables`` (verify checks ExecStart= paths exist), then run
    ``systemd-analyze verify --root=root`` over ``units``.

    Returns:
        ``(the completed run, its lines that name one of our kimi-* units)``.
    """
    import shutil

    unit_dir = root / "etc/systemd/system"
    unit_dir.mkdir(parents=True)
    for name, text in {**units, **stand_in_units}.items():
        (unit_dir / name).write_text(text)
    host_units = Path("/usr/lib/systemd/system")
    if not host_units.is_dir():
        host_units = Path("/lib/systemd/system")
    shutil.copytree(host_units, root / "usr/lib/systemd/system", symlinks=True)
    for exe in executables:
        path = root / exe.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    proc = subprocess.run(["systemd-analyze", "verify", f"--root={root}", *[f"/etc/systemd/system/{n}" for n in units]],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"})
    return proc, [line for line in (proc.stdout + proc.stderr).splitlines() if "kimi-" in line]
