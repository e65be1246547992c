"""Engine compile/kernel caches: the key (components/core/engine_cache.py) and the restore/save
program (scripts/node/engine_cache.py). A restored cache is never used for another build or layout."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest

from components.core import engine_cache as ec
from components.core.config import namespace_config, read_stack_config
from components.core.load import parse_spec
from components.core.node_storage import node_dirs
from components.core.sizing import compute_sizing
from components.core.vllm import build_vllm_command
from scripts.node import engine_cache as tool
from tests.conftest import FIXED_NOW, REPO_ROOT

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
    # A manifest that matches (whoever can write the archive may write it too): the members are still checked.
    manifest = {"version": 1, "key": "k", "archive_sha256": tool.sha256_file(str(archive)), "files": {}}
    (tmp_path / ("evil.tar" + tool.MANIFEST_SUFFIX)).write_text(json.dumps(manifest))
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


# -- Kubernetes (aws-eks): restore init container, save sidecar, grant -------------------------------


def _eks_pods(stack: str, **overrides):
    from tests.conftest import plan_for
    from tests.test_k8s_workloads import vllm_pods

    run = plan_for(stack, overrides=overrides or None)
    return run, vllm_pods(run)


def _container(pod, name):
    return next(c for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]] if c["name"] == name)


def _core_argv(argv):
    """The core's argv inside the runner (``python3 -c RUNNER_SCRIPT mode limit attempts pause ARGV``)."""
    from components.k8s import engine_cache as kec

    assert argv[:3] == ["python3", "-c", kec.RUNNER_SCRIPT]
    return argv[7:]


def _opt(argv, flag):
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("stack", ["gb300", "b300-prod"])
def test_eks_pods_restore_after_the_copy_and_save_in_a_sidecar(stack):
    """The restore runs the core's argv after the weight copy (init containers run in order, vLLM
    after all of them); the save is a native sidecar (restartPolicy Always) running the core's save."""
    from components.k8s import engine_cache as kec

    run, pods = _eks_pods(stack)
    spec, cmd = run.context.spec, run.context.vllm
    assert ec.restored_at_start(spec)
    mirror = run.outputs["mirrorUri"].rstrip("/")
    bucket = mirror[len("s3://"):].split("/", 1)[0]
    for role_name, pod in pods.items():
        inits = pod["spec"]["initContainers"]
        assert [c["name"] for c in inits] == ["weight-sync", kec.RESTORE_CONTAINER, kec.SAVE_CONTAINER], role_name
        restore, save = inits[1], inits[2]
        assert "restartPolicy" not in restore and save["restartPolicy"] == "Always"
        role = cmd.role(role_name)
        key = ec.engine_cache_key(spec, cmd)
        group = len(cmd.roles) > 1  # every node of the copy has its own archive (the program adds -node<index>)
        url = f"http://127.0.0.1:{cmd.port}/health"
        want_restore, want_save = ec.cache_steps(spec, bucket, key, url, spec.nodes_per_copy if group else 1,
                                                 worker=not role.serves_http)
        assert _core_argv(restore["command"]) == list(want_restore.argv)
        assert _core_argv(save["command"]) == [*want_save.argv, "--gate", kec.GATE_FILE]
        assert restore["command"][3:7] == ["restore", str(kec.RESTORE_TIMEOUT_SECONDS), "1", "0"]
        assert save["command"][3:7] == ["save", "0", str(kec.SAVE_ATTEMPTS), str(kec.SAVE_RETRY_SECONDS)]
        archive = _opt(_core_argv(restore["command"]), "--uri")
        assert archive == f"{mirror}/{ec.MIRROR_FOLDER}/{key.digest}.tar"  # beside the weights, the real bucket
        assert archive.startswith(f"s3://{bucket}/{ec.cache_key_prefix(spec)}/")
        for c in (restore, save):
            assert c["image"] == cmd.image and c["securityContext"]["readOnlyRootFilesystem"] is True
            env = {e["name"]: e["value"] for e in c["env"]}
            assert env["TMPDIR"] == ec.ENGINE_CACHE_ROOT  # the save stages its archive on the cache volume
            assert {"name": kec.PROGRAM_VOLUME, "mountPath": "/opt/kimi-deploy", "readOnly": True} in c["volumeMounts"]
            cache = next(m for m in c["volumeMounts"] if m["mountPath"] == ec.ENGINE_CACHE_ROOT)
            # Its own directory on the node's NVMe (never the array, never the weights' volume).
            assert cache == {"name": kec.CACHE_VOLUME, "mountPath": ec.ENGINE_CACHE_ROOT}
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == kec.CACHE_VOLUME)
        assert volume["hostPath"]["path"] == node_dirs(run.context.spec.profile.nvme_host_path).engine_cache
        # vLLM: the key's directory read-write, the weights still read-only, no AWS credentials.
        vllm = _container(pod, "vllm")
        mount = next(m for m in vllm["volumeMounts"] if m["mountPath"] == ec.ENGINE_CACHE_CONTAINER_PATH)
        sub = mount.get("subPathExpr", mount.get("subPath"))
        node = "-node$(LWS_WORKER_INDEX)" if group else ""
        assert f"{ec.ENGINE_CACHE_ROOT}/{sub}" == _opt(_core_argv(restore["command"]), "--dir") + node
        assert not mount.get("readOnly")
        assert ("subPathExpr" in mount) == (len(cmd.roles) > 1)
        assert next(m for m in vllm["volumeMounts"] if m["mountPath"] == "/models")["readOnly"] is True
        env = {e["name"]: e.get("value") for e in vllm["env"]}
        assert {k: env[k] for k in ec.vllm_cache_env()} == ec.vllm_cache_env()
        assert pod["metadata"]["annotations"][kec.SKIP_CONTAINERS_ANNOTATION] == "vllm"
        assert pod["spec"]["serviceAccountName"] == ec.vllm_pods_service_account(spec)


