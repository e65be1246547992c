"""Engine compile/kernel caches: the key (components/spec/engine_cache.py) and the restore/save
program (scripts/engine_cache.py). A restored cache is never used for another build or layout."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest

from components.spec import engine_cache as ec
from components.spec.config import namespace_config, parse_spec, read_stack_config
from components.spec.sizing import compute_sizing
from components.spec.vllm import build_vllm_command
from scripts import engine_cache as tool
from tests.conftest import FIXED_NOW

BASE = dict(
    image="vllm/vllm-openai:v0.33.0", vllm_version="0.33.0", model_revision="a" * 40,
    tensor_parallel_size=8, decode_context_parallel_size=1, nodes_per_copy=1,
    serve_argv=("vllm", "serve", "/models/x", "--tensor-parallel-size", "8"),
    serve_env={"VLLM_USE_V2_MODEL_RUNNER": "1"}, gpu_name="B300", gpu_architecture="blackwell",
)
CHANGES = {
    "image": "vllm/vllm-openai:v0.34.0",
    "vllm_version": "0.34.0",
    "model_revision": "b" * 40,
    "tensor_parallel_size": 4,
    "decode_context_parallel_size": 8,
    "nodes_per_copy": 2,
    "serve_argv": ("vllm", "serve", "/models/x", "--tensor-parallel-size", "8", "--kv-cache-dtype", "fp8"),
    "serve_env": {"VLLM_USE_V2_MODEL_RUNNER": "0"},
    "gpu_name": "GB300",
    "gpu_architecture": "cdna4",
}


def test_key_is_stable():
    assert ec.cache_key(**BASE).digest == ec.cache_key(**dict(BASE)).digest
    assert len(ec.cache_key(**BASE).digest) == ec.KEY_HEX_DIGITS


@pytest.mark.parametrize("part", sorted(CHANGES))
def test_key_changes_when_any_part_changes(part):
    assert set(CHANGES) == set(BASE)  # every part is exercised
    assert ec.cache_key(**{**BASE, part: CHANGES[part]}).digest != ec.cache_key(**BASE).digest


def _key(stack: str, **vllm):
    ns, _ = namespace_config(read_stack_config(stack))
    if vllm:
        ns["vllm"] = {**ns.get("vllm", {}), **vllm}
    spec = parse_spec(ns, stack="t", now=FIXED_NOW)
    return spec, ec.engine_cache_key(spec, build_vllm_command(spec, compute_sizing(spec)))


def test_stack_keys_follow_build_and_layout():
    spec, base = _key("b300")
    assert base.parts["engine_build"]["image"].startswith("vllm/vllm-openai:")
    assert base.parts["gpu"] == {"name": "B300", "architecture": "blackwell"}
    assert _key("b300", imageTag="v0.34.0")[1].digest != base.digest
    assert _key("b300", decodeContextParallelSize=8)[1].digest != base.digest
    assert _key("gb300")[1].digest != base.digest
    # The directory and the archive are named by the key.
    assert ec.cache_dir(base).endswith("/" + base.digest)
    assert ec.archive_uri(spec, "bkt", base).endswith(f"/_engine-cache/{base.digest}.tar")
    restore, save = ec.cache_steps(spec, "bkt", base, "http://127.0.0.1:8000/health")
    assert restore.argv[2] == "restore" and save.argv[2] == "save"
    assert restore.argv[restore.argv.index("--key") + 1] == base.digest
    assert set(ec.vllm_cache_env()) == {"VLLM_CACHE_ROOT", "FLASHINFER_WORKSPACE_BASE"}


def _populate(directory, key, text="compiled"):
    tool.mark(str(directory), key)
    os.makedirs(directory / "vllm" / "torch_compile_cache" / "abc", exist_ok=True)
    (directory / "vllm" / "torch_compile_cache" / "abc" / "artifact.py").write_text(text)


def test_round_trip(tmp_path):
    archive = tmp_path / "mirror" / "k1.tar"
    _populate(tmp_path / "node1" / "k1", "k1")
    assert tool.save(str(archive), str(tmp_path / "node1" / "k1"), "k1", log=lambda *_: None) == "saved"
    target = tmp_path / "node2" / "k1"
    assert tool.restore(str(archive), str(target), "k1", log=lambda *_: None) == "restored"
    assert (target / "vllm" / "torch_compile_cache" / "abc" / "artifact.py").read_text() == "compiled"
    assert tool.recorded_key(str(target)) == "k1"
    assert tool.restore(str(archive), str(target), "k1", log=lambda *_: None) == "present"


def test_restore_refuses_another_key(tmp_path):
    """An archive saved for one build/layout is never restored for another."""
    archive = tmp_path / "mirror" / "x.tar"
    _populate(tmp_path / "node1" / "old", "old-key")
    tool.save(str(archive), str(tmp_path / "node1" / "old"), "old-key", log=lambda *_: None)
    target = tmp_path / "node2" / "new"
    assert tool.restore(str(archive), str(target), "new-key", log=lambda *_: None) == "refused"
    assert not (target / "vllm").exists()
    # Through the command line: exit 0 (the engine starts cold), the directory records the new key only.
    assert tool.main(["restore", "--uri", str(archive), "--dir", str(target), "--key", "new-key"]) == 0
    assert tool.recorded_key(str(target)) == "new-key" and not (target / "vllm").exists()


def test_save_never_overwrites_and_refuses_a_foreign_directory(tmp_path):
    archive = tmp_path / "a.tar"
    _populate(tmp_path / "d", "k1", "first")
    assert tool.save(str(archive), str(tmp_path / "d"), "k1", log=lambda *_: None) == "saved"
    before = archive.read_bytes()
    _populate(tmp_path / "d", "k1", "second")
    assert tool.save(str(archive), str(tmp_path / "d"), "k1", log=lambda *_: None) == "exists"
    assert archive.read_bytes() == before
    _populate(tmp_path / "e", "other")
    with pytest.raises(tool.CacheError, match="records key other"):
        tool.save(str(tmp_path / "b.tar"), str(tmp_path / "e"), "k1", log=lambda *_: None)
    assert tool.save(str(tmp_path / "c.tar"), str(tmp_path / "empty"), "k1") == "empty"
    assert tool.restore(str(tmp_path / "none.tar"), str(tmp_path / "f"), "k1", log=lambda *_: None) == "missing"


def test_restore_rejects_members_outside_the_directory(tmp_path):
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        for name, data in ((tool.KEY_FILE_NAME, json.dumps({"digest": "k"}).encode()), ("../escape.txt", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(tool.CacheError, match="outside"):
        tool.restore(str(archive), str(tmp_path / "d"), "k", log=lambda *_: None)
    assert not (tmp_path / "escape.txt").exists()
    assert tool.main(["restore", "--uri", str(archive), "--dir", str(tmp_path / "d"), "--key", "k"]) == 1


def test_restore_and_save_through_s3(tmp_path, monkeypatch):
    moto = pytest.importorskip("moto")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with moto.mock_aws():
        import boto3

        boto3.client("s3").create_bucket(Bucket="mirror")
        uri = "s3://mirror/models/r/_engine-cache/k.tar"
        _populate(tmp_path / "a", "k")
        assert tool.save(uri, str(tmp_path / "a"), "k", log=lambda *_: None) == "saved"
        assert tool.save(uri, str(tmp_path / "a"), "k", log=lambda *_: None) == "exists"
        assert tool.restore(uri, str(tmp_path / "b"), "k", log=lambda *_: None) == "restored"
        assert tool.restore(uri, str(tmp_path / "c"), "other", log=lambda *_: None) == "refused"


def test_ec2_units_run_the_core_argv(tmp_path):
    """The EC2 units run exactly the core's argv in the pinned image, restore before vLLM, save after it."""
    import shutil
    import subprocess

    from components.aws.userdata import Ec2BootConfig, engine_cache_units

    spec, key = _key("b300")
    restore, save = ec.cache_steps(spec, "bkt", key, "http://127.0.0.1:8000/health")
    cfg = Ec2BootConfig(region="us-east-1", image="vllm/vllm-openai:v0.33.0", vllm_argv=("vllm", "serve"), vllm_env={},
                        port=8000, sync_steps=(), tools_uri="s3://b/t", tools_sha256="0" * 64,
                        api_key_parameter="/p", hub_token_parameter=None, hub_token_env="HF_TOKEN", nvme_devices=8)
    units = engine_cache_units(cfg, restore.argv, save.argv)
    r, s = units["kimi-engine-cache-restore.service"], units["kimi-engine-cache-save.service"]
    assert "Before=kimi-vllm.service" in r and "After=docker.service kimi-weights.service" in r
    assert "After=docker.service kimi-vllm.service" in s
    assert key.digest in r and "restore" in r and "--wait-url http://127.0.0.1:8000/health" in s
    assert "vllm/vllm-openai:v0.33.0" in r
    if shutil.which("systemd-analyze"):
        for name, text in units.items():
            (tmp_path / name).write_text(text.replace("/usr/bin/docker", "/bin/true"))
        out = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / n) for n in units)],
                             capture_output=True, text=True)
        assert "Unknown key" not in out.stderr and "Invalid" not in out.stderr, out.stderr
