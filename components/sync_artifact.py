"""The weight-sync program as shipped to nodes: one deterministic zipapp of ``scripts/node/weight_sync/``.

``python -m zipapp`` semantics (a ``#!/usr/bin/env python3`` line, then a zip archive whose
top-level ``__main__.py`` runs the package; Python runs it as ``python3 weight_sync.pyz ...``:
https://docs.python.org/3/library/zipapp.html), built so that the same source always gives the
same bytes, hence the same sha256, on any machine:

- entries in sorted order: the top-level ``__main__.py``, then ``weight_sync/<module>.py`` for
  every ``*.py`` file of the package (``__pycache__`` and other files never enter);
- every entry dated 1980-01-01 00:00:00 (the earliest zip date), mode 0644, made on Unix;
- stored, not deflated: zlib's output for a given level may differ between zlib builds
  (zlib-ng, distro patches), which would change the hash of an unchanged program. The archive
  is about the size of the sources (under 100 KB), far below the ConfigMap limit (1 MiB:
  https://kubernetes.io/docs/concepts/configuration/configmap/#motivation).

The Kubernetes edge carries the bytes in a ConfigMap's ``binaryData``; the EC2 path uploads them
to the mirror bucket (``_tools/weight_sync.pyz``) and checks their sha256 before running them.
Standard library only (no Pulumi): the plan, the tests and the benchmark build the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# The package shipped (its modules use relative imports only, so it runs under any top-level name).
SYNC_PACKAGE_DIR = REPO_ROOT / "scripts" / "node" / "weight_sync"
# The package's name inside the archive.
ARCHIVE_PACKAGE = "weight_sync"
SHEBANG = b"#!/usr/bin/env python3\n"
# 1980-01-01 00:00:00: the earliest date a zip entry can hold (no clock in the bytes).
FIXED_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
ENTRY_MODE = 0o100644  # a regular file, rw-r--r--
MAIN_TEXT = (
    '"""Entry point of the weight-sync zipapp (components/sync_artifact.py)."""\n'
    "import sys\n\n"
    f"from {ARCHIVE_PACKAGE}.cli import main\n\n"
    "sys.exit(main())\n"
)


@dataclass(frozen=True)
class SyncArtifact:
    """The built zipapp.

    Attributes:
        data: the archive's bytes (shebang line + stored zip).
        sha256: hex digest of ``data``.
        size_bytes: ``len(data)``.
        members: the archive's entry names, in order.
    """

    data: bytes
    sha256: str
    size_bytes: int
    members: tuple[str, ...]


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=FIXED_ZIP_DATE)
    info.compress_type = zipfile.ZIP_STORED
    info.create_system = 3  # Unix, so the mode below is read as one
    info.external_attr = ENTRY_MODE << 16
    return info


def build_sync_artifact(package_dir: Path = SYNC_PACKAGE_DIR) -> SyncArtifact:
    """Build the zipapp from ``package_dir`` (deterministic: see the module docstring).

    Raises:
        FileNotFoundError: ``package_dir`` has no ``cli.py`` (not the weight-sync package).
    """
    if not (package_dir / "cli.py").is_file():
        raise FileNotFoundError(f"{package_dir}: no cli.py: not the weight-sync package")
    files = {"__main__.py": MAIN_TEXT.encode()}
    for path in sorted(package_dir.glob("*.py")):
        files[f"{ARCHIVE_PACKAGE}/{path.name}"] = path.read_bytes()
    buf = io.BytesIO()
    buf.write(SHEBANG)
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in sorted(files):
            archive.writestr(_entry(name), files[name])
    data = buf.getvalue()
    return SyncArtifact(data, hashlib.sha256(data).hexdigest(), len(data), tuple(sorted(files)))


@lru_cache(maxsize=1)
def sync_artifact() -> SyncArtifact:
    """``build_sync_artifact()`` of this checkout, built once per process."""
    return build_sync_artifact()
