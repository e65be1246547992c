"""Completion you can trust on every storage (scripts/node/weight_sync/ready.py).

On an FSx file system fed by S3 import, files appear asynchronously and in no order, so the
completion marker (written to S3 last) can be there before shards. Here a real directory plays the
imported file system: its marker and manifest are there (or arrive late) while a thread writes the
listed files after a delay, in shuffled order. Both users run as shipped, in subprocesses: the
vLLM pods' readiness gate (the init container's exact argv, out of the zipapp the ConfigMap
carries) and the node copy (the zipapp with ``--source-wait-seconds``, the nvme-from-fsx argv).
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from components.core.config import read_stack_config
from components.core.weights import SYNC_SCRIPT_PATH
from components.sync_artifact import build_sync_artifact
from scripts.node import weight_sync as ws
from tests.conftest import B300_PROD_FSX, plan_for
from tests.sync_fixtures import checkpoint_files, read_tree, write_tree
from tests.test_k8s_workloads import vllm_pods

DELAY_SECONDS = 2.5


@pytest.fixture(scope="module")
def zipapp(tmp_path_factory) -> Path:
    """The weight-sync zipapp, the bytes the ConfigMap ships."""
    path = tmp_path_factory.mktemp("program") / Path(SYNC_SCRIPT_PATH).name
    path.write_bytes(build_sync_artifact().data)
    return path


@pytest.fixture
def published(tmp_path) -> tuple[Path, dict[str, bytes]]:
    """A complete copy as the publish step leaves it (files, manifest.json, marker): made by a real
    sync from a plain directory."""
    files = checkpoint_files()
    plain, copy = tmp_path / "plain", tmp_path / "imported"
    write_tree(str(plain), files)
    assert ws.main(["--source", f"file://{plain}", "--dest", str(copy), "--quiet"]) == 0
    return copy, files


def _import_late(root: Path, names: list[str], stash: Path, delay_seconds: float = DELAY_SECONDS,
                 release: threading.Event | None = None) -> threading.Thread:
    """Take ``names`` out of ``root`` now; a thread puts them back one by one, in shuffled order,
    after ``delay_seconds`` (the import producing them late), or once ``release`` is set when one is given
    (event-based: a loaded machine cannot reorder it)."""
    for name in names:
        target = stash / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(root / name), str(target))
    order = list(names)
    random.Random(7).shuffle(order)

    def bring_back():
        if release is None:
            time.sleep(delay_seconds)
        else:
            release.wait(timeout=120)
        for name in order:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            # A new file appears whole (the import brings its metadata at once): write aside, rename.
            tmp = root / (name + ".importing")
            shutil.copyfile(stash / name, tmp)
            os.replace(tmp, root / name)
            time.sleep(0.1)

    thread = threading.Thread(target=bring_back, daemon=True)
    thread.start()
    return thread


# -- the readiness gate (vLLM pods on a claim) -----------------------------------------------------------


@functools.cache
def _fsx_gate_command() -> tuple[str, ...]:
    """The vLLM pod's first init container's command on b300-prod with ``storage.kind: fsx``."""
    storage = {**read_stack_config("b300-prod")["kimi-deploy:storage"], "kind": "fsx"}
    pod = vllm_pods(plan_for("b300-prod", overrides={"kimi-deploy:storage": storage}))["server"]
    init = pod["spec"]["initContainers"][0]
    assert init["name"] == "wait-for-weights"
    return tuple(init["command"])


def _gate_argv(zipapp: Path, root: Path, budget_seconds: int) -> list[str]:
    """The init container's argv on fsx, with the zipapp's path and the directory of this test."""
    argv = list(_fsx_gate_command())
    assert argv[3] == SYNC_SCRIPT_PATH and argv[4].startswith("/fsx/")
    argv[0], argv[3], argv[4], argv[5] = sys.executable, str(zipapp), str(root), str(budget_seconds)
    return argv


def test_readiness_gate_waits_for_every_listed_file_not_only_the_marker(zipapp, published, tmp_path):
    root, files = published
    shards = sorted(n for n in files if n.endswith(".safetensors"))[:3]
    argv = _gate_argv(zipapp, root, 60)
    release = threading.Event()
    thread = _import_late(root, shards, tmp_path / "stash", release=release)
    assert (root / ws.MARKER_NAME).exists()  # the marker is there, the shards are not
    gate = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    while not any("listed files not there yet" in line for line in seen):  # the gate has looked and waits
        line = gate.stderr.readline()
        assert line, f"the gate ended without waiting: {''.join(seen)}"
        seen.append(line)
    assert gate.poll() is None  # the marker alone did not open it
    release.set()  # now the import produces the shards
    out, rest = gate.communicate(timeout=120)
    thread.join()
    assert gate.returncode == 0, "".join(seen) + rest
    assert "weights complete" in out
    assert read_tree(str(root)) == files  # when the gate opened, everything listed was there


def test_readiness_gate_gives_up_with_one_line_naming_the_missing_file(zipapp, published):
    root, files = published
    missing = sorted(n for n in files if n.endswith(".safetensors"))[-1]
    os.unlink(root / missing)
    done = subprocess.run(_gate_argv(zipapp, root, 1), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    error = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(error) == 1 and "Traceback" not in done.stderr
    assert f"1 of {len(files)} listed files not there yet: {missing} (missing)" in error[0]
    assert "data repository association" in error[0]


def test_readiness_gate_wants_marker_and_manifest_to_agree(published):
    root, files = published
    assert ws.ready.completeness_problem(str(root)) is None
    manifest = json.loads((root / ws.MANIFEST_NAME).read_text())
    manifest["files"] = manifest["files"][1:]  # an older publish's manifest beside a newer marker
    (root / ws.MANIFEST_NAME).write_text(json.dumps(manifest))
    assert "names manifest" in ws.ready.completeness_problem(str(root))
    os.unlink(root / ws.MARKER_NAME)
    assert ws.ready.completeness_problem(str(root)) == f"no completion marker {ws.MARKER_NAME}"


def test_a_size_short_of_the_manifest_is_not_ready(published):
    root, files = published
    name = sorted(n for n in files if n.endswith(".safetensors"))[0]
    with open(root / name, "r+b") as f:
        f.truncate(len(files[name]) - 1)
    assert f"{name} ({len(files[name]) - 1} bytes, the manifest lists {len(files[name])})" in ws.ready.completeness_problem(
        str(root)
    )


def test_every_listed_file_missing_or_of_another_size_keeps_the_gate_closed(published):
    """Each file the manifest lists, the first and the last included and not only a .safetensors
    shard (config, tokenizer, index): taken away, cut short by a byte or grown by one, it alone keeps
    the gate closed and is named; put back, the copy is complete again. (The gate checks names and
    sizes, what an import produces at once; the content is the copy's sha256 verification.)"""
    root, files = published
    listed = [e["path"] for e in json.loads((root / ws.MANIFEST_NAME).read_text())["files"]]
    assert sorted(listed) == sorted(files) and len(listed) >= 3
    assert {listed[0], listed[-1]} - {n for n in listed if n.endswith(".safetensors")}  # not only shards at the ends
    assert ws.ready.completeness_problem(str(root)) is None
    for name in listed:
        path = root / name
        data = path.read_bytes()
        path.unlink()
        assert ws.ready.completeness_problem(str(root)) == f"1 of {len(listed)} listed files not there yet: {name} (missing)"
        for wrong in (data[:-1], data + b"\0"):
            path.write_bytes(wrong)
            problem = ws.ready.completeness_problem(str(root))
            assert problem == (f"1 of {len(listed)} listed files not there yet: {name} ({len(wrong)} bytes, the manifest "
                               f"lists {len(data)})"), (name, problem)
        path.write_bytes(data)
        assert ws.ready.completeness_problem(str(root)) is None, name


# -- the node copy from the imported file system (nvme-from-fsx) ------------------------------------------


def test_nvme_from_fsx_node_copy_waits_for_the_import():
    run = plan_for("b300-prod", overrides=B300_PROD_FSX)
    copy = vllm_pods(run)["server"]["spec"]["initContainers"][0]["command"]
    assert copy[copy.index("--source") + 1].startswith("file:///fsx/")
    wait = int(copy[copy.index("--source-wait-seconds") + 1])
    assert wait == run.context.spec.config.storage.fsx.import_wait_seconds > 0


def _copy_argv(zipapp: Path, root: Path, dest: Path, wait_seconds: float) -> list[str]:
    """The node copy as nvme-from-fsx runs it (the zipapp, a file:// source, an import wait)."""
    return [sys.executable, str(zipapp), "--source", f"file://{root}", "--dest", str(dest), "--workers", "4",
            "--json", "--quiet", "--source-wait-seconds", f"{wait_seconds:g}"]


def _copy(zipapp: Path, root: Path, dest: Path, wait_seconds: float) -> subprocess.CompletedProcess:
    return subprocess.run(_copy_argv(zipapp, root, dest, wait_seconds), capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("late", ["shards", "shards-and-marker"])
def test_node_copy_waits_and_retries_files_the_import_has_not_produced(zipapp, published, tmp_path, late):
    root, files = published
    names = sorted(n for n in files if n.endswith(".safetensors"))[1:4]
    if late == "shards-and-marker":
        names += [ws.MARKER_NAME, ws.MANIFEST_NAME]
    thread = _import_late(root, names, tmp_path / "stash")
    dest = tmp_path / "nvme"
    proc = subprocess.Popen(_copy_argv(zipapp, root, dest, 60), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(DELAY_SECONDS / 2)
    assert proc.poll() is None and not (root / names[0]).exists()  # running, and the import has not caught up
    out, err = proc.communicate(timeout=180)
    thread.join()
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["files_transferred"] == len(files)
    assert read_tree(str(dest)) == files and (dest / ws.MARKER_NAME).exists()


def test_node_copy_gives_up_after_its_wait_with_one_line_not_a_raw_error(zipapp, published, tmp_path):
    root, files = published
    missing = sorted(n for n in files if n.endswith(".safetensors"))[2]
    os.unlink(root / missing)
    started = time.monotonic()
    done = _copy(zipapp, root, tmp_path / "nvme", wait_seconds=1)
    assert done.returncode == 1
    assert time.monotonic() - started < 60  # bounded
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("weight_sync: error: "), done.stderr
    assert missing in lines[0] and "import" in lines[0]
    assert "FileNotFoundError" not in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "nvme" / ws.MARKER_NAME).exists()


def test_without_a_wait_a_missing_file_fails_at_once_in_one_line(zipapp, published, tmp_path):
    root, files = published
    missing = sorted(n for n in files if n.endswith(".safetensors"))[0]
    os.unlink(root / missing)
    done = _copy(zipapp, root, tmp_path / "nvme", wait_seconds=0)
    assert done.returncode == 1
    assert f"{missing}: missing from source {root}" in done.stderr and "FileNotFoundError" not in done.stderr


def test_the_wait_applies_to_file_sources_only():
    done = subprocess.run([sys.executable, "-m", "scripts.node.weight_sync", "--source", "s3://bucket/p", "--dest", "/tmp/x",
                           "--source-wait-seconds", "5"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--source-wait-seconds applies to file:// sources" in done.stderr
