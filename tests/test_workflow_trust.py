"""Pull-request workflows never hand an untrusted branch what decrypts a stack's secrets
(issue 34, Why 8: ``preview.yml`` ran pull-request code with a role and a token that do).

A ``pull_request`` workflow runs the branch's own code (its Makefile, scripts, program). Every job
of such a workflow that can reach a secret (any ``secrets.*`` but the read-only ``GITHUB_TOKEN``) or
the secret-reading preview role (``vars.AWS_PREVIEW_ROLE_ARN``) must run in a protected
environment (an approval before it gets them) and only for branches of this repository (a fork's
job is skipped). A job without those gates may assume only the read-only preview role.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO_ROOT / ".github" / "workflows"
# Environments whose protection rules (required reviewers) the docs tell the maintainers to set.
PROTECTED_ENVIRONMENTS = frozenset({"preview"})
SECRET_ROLE_VAR = "vars.AWS_PREVIEW_ROLE_ARN"
READONLY_ROLE_VAR = "vars.AWS_PREVIEW_READONLY_ROLE_ARN"
NOT_A_FORK = "github.event.pull_request.head.repo.full_name == github.repository"
_SECRET_RE = re.compile(r"secrets\.(?!GITHUB_TOKEN\b)[A-Za-z_][A-Za-z0-9_]*")


def _triggers(doc: dict[str, Any]) -> set[str]:
    on = doc.get("on", doc.get(True))  # PyYAML reads a bare `on:` key as True
    if isinstance(on, str):
        return {on}
    return set(on or ())


def _pull_request_workflows() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(WORKFLOWS.glob("*.yml")):
        doc = yaml.safe_load(path.read_text())
        if _triggers(doc) & {"pull_request", "pull_request_target"}:
            out.append((path.name, doc))
    return out


def untrusted_jobs_reaching_secrets(doc: dict[str, Any]) -> list[str]:
    """Jobs of a pull-request workflow that reach a secret or the secret-reading role without
    both gates (a protected environment and no fork), and jobs that assume any role but the
    read-only one without them."""
    bad = []
    for name, job in doc.get("jobs", {}).items():
        text = json.dumps(job)
        env = job.get("environment")
        env_name = env.get("name") if isinstance(env, dict) else env
        gated = env_name in PROTECTED_ENVIRONMENTS and NOT_A_FORK in str(job.get("if", ""))
        reaches = bool(_SECRET_RE.search(text)) or SECRET_ROLE_VAR in text
        roles = [s.get("with", {}).get("role-to-assume", "") for s in job.get("steps", [])
                 if str(s.get("uses", "")).startswith("aws-actions/configure-aws-credentials")]
        other_role = any(READONLY_ROLE_VAR not in r for r in roles)
        if (reaches or other_role) and not gated:
            bad.append(name)
    return bad


@pytest.mark.parametrize(("name", "doc"), _pull_request_workflows(), ids=lambda v: v if isinstance(v, str) else "")
def test_no_pull_request_job_from_a_fork_or_unapproved_branch_reaches_the_secret_reading_role(name, doc):
    assert "pull_request_target" not in _triggers(doc), f"{name}: pull_request_target runs with the base's secrets"
    assert untrusted_jobs_reaching_secrets(doc) == [], name
    # Write scopes are granted per job, never to every job of the workflow.
    top = doc.get("permissions", {})
    assert top in ("read-all", {}) or set(top.values()) <= {"read", "none"}, name


def test_the_preview_workflow_has_a_read_only_job_for_every_branch_and_a_gated_one_for_secrets():
    doc = yaml.safe_load((WORKFLOWS / "preview.yml").read_text())
    readonly, preview = doc["jobs"]["readonly-checks"], doc["jobs"]["preview"]
    assert "if" not in readonly and "environment" not in readonly  # forks too
    assert READONLY_ROLE_VAR in json.dumps(readonly) and not _SECRET_RE.search(json.dumps(readonly))
    assert readonly["permissions"] == {"contents": "read", "id-token": "write"}
    assert preview["environment"] == "preview" and NOT_A_FORK in preview["if"]
    assert SECRET_ROLE_VAR in json.dumps(preview) and "secrets.PULUMI_ACCESS_TOKEN" in json.dumps(preview)


def test_the_check_catches_the_shape_that_leaked():
    """The workflow as it was: one job, repository secret and role, no environment, no fork check."""
    leaky = {"on": {"pull_request": None}, "jobs": {"preview": {
        "env": {"PULUMI_ACCESS_TOKEN": "${{ secrets.PULUMI_ACCESS_TOKEN }}"},
        "steps": [{"uses": "aws-actions/configure-aws-credentials@v4",
                   "with": {"role-to-assume": "${{ vars.AWS_PREVIEW_ROLE_ARN }}"}}]}}}
    assert untrusted_jobs_reaching_secrets(leaky) == ["preview"]
    leaky["jobs"]["preview"]["environment"] = "preview"  # an approval alone still runs a fork's code
    assert untrusted_jobs_reaching_secrets(leaky) == ["preview"]


def test_the_docs_say_how_to_set_up_both_roles_and_the_environment():
    text = (REPO_ROOT / "docs" / "pull-requests.md").read_text()
    assert "AWS_PREVIEW_READONLY_ROLE_ARN" in text and "repo:<owner>/<repo>:pull_request" in text
    assert "repo:<owner>/<repo>:environment:preview" in text and "required reviewers" in text
