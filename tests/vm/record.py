"""Record what the VM tier measured for the plan: ``components/core/data/vm_boot_measured.json``.

    make test-vm && python -m tests.vm.record

Reads the reports the boots wrote under the cache's ``reports/`` (tests/test_vm_boot.py
``report``): each boot's seconds from the guest kernel's start to cloud-init done, the array
mounted, the weights verified and the server healthy, how it was run (KVM or TCG) and how much
slower the guest's CPU was than its host. ``components/core/time_to_ready.py`` cites the first
boot and the reboot in the instance-boot phase of every ``aws-ec2`` plan.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from components.core.time_inputs import VM_BOOT_FILE
from tests.vm.image import cache_root

REQUIRED = ("first-boot",)


def _boot(report: dict) -> dict:
    """What the plan's data file keeps of one report: accel, phases to 0.1 s, the wait."""
    phases = {k: round(v, 1) if v is not None else None for k, v in report["phases"].items()}
    return {"accel": report["accel"], "phases": phases,
            **({"waited_seconds": report["waited_seconds"]} if "waited_seconds" in report else {})}


def record(reports_dir: Path | None = None, out: Path = VM_BOOT_FILE) -> dict:
    """Write ``out`` from the reports; returns the document.

    Raises:
        SystemExit: no first-boot report (run ``make test`` or ``make test-vm`` first).
    """
    reports_dir = reports_dir or cache_root() / "reports"
    boots = {p.stem: json.loads(p.read_text()) for p in sorted(reports_dir.glob("*.json"))}
    missing = [name for name in REQUIRED if name not in boots]
    if missing:
        raise SystemExit(f"record: no {missing} report in {reports_dir}: run `make test-vm` first")
    first = boots["first-boot"]
    doc = {
        "source": "tests/test_vm_boot.py (make test-vm), recorded by python -m tests.vm.record",
        "recorded_at": first["recorded_at"],
        "accel": first["accel"],
        "guest_cpu_slowdown": first["guest_cpu_slowdown"],
        "boots": {name: _boot(b) for name, b in boots.items()},
    }
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc


if __name__ == "__main__":
    document = record()
    print(f"wrote {VM_BOOT_FILE} ({len(document['boots'])} boots, {document['accel']}, recorded {document['recorded_at']})",
          file=sys.stderr)
