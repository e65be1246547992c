"""Mirror credentials on the ``kubernetes`` platform (issue 28 item 4): the pods that publish to or
read an existing S3 mirror (the publish Job, every vLLM pod's node-local copy) get AWS credentials
and a region from config, a Secret through secretKeyRef or the cluster's workload identity; a
mirror without them is a one-line config error. Manifests validate against the Kubernetes schema."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from components.core.config import namespace_config, read_stack_config
from components.core.config.kubernetes import IRSA_ROLE_ANNOTATION
from components.core.errors import ConfigError
from components.core.load import parse_spec
from components.core.naming import MIRROR_PUBLISH_SERVICE_ACCOUNT, WEIGHT_SYNC_SERVICE_ACCOUNT
from components.plan_engine import run_program
from tests.conftest import FIXED_NOW, TEST_SECRETS
from tests.test_config import reject
from tests.test_k8s_schemas import validate_core
from tests.test_k8s_workloads import k8s_objects, manifest, of_kind, vllm_pods

MIRROR = {"enabled": True, "create": False, "bucketName": "team-weight-mirror", "region": "eu-west-1"}
ROLE_ARN = "arn:aws:iam::123456789012:role/kimi-mirror"
SECRET = {"secret": {"name": "mirror-keys", "sessionTokenKey": "token"}}
IRSA = {"serviceAccountAnnotations": {IRSA_ROLE_ANNOTATION: ROLE_ARN}}
NAMED = {"serviceAccountName": "team-mirror-reader"}


def ns_config(stack: str = "mi355x", mirror: dict | None = MIRROR, creds: dict | None = SECRET) -> dict[str, Any]:
    ns, _ = namespace_config(read_stack_config(stack))
    ns = copy.deepcopy(ns)
    if mirror is not None:
        ns["storage"] = {**ns["storage"], "mirror": mirror}
    if creds is not None:
        ns["kubernetes"] = {**ns["kubernetes"], "mirrorCredentials": creds}
    return ns


def run(creds: dict, phase: str | None = None):
    config = dict(read_stack_config("mi355x"))
    config["kimi-deploy:storage"] = {**config["kimi-deploy:storage"], "mirror": MIRROR}
    config["kimi-deploy:kubernetes"] = {**config["kimi-deploy:kubernetes"], "mirrorCredentials": creds}
    if phase:
        config["kimi-deploy:phase"] = phase
    return run_program(config, stack="mi355x", secrets=TEST_SECRETS, now=FIXED_NOW)


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def mirror_containers(r) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(pod service account, pod spec, container) of every container that touches the mirror:
    the publish Job's and the vLLM pods' node-local copy."""
    out = []
    for job in of_kind(r, "Job"):
        pod = job["spec"]["template"]["spec"]
        out += [(pod["serviceAccountName"], pod, c) for c in pod["containers"]]
    for deployment in of_kind(r, "Deployment"):  # mi355x: one node per copy
        pod = deployment["spec"]["template"]["spec"]
        out += [(pod["serviceAccountName"], pod, c) for c in pod["initContainers"] if c["name"] == "weight-sync"]
    return out


# -- config ----------------------------------------------------------------------------------------------


def test_an_existing_mirror_without_credentials_is_a_one_line_error_naming_the_keys():
    message = reject(ns_config(creds=None), "kubernetes.mirrorCredentials", "s3://team-weight-mirror", "secret",
                     "serviceAccountAnnotations", IRSA_ROLE_ANNOTATION, "serviceAccountName")
    assert "(unset)" in message


def test_an_existing_mirror_needs_its_region():
    reject(ns_config(mirror={k: v for k, v in MIRROR.items() if k != "region"}), "storage.mirror.region",
           "s3://team-weight-mirror", "e.g. us-east-1")
    reject(ns_config(mirror={**MIRROR, "region": "Frankfurt"}), "storage.mirror.region", "not an AWS region")


@pytest.mark.parametrize("creds, key, fragment", [
    ({**SECRET, **IRSA}, "kubernetes.mirrorCredentials", "exactly one of"),
    ({}, "kubernetes.mirrorCredentials", "exactly one of"),
    ({"secret": {"name": "Mirror_Keys"}}, "kubernetes.mirrorCredentials.secret.name", "Secret name"),
    ({"secret": {"name": "k", "accessKeyIdKey": "a key"}}, "kubernetes.mirrorCredentials.secret.accessKeyIdKey", "Secret key"),
    ({"serviceAccountAnnotations": {IRSA_ROLE_ANNOTATION: "kimi-mirror"}},
     f"kubernetes.mirrorCredentials.serviceAccountAnnotations.{IRSA_ROLE_ANNOTATION}", "IAM role ARN"),
    ({"serviceAccountName": "Reader"}, "kubernetes.mirrorCredentials.serviceAccountName", "ServiceAccount name"),
])
def test_malformed_credentials_are_refused(creds, key, fragment):
    reject(ns_config(creds=creds), key, fragment)