def test_gb300_nodes_of_a_copy_keep_their_own_caches():
    """Leader and worker restore and save their own archive (rank-specific torch.compile caches):
    the program reads the node's index and the leader's address from the LeaderWorkerSet's env, so
    no argv of theirs holds a ``$(VAR)`` the kubelet would expand."""
    _, pods = _eks_pods("gb300")
    argv = {(r, c): _core_argv(_container(p, c)["command"]) for r, p in pods.items()
            for c in ("engine-cache-restore", "engine-cache-save")}
    assert not any("$(" in a for items in argv.values() for a in items)
    keys = {r: _opt(argv[r, "engine-cache-restore"], "--key") for r in pods}
    assert keys["leader"] == keys["worker"]
    assert all(_opt(items, "--node-index-env") == "LWS_WORKER_INDEX" for items in argv.values())
    base = ec.EngineCacheKey({}, "d")
    assert ec.node_key(base, "0").digest != ec.node_key(base, "1").digest
    leader, worker = argv["leader", "engine-cache-save"], argv["worker", "engine-cache-save"]
    assert _opt(leader, "--wait-url").startswith("http://127.0.0.1:") and "--wait-host-env" not in leader
    assert _opt(worker, "--wait-host-env") == "LWS_LEADER_ADDRESS"
    assert _opt(leader, "--group-nodes") == "2" == _opt(worker, "--group-nodes")
    assert _opt(leader, "--group-wait-seconds") == str(ec.ENGINE_CACHE_GROUP_WAIT_SECONDS)


def test_pods_of_another_layout_or_build_get_another_key():
    def key(stack, **vllm):
        overrides = {}
        if vllm:
            overrides["kimi-deploy:vllm"] = {**read_stack_config(stack)["kimi-deploy:vllm"], **vllm}
        _, pods = _eks_pods(stack, **overrides)
        return {_opt(_core_argv(_container(p, "engine-cache-restore")["command"]), "--key") for p in pods.values()}

    base = key("gb300")
    assert key("gb300", decodeContextParallelSize=2) != base
    assert key("gb300", imageTag="nightly-" + "3" * 40) != base
    single = key("b300-prod")
    assert single.isdisjoint(base) and not any("-node" in k for k in single)  # one node: the copy's key


def test_pods_and_program_configmap():
    from components.k8s import engine_cache as kec
    from tests.test_k8s_workloads import of_kind

    run, pods = _eks_pods("gb300")
    (cm,) = [c for c in of_kind(run, "ConfigMap") if c["metadata"]["name"].startswith(kec.PROGRAM_CONFIGMAP_PREFIX + "-")]
    text = (REPO_ROOT / "scripts" / "node" / "engine_cache.py").read_text()
    assert cm["data"] == {"engine_cache.py": text} and cm["immutable"] is True
    assert cm["metadata"]["name"] == kec.program_configmap_name(text)
    volume = {"name": kec.PROGRAM_VOLUME, "configMap": {"name": cm["metadata"]["name"], "defaultMode": 0o444}}
    for pod in pods.values():
        assert volume in pod["spec"]["volumes"]


def test_kubernetes_platform_and_ec2_pods_get_no_engine_cache():
    """mi355x (kubernetes platform, no mirror) restores nothing: no containers, no ConfigMap."""
    from components.k8s import engine_cache as kec
    from tests.test_k8s_workloads import of_kind

    run, pods = _eks_pods("mi355x")
    assert not ec.restored_at_start(run.context.spec)
    for pod in pods.values():
        names = {c["name"] for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]}
        assert not names & {kec.RESTORE_CONTAINER, kec.SAVE_CONTAINER}
        assert "VLLM_CACHE_ROOT" not in {e["name"] for e in _container(pod, "vllm")["env"]}
    assert not [c for c in of_kind(run, "ConfigMap") if c["metadata"]["name"].startswith(kec.PROGRAM_CONFIGMAP_PREFIX + "-")]


