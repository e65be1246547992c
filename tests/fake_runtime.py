"""Helper (not a test module): stand-in container runtime binaries (``docker``, ``podman``) on a PATH
of their own, so a test decides which runtime answers whatever the machine has installed.

Each stand-in is a python script that appends its argv to ``calls.jsonl`` beside it and answers:

- ``info``: exit 0, or, for a runtime ``without_daemon``, docker's message when no daemon listens
  (exit 1), or, ``hangs``, nothing for 60 s;
- ``pull IMAGE``: exit 1 with a registry's ``manifest unknown`` (nothing is pullable);
- anything else: exit 125.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SCRIPT = r'''#!{python}
import json, os, sys, time
args = sys.argv[1:]
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls.jsonl"), "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0]), *args]) + "\n")
mode = {mode!r}
if args[:1] == ["info"]:
    if mode == "without_daemon":
        print("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?",
              file=sys.stderr)
        sys.exit(1)
    if mode == "hangs":
        time.sleep(60)
    print("{{}}")
    sys.exit(0)
if args[:1] == ["pull"]:
    print(f"Error: initializing source docker://{{args[-1]}}: reading manifest: manifest unknown", file=sys.stderr)
    sys.exit(1)
sys.exit(125)
'''

MODES = ("answers", "without_daemon", "hangs")


def install(bindir: Path, name: str, mode: str = "answers") -> Path:
    """Write the stand-in ``name`` into ``bindir`` (created); ``mode`` one of ``MODES``. Returns its path."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text(SCRIPT.format(python=sys.executable, mode=mode))
    path.chmod(0o755)
    return path


def calls(bindir: Path) -> list[list[str]]:
    """Every call made to the stand-ins in ``bindir``: ``[name, *args]``, in order."""
    log = bindir / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
