"""scripts/dev/crds.py: pinned upstream CRDs, verified by sha256, written only when they match; an
offline `make crds` fails in one line and leaves no directory the tests would mistake for a copy."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.dev import crds

REPO_ROOT = Path(__file__).resolve().parents[1]


class _Response(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _local_copy() -> Path:
    from tests.test_k8s_schemas import crds_dir

    return crds_dir()


def test_pins_are_complete_and_well_formed():
    assert len({c.kind for c in crds.CRDS}) == len(crds.CRDS)
    for c in crds.CRDS:
        assert len(c.sha256) == 64 and int(c.sha256, 16) >= 0
        assert c.tag.startswith("v") and c.url.startswith("https://raw.githubusercontent.com/")
        assert c.url.endswith("/" + c.file) and f"/{c.tag}/" in c.url


def test_download_writes_only_bytes_that_match_the_pin(tmp_path):
    source = _local_copy()
    crd = crds.CRDS[0]
    crds.download(crd, tmp_path, opener=lambda url, timeout: _Response((source / crd.file).read_bytes()))
    assert crds.sha256_of(tmp_path / crd.file) == crd.sha256
    other = crds.CRDS[1]
    with pytest.raises(ValueError, match="is not the pinned"):
        crds.download(other, tmp_path, opener=lambda url, timeout: _Response(b"tampered"))
    assert not (tmp_path / other.file).exists()


def test_verify_names_missing_and_changed_files(tmp_path):
    assert crds.verify(_local_copy()) == []
    (tmp_path / crds.CRDS[0].file).write_text("x")
    problems = crds.verify(tmp_path)
    assert len(problems) == len(crds.CRDS) and "is not the pinned" in problems[0] and "missing" in problems[1]


def test_offline_make_crds_fails_in_one_line_without_a_directory(tmp_path, monkeypatch):
    def offline(crd, dest, opener=None):
        raise OSError(f"cannot download {crd.url} ([Errno -2] Name or service not known)")

    monkeypatch.setattr(crds, "download", offline)
    dest = tmp_path / "crds"
    assert crds.main(["--dest", str(dest)]) == 1
    assert not dest.exists() and os.listdir(tmp_path) == []


def test_cli_verify_and_help():
    out = subprocess.run([sys.executable, "scripts/dev/crds.py", "--verify", str(_local_copy())], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and f"all {len(crds.CRDS)} CRDs match" in out.stdout
    helptext = subprocess.run([sys.executable, "scripts/dev/crds.py", "--help"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert helptext.returncode == 0 and "KIMI_CRDS_DIR" in helptext.stdout