def test_shared_claims_keep_the_cache_in_an_empty_dir():
    """fsx: the serving claim is shared, so the cache lives in an emptyDir; the pods run as the vLLM
    account, which then is the one granted the engine-cache rights."""
    from components.core.naming import VLLM_SERVICE_ACCOUNT
    from components.k8s import engine_cache as kec

    storage = {**read_stack_config("b300-prod")["kimi-deploy:storage"], "kind": "fsx"}
    run, pods = _eks_pods("b300-prod", **{"kimi-deploy:storage": storage})
    (pod,) = pods.values()
    assert {"name": kec.CACHE_VOLUME, "emptyDir": {"sizeLimit": kec.EMPTY_DIR_SIZE}} in pod["spec"]["volumes"]
    mount = next(m for m in _container(pod, "vllm")["volumeMounts"] if m["mountPath"] == ec.ENGINE_CACHE_CONTAINER_PATH)
    assert mount["name"] == kec.CACHE_VOLUME and "/" not in mount["subPath"]
    assert pod["spec"]["serviceAccountName"] == VLLM_SERVICE_ACCOUNT == ec.vllm_pods_service_account(run.context.spec)
    assoc = {r.inputs["serviceAccount"] for r in run.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")}
    assert VLLM_SERVICE_ACCOUNT in assoc
    policies = {r.name for r in run.of_type("aws:iam/rolePolicy:RolePolicy")}
    assert f"eks-{VLLM_SERVICE_ACCOUNT}-engine-cache" in policies and f"eks-{VLLM_SERVICE_ACCOUNT}-weight-mirror" not in policies


def test_restore_budget_is_part_of_the_pod_budget():
    from components.core.sizing import sync_budget_seconds
    from components.core.time_to_ready import pod_ready_budget
    from components.core.weights import sync_steps
    from components.k8s import engine_cache as kec
    from components.k8s.vllm_service import per_pod_budget_seconds
    from tests.test_k8s_workloads import one

    run, _ = _eks_pods("b300-prod")
    spec, sizing = run.context.spec, run.context.sizing
    copy = next(s for s in sync_steps(spec, "b") if s.name == "node-copy")
    want = per_pod_budget_seconds(spec, sizing)
    assert one(run, "Deployment")["spec"]["progressDeadlineSeconds"] == want
    init = {p.name: p.budget_seconds for p in pod_ready_budget(spec, sizing).phases if p.init_container}
    assert init == {"weight copy mirror -> NVMe": sync_budget_seconds(spec, sizing, copy),
                    "engine cache restore": kec.RESTORE_TIMEOUT_SECONDS}


@pytest.mark.parametrize("stack", ["gb300", "b300-prod"])
def test_the_leaders_wait_for_its_workers_saves_is_part_of_the_pod_budget(stack):
    """A copy spanning nodes: the leader's gate may stay closed ``ENGINE_CACHE_GROUP_WAIT_SECONDS``
    after its start while its workers save, so its creation-to-ready budget holds that phase
    (the old budget did not: a slow worker save would read as a pod late past its budget)."""
    from components.core.time_to_ready import ENGINE_CACHE_GROUP_PHASE, pod_ready_budget

    run, _ = _eks_pods(stack)
    spec, sizing = run.context.spec, run.context.sizing
    phases = {p.name: p.budget_seconds for p in pod_ready_budget(spec, sizing).phases}
    if spec.nodes_per_copy > 1:
        assert phases[ENGINE_CACHE_GROUP_PHASE] == ec.ENGINE_CACHE_GROUP_WAIT_SECONDS
    else:
        assert ENGINE_CACHE_GROUP_PHASE not in phases


# -- IAM: the save writes only <revision>/_engine-cache/ ----------------------------------------------


def test_engine_cache_policy_document():
    from components.aws import iam

    doc = json.loads(iam.engine_cache_policy("aws", "bkt", "models/org/repo/rev/_engine-cache/"))
    st = {s["Sid"]: s for s in doc["Statement"]}
    assert st["ListEngineCache"]["Resource"] == "arn:aws:s3:::bkt"
    assert st["ListEngineCache"]["Condition"] == {
        "StringLike": {"s3:prefix": ["models/org/repo/rev/_engine-cache", "models/org/repo/rev/_engine-cache/*"]}
    }
    assert st["ReadEngineCache"] == {"Sid": "ReadEngineCache", "Effect": "Allow", "Action": ["s3:GetObject"],
                                     "Resource": "arn:aws:s3:::bkt/models/org/repo/rev/_engine-cache/*"}
    assert st["WriteEngineCache"]["Resource"] == "arn:aws:s3:::bkt/models/org/repo/rev/_engine-cache/*"
    assert set(st["WriteEngineCache"]["Action"]) == {"s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"}
    actions = [a for s in doc["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])]
    assert not any("Delete" in a or a == "s3:*" for a in actions)
    for bad in ("", "/", "models/../x"):
        with pytest.raises(ValueError, match="engine cache prefix"):
            iam.engine_cache_policy("aws", "bkt", bad)


def test_gb300_pod_account_may_write_only_its_revisions_engine_cache():
    from tests.conftest import plan_for

    run = plan_for("gb300")
    spec = run.context.spec
    account = ec.vllm_pods_service_account(spec)
    policies = {r.name: json.loads(r.inputs["policy"]) for r in run.of_type("aws:iam/rolePolicy:RolePolicy")}
    cache = policies[f"eks-{account}-engine-cache"]
    bucket_arn = "arn:aws:s3:::mirror-bucket-a1b2c3d"
    writes = [s for s in cache["Statement"] if "s3:PutObject" in s["Action"]]
    assert [w["Resource"] for w in writes] == [f"{bucket_arn}/{ec.cache_key_prefix(spec)}/*"]
    assert ec.cache_key_prefix(spec).endswith("/_engine-cache")
    # The other roles gained nothing: the publisher still writes its revision, the reader reads.
    for name, doc in policies.items():
        if name == f"eks-{account}-engine-cache":
            continue
        for s in doc["Statement"]:
            assert not str(s["Resource"]).endswith("_engine-cache/*"), name
    role = run.named(f"eks-{account}")
    assert "engine caches" in role.inputs["description"]


# -- the runner around the core's argv ----------------------------------------------------------------


def _runner(mode, limit, attempts, pause, *argv):
    import subprocess
    import sys

    from components.k8s import engine_cache as kec

    return subprocess.Popen([sys.executable, "-c", kec.RUNNER_SCRIPT, mode, str(limit), str(attempts), str(pause), *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_runner_restore_always_lets_the_engine_start(tmp_path):
    import sys

    from components.k8s import engine_cache as kec

    assert "$(" not in kec.RUNNER_SCRIPT  # the kubelet expands $(VAR) in every command element

    failing = _runner("restore", 0, 1, 0, sys.executable, "-c", "raise SystemExit(3)")
    out, err = failing.communicate(timeout=60)
    assert failing.returncode == 0 and "ended with 3" in err
    slow = _runner("restore", 1, 1, 0, sys.executable, "-c", "import time; time.sleep(30)")
    out, err = slow.communicate(timeout=60)
    assert slow.returncode == 0 and "timeout after 1 s" in err


def test_runner_save_retries_then_idles_until_sigterm(tmp_path):
    import signal
    import sys
    import time

    counter = tmp_path / "runs"
    script = f"open({str(counter)!r}, 'a').write('x'); raise SystemExit(1)"
    proc = _runner("save", 0, 2, 0, sys.executable, "-c", script)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (counter.exists() and len(counter.read_text()) == 2):
        time.sleep(0.1)
    time.sleep(0.5)
    assert proc.poll() is None  # idles: an exited sidecar would be restarted and the pod unready
    assert counter.read_text() == "xx"  # SAVE_ATTEMPTS, no more
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "attempt 2/2 ended with 1" in err


# --- the sha256 manifest and the snapshot taken before the pod is Ready ------------------------------


def _saved(tmp_path, key="k1", text="compiled"):
    archive = tmp_path / "mirror" / f"{key}.tar"
    _populate(tmp_path / "node1" / key, key, text)
    assert tool.save(str(archive), str(tmp_path / "node1" / key), key, log=lambda *_: None) == "saved"
    return archive


def _rewrite(archive, change):
    """The archive with each member's bytes passed through ``change(name, data)`` (same names, same order)."""
    members = []
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            data = tar.extractfile(m).read() if m.isfile() else None
            members.append((m, data))
    with tarfile.open(archive, "w") as tar:
        for m, data in members:
            if data is None:
                tar.addfile(m)
                continue
            data = change(m.name, data)
            m.size = len(data)
            tar.addfile(m, io.BytesIO(data))


def test_save_records_a_sha256_manifest_of_the_archive_and_every_file(tmp_path):
    archive = _saved(tmp_path)
    manifest = json.loads((tmp_path / "mirror" / ("k1.tar" + tool.MANIFEST_SUFFIX)).read_text())
    artifact = "vllm/torch_compile_cache/abc/artifact.py"
    assert manifest["key"] == "k1" and manifest["archive_sha256"] == tool.sha256_file(str(archive))
    assert manifest["files"] == {artifact: {"size": 8, "sha256": hashlib.sha256(b"compiled").hexdigest()}}


def test_a_tampered_archive_is_refused_and_the_engine_compiles_cold(tmp_path):
    """One member's bytes changed after the save (the key file untouched): the archive's sha256 is not
    the manifest's; refused, nothing restored, exit 0 (a cold start). The old restore ran it."""
    archive = _saved(tmp_path)
    _rewrite(archive, lambda name, data: b"import os  # poisoned" if name.endswith("artifact.py") else data)
    target = tmp_path / "node2" / "k1"
    assert tool.restore(str(archive), str(target), "k1", log=lambda *_: None) == "refused"
    assert not (target / "vllm").exists()
    assert tool.main(["restore", "--uri", str(archive), "--dir", str(target), "--key", "k1"]) == 0
    assert tool.recorded_key(str(target)) == "k1" and not (target / "vllm").exists()


def test_a_forged_archive_sha256_does_not_pass_the_per_file_check(tmp_path):
    """The manifest's archive sha256 rewritten to the tampered archive's: the files still differ."""
    archive = _saved(tmp_path)
    _rewrite(archive, lambda name, data: b"poisoned" if name.endswith("artifact.py") else data)
    manifest_path = tmp_path / "mirror" / ("k1.tar" + tool.MANIFEST_SUFFIX)
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "archive_sha256": tool.sha256_file(str(archive))}))
    assert tool.restore(str(archive), str(tmp_path / "node2" / "k1"), "k1", log=lambda *_: None) == "refused"
    assert not (tmp_path / "node2" / "k1" / "vllm").exists()


def test_an_archive_without_a_manifest_is_refused(tmp_path):
    archive = _saved(tmp_path)
    (tmp_path / "mirror" / ("k1.tar" + tool.MANIFEST_SUFFIX)).unlink()
    assert tool.restore(str(archive), str(tmp_path / "node2" / "k1"), "k1", log=lambda *_: None) == "refused"
    # A save over it writes the archive and its manifest again (a manifest, not the archive, means saved).
    _populate(tmp_path / "node1" / "k1", "k1")
    assert tool.save(str(archive), str(tmp_path / "node1" / "k1"), "k1", log=lambda *_: None) == "saved"
    assert tool.restore(str(archive), str(tmp_path / "node2" / "k1"), "k1", log=lambda *_: None) == "restored"


def test_the_archive_is_the_snapshot_taken_before_the_gate_opens(tmp_path, monkeypatch):
    """Whatever the cache directory gains once the gate is open (the pod Ready, requests admitted) is
    not archived: the gate opens after the snapshot, and the archive is made from the snapshot."""
    directory = tmp_path / "node1" / "k1"
    _populate(directory, "k1")
    gate = tmp_path / "gate" / "snapshot-taken"
    opened = []

    def open_gate(path):
        assert path == str(gate)
        opened.append(path)
        (directory / "written-by-a-request.py").write_text("poison")  # what a served request could write
        (directory / "vllm" / "torch_compile_cache" / "abc" / "artifact.py").write_text("changed")

    monkeypatch.setattr(tool, "open_gate", open_gate)
    archive = tmp_path / "mirror" / "k1.tar"
    assert tool.save(str(archive), str(directory), "k1", log=lambda *_: None, gate=str(gate)) == "saved"
    assert opened == [str(gate)]
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert "written-by-a-request.py" not in names
        assert tar.extractfile("vllm/torch_compile_cache/abc/artifact.py").read() == b"compiled"


def test_the_gate_opens_whatever_save_finds(tmp_path):
    archive = _saved(tmp_path)
    for directory, expected in ((tmp_path / "node1" / "k1", "exists"), (tmp_path / "nothing", "empty")):
        gate = tmp_path / f"gate-{expected}"
        store = archive if expected == "exists" else tmp_path / "other.tar"
        assert tool.save(str(store), str(directory), "k1", log=lambda *_: None, gate=str(gate)) == expected
        assert gate.is_file()


@pytest.mark.parametrize("stack", ["gb300", "b300-prod"])
def test_the_pod_is_not_ready_before_the_snapshot_is_taken(stack):
    """Rendered pods: the save sidecar writes the gate (read-write, in memory), the vLLM container
    reads it (read-only), and the serving role's readiness fails until the gate file exists, then
    runs the probe it had (the old pods were Ready while the cache the save archives was still open
    to what requests wrote)."""
    from components.k8s import engine_cache as kec
    from components.k8s.vllm_service import readiness_probe

    run, pods = _eks_pods(stack)
    cmd = run.context.vllm
    gated = 0
    for role_name, pod in pods.items():
        save = next(c for c in pod["spec"]["initContainers"] if c["name"] == kec.SAVE_CONTAINER)
        assert {"name": kec.GATE_VOLUME, "mountPath": kec.GATE_DIR} in save["volumeMounts"]
        assert _opt(save["command"], "--gate") == kec.GATE_FILE
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == kec.GATE_VOLUME)
        assert volume["emptyDir"]["medium"] == "Memory"
        vllm = _container(pod, "vllm")
        assert {"name": kec.GATE_VOLUME, "mountPath": kec.GATE_DIR, "readOnly": True} in vllm["volumeMounts"]
        if cmd.role(role_name).serves_http:
            gated += 1
            probe = vllm["readinessProbe"]["exec"]["command"]
            original = readiness_probe(cmd.port, cmd.served_model_names[0])["exec"]["command"]
            assert probe == ["python3", "-c", kec.GATED_PROBE_SCRIPT, kec.GATE_FILE, *original]
    assert gated == 1


def test_the_gated_probe_fails_until_the_gate_exists_then_runs_the_probe(tmp_path):
    import subprocess
    import sys

    from components.k8s import engine_cache as kec

    gate = tmp_path / "snapshot-taken"

    def probe(*inner):
        return subprocess.run([sys.executable, "-c", kec.GATED_PROBE_SCRIPT, str(gate), *inner], timeout=60).returncode

    assert probe("true") == 1
    gate.write_text("snapshot taken\n")
    assert probe("true") == 0 and probe("false") == 1


def test_a_failed_save_opens_the_gate_and_a_retry_archives_nothing(tmp_path, monkeypatch):
    """An upload that fails after the snapshot: the gate is open (the pod can serve), and the runner's
    next attempt finds it open and archives nothing (its directory may hold what requests wrote)."""
    directory = tmp_path / "node1" / "k1"
    _populate(directory, "k1")
    gate = tmp_path / "gate" / "snapshot-taken"
    archive = tmp_path / "mirror" / "k1.tar"

    def fail(path, uri):
        raise tool.CacheError("upload failed")

    monkeypatch.setattr(tool, "put", fail)
    argv = ["save", "--uri", str(archive), "--dir", str(directory), "--key", "k1", "--gate", str(gate)]
    assert tool.main(argv) == 1 and gate.is_file()
    monkeypatch.undo()
    assert tool.main(argv) == 0 and not archive.exists()
    assert tool.save(str(archive), str(directory), "k1", log=lambda *_: None, gate=str(gate)) == "late"


# --- a cache already on the node is trusted only when it matches the manifest ----------------------


@pytest.mark.parametrize("case", ["no manifest", "changed file", "request output", "matches"])
def test_a_node_local_directory_is_kept_only_when_it_matches_the_manifest(tmp_path, case):
    """A directory on the node's NVMe recording the key (a pod restarted on its node, a reboot) is
    checked against the mirror's manifest like an archive: a changed file or one a request wrote after
    the snapshot drops it (the archive is restored in its place), no manifest at all drops it (a
    cold start). The old restore returned ``present`` for all four without reading a byte."""
    archive = tmp_path / "mirror" / "k1.tar"
    local = tmp_path / "node1" / "k1"  # the directory the save archived, still on the node
    _populate(local, "k1")
    if case == "no manifest":
        archive = tmp_path / "empty-mirror" / "k1.tar"
    else:
        assert tool.save(str(archive), str(local), "k1", log=lambda *_: None) == "saved"
    tool.mark(str(local), "k1")
    artifact = local / "vllm" / "torch_compile_cache" / "abc" / "artifact.py"
    if case == "changed file":
        artifact.write_text("import os  # poisoned")
    elif case == "request output":
        (local / "vllm" / "written-at-request-time.py").write_text("x")
    got = tool.restore(str(archive), str(local), "k1", log=lambda *_: None)
    if case == "matches":
        assert got == "present" and artifact.read_text() == "compiled"
    elif case == "no manifest":
        assert got == "missing" and not local.exists()
    else:
        assert got == "restored" and artifact.read_text() == "compiled"
        assert not (local / "vllm" / "written-at-request-time.py").exists()
    assert tool.main(["restore", "--uri", str(archive), "--dir", str(local), "--key", "k1"]) == 0
    assert tool.recorded_key(str(local)) == "k1"


def test_an_unreadable_mirror_leaves_no_unverified_directory(tmp_path, monkeypatch):
    """The check cannot run (the mirror errors): the node's directory is gone, not served unverified."""
    local = tmp_path / "node1" / "k1"
    _populate(local, "k1")
    tool.mark(str(local), "k1")

    def down(uri, path):
        raise tool.CacheError("mirror down")

    monkeypatch.setattr(tool, "fetch", down)
    assert tool.main(["restore", "--uri", str(tmp_path / "m" / "k1.tar"), "--dir", str(local), "--key", "k1"]) == 1
    assert not (local / "vllm").exists()


# --- the gate in the API guard: no request reaches the engine before the snapshot ---------------------

GUARD_KEY = "sk-engine-cache-gate-0123456789"


def _guarded(path: str, gate: str | None, on_request=lambda: None, key: str = GUARD_KEY) -> tuple[int, dict[str, str]]:
    """(status, headers) of one request through the real API guard around a stand-in engine that
    runs ``on_request`` for each request it serves."""
    from scripts.node.kimi_vllm_api_guard import RequireApiKey
    from tests.test_api_guard import exchange

    async def engine(scope, receive, send):
        on_request()
        await send({"type": "http.response.start", "status": 200, "headers": []})

    scope = {"type": "http", "path": path, "method": "GET", "headers": [(b"authorization", f"Bearer {key}".encode())]}
    sent = exchange(RequireApiKey(engine, api_key=GUARD_KEY, gate=gate), scope)
    return sent[0]["status"], {k.decode(): v.decode() for k, v in sent[0].get("headers", [])}


def test_the_guard_and_the_program_name_one_gate():
    from scripts.node import kimi_vllm_api_guard as guard

    assert guard.GATE_ENV == ec.GATE_ENV and guard.GATE_HEADER == tool.GATE_HEADER
    assert tool.GATE_PROBE_PATH not in guard.OPEN_PATHS


def test_the_guard_refuses_every_request_until_the_gate_exists(tmp_path):
    """Gate closed: 503 with the gate header, even with the key, and the engine never runs; /health
    and /metrics stay open (probes, the save's wait). Gate open: the key decides, as before."""
    gate = tmp_path / "open"
    served = []
    status, headers = _guarded("/v1/chat/completions", str(gate), lambda: served.append(1))
    assert status == 503 and headers[tool.GATE_HEADER] == "closed" and not served
    assert _guarded("/health", str(gate), lambda: served.append(1))[0] == 200 and served == [1]
    gate.write_text("")
    assert _guarded("/v1/chat/completions", str(gate), lambda: served.append(2))[0] == 200 and served == [1, 2]
    assert _guarded("/v1/chat/completions", str(gate), key="wrong-key-0123456789")[0] == 401
    assert _guarded("/v1/chat/completions", None)[0] == 200  # no gate configured: not gated


def _ec2_boot():
    import base64

    import yaml

    from components.aws import userdata
    from tests.conftest import plan_for

    run = plan_for("b300")
    doc = yaml.safe_load(base64.b64decode(run.named("gpu-lt").inputs["userData"]).decode())
    files = {f["path"]: f["content"] for f in doc["write_files"]}
    units = {p.rsplit("/", 1)[1]: c for p, c in files.items() if p.startswith("/etc/systemd/system/")}
    return files, units, userdata


def _unit_lines(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]


def _program_argv(docker_argv: list[str]) -> list[str]:
    """The program's argv (after ``python3 SCRIPT``) inside a rendered ``docker run``."""
    entry = docker_argv.index("--entrypoint")
    return docker_argv[entry + 4:]  # --entrypoint python3 IMAGE SCRIPT


def test_ec2_no_request_reaches_the_engine_before_the_snapshot_and_a_tampered_archive_is_refused(tmp_path):
    """The rendered b300 user data, run: the vLLM container's env names the gate and mounts its
    directory read-only; the save's rendered argv snapshots the cache and opens the gate; until then
    every request gets 503 from the guard and the engine writes nothing; what a request writes after
    is in no archive; a tampered archive is refused at the next start (a cold start). The old user
    data gave the guard no gate: requests were served while the save waited, and archived."""
    import shlex

    files, units, userdata = _ec2_boot()
    env = dict(line.split("=", 1) for line in files[userdata.VLLM_ENV_FILE].splitlines())
    assert env[ec.GATE_ENV] == ec.GATE_FILE
    run_vllm = shlex.split(files[userdata.VLLM_SCRIPT].splitlines()[-1])
    assert f"{ec.GATE_DIR}:{ec.GATE_DIR}:ro" in run_vllm
    save_unit = units[userdata.ENGINE_CACHE_UNITS[1]]
    docker = shlex.split(_unit_lines(save_unit, "ExecStart")[0])
    assert f"{ec.GATE_DIR}:{ec.GATE_DIR}" in docker
    assert _unit_lines(save_unit, "ExecStopPost") == [f"/usr/bin/touch {ec.GATE_FILE}"]  # a failed save opens it
    argv = _program_argv(docker)
    assert argv[0] == "save" and _opt(argv, "--gate") == ec.GATE_FILE
    restore_argv = _program_argv(shlex.split(_unit_lines(units[userdata.ENGINE_CACHE_UNITS[0]], "ExecStart")[0]))

    # The node, in tmp_path: the rendered paths mapped below it, vLLM's /health wait left out.
    cache = tmp_path / "nvme" / "cache"
    gate = tmp_path / "run" / "open"
    mapping = {_opt(argv, "--uri"): str(tmp_path / "mirror" / "cache.tar"), _opt(argv, "--dir"): str(cache),
               ec.GATE_FILE: str(gate)}
    key = _opt(argv, "--key")
    _populate(cache, key, "compiled at start")

    def node(items):
        out, skip = [], False
        for a in items:
            if skip:
                skip = False
                continue
            if a == "--wait-url":
                skip = True
                continue
            out.append(mapping.get(a, a))
        return out

    served = []

    def engine_serves():  # what a served request may leave behind: new kernels, changed files
        served.append(1)
        (cache / "vllm" / "written-at-request-time.py").write_text("poison")

    status, headers = _guarded("/v1/chat/completions", str(gate), engine_serves)
    assert status == 503 and headers[tool.GATE_HEADER] == "closed" and not served
    assert tool.main(node(argv)) == 0 and gate.exists()
    assert _guarded("/v1/chat/completions", str(gate), engine_serves)[0] == 200 and served
    archive = mapping[_opt(argv, "--uri")]
    with tarfile.open(archive) as tar:
        assert not any("written-at-request-time" in n for n in tar.getnames())
    # The next start on a fresh node restores exactly the snapshot...
    fresh = tmp_path / "fresh"
    mapping[_opt(argv, "--dir")] = str(fresh)
    assert tool.main(node(restore_argv)) == 0
    assert (fresh / "vllm" / "torch_compile_cache" / "abc" / "artifact.py").read_text() == "compiled at start"
    assert not (fresh / "vllm" / "written-at-request-time.py").exists()
    # ...and refuses a tampered archive: a cold start (the key file only).
    _rewrite(archive, lambda name, data: b"import os  # poisoned" if name.endswith("artifact.py") else data)
    cold = tmp_path / "cold"
    mapping[_opt(argv, "--dir")] = str(cold)
    assert tool.main(node(restore_argv)) == 0
    assert tool.recorded_key(str(cold)) == key and not (cold / "vllm").exists()


# --- a LeaderWorkerSet group: every node's archive is from before the group serves --------------------


class _Leader:
    """The leader's HTTP side on 127.0.0.1: ``/health`` answers 200, anything else goes through the
    real API guard with the leader's gate file (no key: 401 once open)."""

    def __init__(self, gate):
        import http.server
        import threading

        leader = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                status, headers = (200, {}) if self.path == "/health" else _guarded(self.path, str(leader.gate), key="")
                self.send_response(status)
                for k, v in headers.items():
                    if k != "content-length":
                        self.send_header(k, v)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.gate = gate
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _lws_saves(tmp_path, port):
    """The rendered gb300 leader and worker save argv (the core's, inside the runner), with the mirror,
    the NVMe and the gates under ``tmp_path`` and the leader's port ``port``."""
    from components.k8s import engine_cache as kec

    _, pods = _eks_pods("gb300")
    out = {}
    for role in ("leader", "worker"):
        argv = _core_argv(_container(pods[role], kec.SAVE_CONTAINER)["command"])[2:]  # after python3 SCRIPT
        uri, directory = _opt(argv, "--uri"), _opt(argv, "--dir")
        mapping = {uri: str(tmp_path / "mirror" / uri.rsplit("/", 1)[1]),
                   directory: str(tmp_path / "nvme" / directory.rsplit("/", 1)[1]),
                   kec.GATE_FILE: str(tmp_path / role / "gate" / "open"),
                   _opt(argv, "--wait-url"): _opt(argv, "--wait-url").replace(":8000/", f":{port}/")}
        out[role] = [mapping.get(a, a) for a in argv]
    return out


def _worker_save(argv, tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "LWS_WORKER_INDEX": "1", "LWS_LEADER_ADDRESS": "127.0.0.1"}
    script = REPO_ROOT / "scripts" / "node" / "engine_cache.py"
    return subprocess.run([sys.executable, str(script), *argv], env=env, capture_output=True, text=True, timeout=120)


def test_lws_leader_serves_only_after_its_workers_snapshots_are_saved(tmp_path, monkeypatch):
    """The rendered gb300 pods, run: the leader snapshots, then keeps its gate closed until the
    worker's manifest exists; the worker (its own process, LWS env) waits for the leader's /health,
    snapshots, sees the leader's gate still closed through the real guard, and saves. Both archives
    hold only what the engines wrote at start. The old leader opened its gate right after its own
    snapshot, whatever its workers had saved."""
    import threading

    argv = None
    leader = _Leader(tmp_path / "leader" / "gate" / "open")
    try:
        argv = _lws_saves(tmp_path, leader.port)
        key = _opt(argv["leader"], "--key")
        for index in ("0", "1"):
            _populate(tmp_path / "nvme" / f"{_opt(argv['leader'], '--dir').rsplit('/', 1)[1]}-node{index}",
                      f"{key}-node{index}", f"compiled on node {index}")
        waiting = threading.Event()
        original = tool.manifests_present

        def observed(uris, timeout_seconds, poll_seconds=None):
            waiting.set()
            return original(uris, timeout_seconds, 0.05)

        monkeypatch.setattr(tool, "manifests_present", observed)
        monkeypatch.setenv("LWS_WORKER_INDEX", "0")
        results = []
        thread = threading.Thread(target=lambda: results.append(tool.main(argv["leader"])), daemon=True)
        thread.start()
        assert waiting.wait(60)
        assert not leader.gate.exists()  # snapshot taken, the worker's archive not saved: still closed
        worker = _worker_save(argv["worker"], tmp_path)
        assert worker.returncode == 0, worker.stderr
        thread.join(60)
        assert results == [0] and leader.gate.exists()
        for index in ("0", "1"):
            archive = tmp_path / "mirror" / f"{key}-node{index}.tar"
            assert (tmp_path / "mirror" / f"{key}-node{index}.tar{tool.MANIFEST_SUFFIX}").is_file()
            with tarfile.open(archive) as tar:
                data = tar.extractfile("vllm/torch_compile_cache/abc/artifact.py").read()
            assert data == f"compiled on node {index}".encode()
    finally:
        leader.close()


def test_lws_worker_snapshot_taken_after_the_group_serves_is_not_archived(tmp_path):
    """The leader's gate already open (the group admits requests) when the worker snapshots: the
    worker archives nothing, so no worker archive can hold request-time output. The old worker
    archived whatever its directory held once the leader's /health answered."""
    leader = _Leader(tmp_path / "leader" / "gate" / "open")
    try:
        argv = _lws_saves(tmp_path, leader.port)
        key = _opt(argv["worker"], "--key")
        _populate(tmp_path / "nvme" / f"{_opt(argv['worker'], '--dir').rsplit('/', 1)[1]}-node1", f"{key}-node1")
        leader.gate.parent.mkdir(parents=True)
        leader.gate.write_text("")
        worker = _worker_save(argv["worker"], tmp_path)
        assert worker.returncode == 0, worker.stderr
        assert "gate" in worker.stdout + worker.stderr
        assert not (tmp_path / "mirror" / f"{key}-node1.tar{tool.MANIFEST_SUFFIX}").exists()
        assert not (tmp_path / "mirror" / f"{key}-node1.tar").exists()
    finally:
        leader.close()