def test_credentials_off_the_kubernetes_platform_or_without_a_mirror_are_refused():
    reject(ns_config("gb300", mirror=None), "kubernetes.mirrorCredentials.secret.name", "is read only on kubernetes",
           "not aws-eks", "IAM grants the mirror")
    reject(ns_config("gb300", mirror={"enabled": True, "region": "us-east-1"}, creds=None), "storage.mirror.region",
           "aws:region")
    reject(ns_config(mirror=None), "kubernetes.mirrorCredentials", "does not use")


@pytest.mark.parametrize("creds", [SECRET, IRSA, NAMED])
def test_each_way_to_give_credentials_is_accepted(creds):
    spec = parse_spec(ns_config(creds=creds), stack="t", now=FIXED_NOW)
    assert spec.config.kubernetes.mirror_credentials is not None and spec.config.storage.mirror.region == "eu-west-1"


# -- manifests ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", [None, "stage"])
def test_a_secret_reaches_the_mirror_pods_only_through_secret_key_ref(phase):
    r = run(SECRET, phase)
    found = mirror_containers(r)
    assert found, "no container touches the mirror"
    if phase == "stage":
        assert [c["name"] for _, _, c in found] == ["weight-sync"] and of_kind(r, "Job")
    for _, _, container in found:
        env = env_of(container)
        assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "mirror-keys", "key": "AWS_ACCESS_KEY_ID"}}
        assert env["AWS_SECRET_ACCESS_KEY"] == {"secretKeyRef": {"name": "mirror-keys", "key": "AWS_SECRET_ACCESS_KEY"}}
        assert env["AWS_SESSION_TOKEN"] == {"secretKeyRef": {"name": "mirror-keys", "key": "token"}}
        assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "eu-west-1"
    # nothing else carries them: the vLLM container never sees the mirror's keys
    for pod in vllm_pods(r).values() if phase is None else []:
        vllm = next(c for c in pod["spec"]["containers"] if c["name"] == "vllm")
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(env_of(vllm))
    for obj in k8s_objects(r):
        validate_core(manifest(obj)) if manifest(obj)["kind"] in {"Job", "Deployment", "ServiceAccount"} else None


def test_workload_identity_annotates_the_service_accounts_the_mirror_pods_run_as():
    r = run(IRSA)
    accounts = {a["metadata"]["name"]: a for a in of_kind(r, "ServiceAccount")}
    for name in (WEIGHT_SYNC_SERVICE_ACCOUNT, MIRROR_PUBLISH_SERVICE_ACCOUNT):
        assert accounts[name]["metadata"]["annotations"][IRSA_ROLE_ANNOTATION] == ROLE_ARN
        validate_core(accounts[name])
    assert "annotations" not in accounts["kimi-vllm"]["metadata"] or IRSA_ROLE_ANNOTATION not in accounts["kimi-vllm"][
        "metadata"]["annotations"]
    for account, _, container in mirror_containers(r):
        assert account in (WEIGHT_SYNC_SERVICE_ACCOUNT, MIRROR_PUBLISH_SERVICE_ACCOUNT)
        env = env_of(container)
        assert "AWS_ACCESS_KEY_ID" not in env and env["AWS_REGION"] == "eu-west-1"


def test_a_named_service_account_runs_every_pod_that_touches_the_mirror():
    r = run(NAMED)
    found = mirror_containers(r)
    assert {account for account, _, _ in found} == {"team-mirror-reader"}
    for _, pod, _ in found:
        assert pod["automountServiceAccountToken"] is False  # the identity webhooks project their own token


def test_without_a_mirror_nothing_changes():
    r = run_program(read_stack_config("mi355x"), stack="mi355x", secrets=TEST_SECRETS, now=FIXED_NOW)
    for pod in vllm_pods(r).values():
        copy_env = env_of(pod["spec"]["initContainers"][0])
        assert not {"AWS_REGION", "AWS_ACCESS_KEY_ID"} & set(copy_env)
    with pytest.raises(ConfigError):
        parse_spec(ns_config(mirror=None), stack="t", now=FIXED_NOW)
