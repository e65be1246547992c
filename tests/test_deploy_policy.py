"""scripts/ops/deploy_policy.py: the IAM policy for `pulumi up`, derived from the declared types.
Every aws: type and data source any stack declares must be in the table (a new resource type
without IAM actions fails here), every action must be a real IAM action, and the document must
fit one managed policy."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import botocore.session
import pytest

from scripts.ops import deploy_policy as dp
from tests.conftest import FIXED_NOW, STACKS

REPO_ROOT = Path(__file__).resolve().parents[1]
# IAM actions that are not API operation names (Service Authorization Reference: IAM
# "PassRole" is permission-only; S3's IAM names differ from its API operation names).
PERMISSION_ONLY = {
    "iam:PassRole", "s3:ListBucket", "s3:ListBucketVersions", "s3:GetBucketCORS", "s3:GetAccelerateConfiguration",
    "s3:GetLifecycleConfiguration", "s3:PutLifecycleConfiguration", "s3:GetReplicationConfiguration",
    "s3:GetEncryptionConfiguration", "s3:PutEncryptionConfiguration", "s3:GetBucketObjectLockConfiguration",
    "s3:DeleteObjectVersion", "s3:GetBucketPublicAccessBlock", "s3:PutBucketPublicAccessBlock",
}
BOTOCORE_SERVICE = {"ec2": "ec2", "iam": "iam", "s3": "s3", "ssm": "ssm", "kms": "kms", "logs": "logs",
                    "eks": "eks", "fsx": "fsx", "sts": "sts", "scheduler": "scheduler", "autoscaling": "autoscaling"}


@pytest.fixture(scope="module")
def declared():
    return {stack: dp.declared(stack, FIXED_NOW) for stack in STACKS}


@pytest.mark.parametrize("stack", STACKS)
def test_every_declared_aws_type_is_covered(declared, stack):
    types, invokes = declared[stack]
    assert dp.uncovered(types, invokes) == []
    document = dp.policy_document(types, invokes)
    allowed = {a for st in document["Statement"] for a in st["Action"]}
    for token in types:
        if token.startswith("aws:"):
            needed = set(dp.ACTIONS[token]) - {"iam:PassRole"}
            assert needed <= allowed, (token, needed - allowed)
        else:
            assert token.startswith(dp.NO_AWS_PREFIXES), token
    for token in invokes:
        assert set(dp.INVOKE_ACTIONS.get(token, ())) <= allowed, token


@pytest.mark.parametrize("stack", STACKS)
def test_the_policy_is_one_valid_managed_policy(declared, stack):
    types, invokes = declared[stack]
    document = dp.policy_document(types, invokes)
    assert document["Version"] == "2012-10-17"
    assert dp.compact_size(document) <= dp.MANAGED_POLICY_MAX_CHARS
    sids = [st["Sid"] for st in document["Statement"]]
    assert len(sids) == len(set(sids)) and all(sid.isalnum() for sid in sids)
    uses_aws = any(t.startswith("aws:") for t in types)
    assert bool(document["Statement"]) == uses_aws
    if any(t in dp.PASSED_TO for t in types):
        passrole = next(st for st in document["Statement"] if st["Action"] == ["iam:PassRole"])
        assert passrole["Condition"]["StringEquals"]["iam:PassedToService"]
        assert all("iam:PassRole" not in st["Action"] for st in document["Statement"] if st is not passrole)


def test_ec2_and_eks_stacks_get_what_their_resources_need(declared):
    def allowed(stack):
        return {a for st in dp.policy_document(*declared[stack])["Statement"] for a in st["Action"]}

    ec2 = allowed("b300")
    assert {"ec2:RunInstances", "iam:CreateInstanceProfile", "ssm:PutParameter", "sts:GetCallerIdentity"} <= ec2
    assert not any(a.startswith(("eks:", "fsx:")) for a in ec2)
    # The trials' expiry stop: the schedule, and passing its role to the scheduler alone.
    for trial in ("b300", "gb300"):
        document = dp.policy_document(*declared[trial])
        assert {"scheduler:CreateSchedule", "scheduler:DeleteSchedule"} <= allowed(trial)
        passrole = next(st for st in document["Statement"] if st["Action"] == ["iam:PassRole"])
        assert "scheduler.amazonaws.com" in passrole["Condition"]["StringEquals"]["iam:PassedToService"]
    assert not any(a.startswith("scheduler:") for a in allowed("b300-prod"))  # prod does not expire
    eks = allowed("b300-prod")
    assert {"eks:CreateCluster", "eks:CreateNodegroup", "kms:CreateKey"} <= eks
    assert not any(a.startswith("fsx:") for a in eks)  # b300-prod copies from the mirror: no file system
    assert "ec2:RunInstances" not in eks  # node groups launch through EKS's service-linked role


def test_every_action_is_a_real_iam_action():
    session = botocore.session.get_session()
    operations = {}
    actions = {a for v in [*dp.ACTIONS.values(), *dp.INVOKE_ACTIONS.values(), dp.PROVIDER_ACTIONS] for a in v}
    for action in sorted(actions):
        service, name = action.split(":", 1)
        assert service in BOTOCORE_SERVICE, action
        if action in PERMISSION_ONLY:
            continue
        if service not in operations:
            operations[service] = set(session.get_service_model(BOTOCORE_SERVICE[service]).operation_names)
        assert name in operations[service], f"{action} is not an API operation of {service}"


def test_an_uncovered_type_is_an_error_not_a_smaller_policy():
    with pytest.raises(dp.UncoveredTypes, match="aws:lb/loadBalancer:LoadBalancer"):
        dp.policy_document(["aws:lb/loadBalancer:LoadBalancer", "aws:ec2/vpc:Vpc"])


def test_cli_prints_the_policy_and_make_target_runs_it():
    out = subprocess.run([sys.executable, "scripts/ops/deploy_policy.py", "--stack", "b300"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["Version"] == "2012-10-17"
    bad = subprocess.run([sys.executable, "scripts/ops/deploy_policy.py", "--stack", "nope"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "nope" in bad.stderr
    assert "scripts/ops/deploy_policy.py --stack" in (REPO_ROOT / "Makefile").read_text()


# `make iam-policy > file` is the README's way to get the policy: the file must be the JSON alone.
# make echoes a recipe's command line on standard output unless it starts with @; the first run's
# setup progress must not land in the file either.


def _venv_of_this_python(root: Path) -> Path:
    """A set-up venv for make (its .runtime stamp newer than the requirements) whose python is the
    one running the tests: make runs no setup, and the real venv is never touched."""
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    (venv / ".runtime").touch()
    return venv


def _top_level_make_env() -> dict[str, str]:
    """The environment of a user's shell: under `make test` the suite inherits MAKELEVEL and
    MAKEFLAGS, which make a nested make print "Entering directory" on stdout."""
    return {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}


def test_make_iam_policy_writes_pure_json(tmp_path):
    out = subprocess.run(["make", "iam-policy", "STACK=b300", f"VENV={_venv_of_this_python(tmp_path)}"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=600, env=_top_level_make_env())
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["Version"] == "2012-10-17", out.stdout[:200]


def test_make_iam_policy_on_a_first_run_keeps_setup_progress_off_stdout(tmp_path):
    # A first run: no venv yet. PYTHON makes one whose python is the test venv's (-m venv), the
    # installs are skipped (PIP_INSTALL=:), pip check and every progress line still run.
    stub = tmp_path / "python3"
    stub.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then mkdir -p "$3/bin" && '
        f'printf \'#!/bin/sh\\nexec {sys.executable} "$@"\\n\' > "$3/bin/python" && chmod +x "$3/bin/python"; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    stub.chmod(0o755)
    venv = tmp_path / "venv"
    out = subprocess.run(
        ["make", "iam-policy", "STACK=b300", f"VENV={venv}", f"PYTHON={stub}", "PIP_INSTALL=:"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=_top_level_make_env(),
    )
    assert out.returncode == 0, out.stderr
    assert (venv / ".runtime").exists() and "make: installing" in out.stderr and "ready in" in out.stderr
    assert json.loads(out.stdout)["Version"] == "2012-10-17", out.stdout[:300]
