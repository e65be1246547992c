"""The configuration reference (docs/configuration.md) is generated from the typed config model
and is current: keys, types, defaults, ranges and descriptions on every run; what a change forces
derived again for the keys users change most (scripts/dev/config_reference.py CHECKED_KEYS), and a
stored row for every key."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from components.core.config import SECRETS, RawConfig
from scripts.dev import config_reference as ref
from tests.conftest import REPO_ROOT

ROWS = {row.key: row for row in ref.config_keys()}


def test_the_page_and_the_stored_derivation_are_current():
    derived, settings = ref.read_forces()
    reason = ref.stale_reason(derived, settings, ref.DOC_PATH.read_text())
    assert reason is None, reason


def test_every_key_of_the_model_has_a_row_and_a_description():
    assert len(ROWS) >= 90 and "storage.fsx.throughputPerTib" in ROWS and "autoscaling.schedule[].timezone" in ROWS
    assert "region" not in ROWS  # it is aws:region, in its own table
    missing = [key for key, row in ROWS.items() if len(row.description) < 15]
    assert missing == [], f"give these fields a docstring in components/core/config/raw.py: {missing}"
    assert all(len(text) > 30 for text in SECRETS.values())
    sections = ref.section_descriptions()
    assert {row.section for row in ROWS.values()} == set(sections)
    assert all(text for name, text in sections.items() if name), sections


def test_every_key_has_a_probe_or_a_reason_and_nothing_else_does():
    keys = set(ref.derivable_keys())
    assert set(ref.PROBES) | set(ref.NOT_DERIVABLE) == keys, "add a probe (or a reason) for each new key"
    assert not set(ref.PROBES) & set(ref.NOT_DERIVABLE)
    assert {p.base for probes in ref.PROBES.values() for p in probes if p.base} <= set(ref.SETTINGS)


def test_a_row_says_type_default_and_what_is_allowed_in_the_model_s_words():
    rules = ref.rules()

    def cells(key):
        row = ROWS[key]
        return ref.type_words(row.info.annotation), ref.default_text(row), ref.allowed_text(row, rules)

    kind, default, allowed = cells("storage.fsx.throughputPerTib")
    assert (kind, default) == ("integer", "`1000`")
    assert allowed.startswith("12 to 1000; per deployment type: ") and "PERSISTENT_2: 125, 250, 500, 1000" in allowed
    assert cells("storage.kind")[:2] == ("one of", "`nvme`") and "`nvme-from-fsx`" in cells("storage.kind")[2]
    assert cells("kubernetes.nodeSelector")[:2] == ("map of string to string", "`{}`")
    assert cells("observability.monitorLabels")[1] == "`{release: kube-prometheus-stack}`"
    assert cells("network.allowedCidrs")[:2] == ("list of strings", "`[]`")
    assert cells("kubernetes.tolerations")[0] == "list of maps"
    assert cells("expiresAt")[0] == "ISO 8601 time" and cells("expiresAt")[1].startswith("derived: a trial: trialTtlHours")
    assert cells("target")[1] == "required" and "b300" in cells("target")[2]
    assert cells("vllm.gpuMemoryUtilization")[2].startswith("more than 0.5 and at most 0.99")
    assert cells("compute.capacity.reservationId")[1] == "none"
    assert cells("autoscaling.queuePerReplica")[1] == "`4`"


def test_the_page_tells_what_changes_force_from_the_derivation():
    page = ref.DOC_PATH.read_text()
    derived, _ = ref.read_forces()
    vpc = {c["stack"]: c["forces"] for c in derived["network.vpcCidr"]}
    assert "aws:ec2/vpc:Vpc net-vpc" in vpc["b300"]["replaces"]  # a new address range is a new VPC
    assert "mi355x" not in vpc  # an existing cluster has no VPC of ours: the key is refused there
    # What pulumi up leaves alone is not a change (the trial's expiry is fixed at its first up).
    assert all(c["forces"] == {} for c in derived["trialTtlHours"])
    [line] = [ln for ln in page.splitlines() if ln.startswith("| `network.vpcCidr` |")]
    assert "`10.50.0.0/16`: b300: **replaces** `Subnet net-private-gpu`" in line and "mi355x" not in line
    assert "read on aws-ec2, aws-eks (config/platform_keys.py)" in line
    assert len(ref.replacing_keys(derived)) >= 20


@pytest.fixture(scope="module")
def deriver():
    """One ``Deriver`` for the module: the unchanged renders of the stacks are made once."""
    return ref.Deriver()


@pytest.mark.parametrize("key", [k for k in ref.CHECKED_KEYS if k in ref.derivable_keys()])
def test_what_a_change_of_a_much_changed_key_forces_is_derived_again(key, deriver):
    derived, _ = ref.read_forces()
    fresh, _ = ref.derive([key], deriver=deriver)
    assert fresh[key] == derived[key], f"{key}: the stored derivation is stale (run {ref.COMMAND} --derive {key})"
    # The page reads the same from a fresh derivation as from the stored one (key order aside).
    assert ref.forces_text(key, fresh[key]) == ref.forces_text(key, derived[key])


def _check(monkeypatch, tmp_path, page=None, forces=None):
    doc, data = tmp_path / "configuration.md", tmp_path / "configuration-forces.json"
    doc.write_text(page if page is not None else ref.DOC_PATH.read_text())
    data.write_text(forces if forces is not None else ref.FORCES_PATH.read_text())
    monkeypatch.setattr(ref, "DOC_PATH", doc)
    monkeypatch.setattr(ref, "FORCES_PATH", data)
    return ref.main(["--check"])


def test_check_fails_on_a_stale_page_or_derivation_with_one_line(monkeypatch, tmp_path, capsys):
    assert _check(monkeypatch, tmp_path) == 0
    page = ref.DOC_PATH.read_text()
    assert _check(monkeypatch, tmp_path, page=page.replace("| integer | `1000` |", "| integer | `500` |")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "configuration.md is stale (run python scripts/dev/config_reference.py)" in err
    data = json.loads(ref.FORCES_PATH.read_text())
    del data["keys"]["vllm.port"]
    assert _check(monkeypatch, tmp_path, forces=json.dumps(data)) == 1
    assert "has no row for vllm.port (run python scripts/dev/config_reference.py --derive vllm.port)" in capsys.readouterr().err


def test_check_fails_when_the_model_changes(monkeypatch, tmp_path, capsys):
    info = RawConfig.model_fields["owner"]
    monkeypatch.setattr(info, "description", "Someone else.")
    assert _check(monkeypatch, tmp_path) == 1
    assert "stale" in capsys.readouterr().err


def test_help_and_usage_errors():
    run = subprocess.run([sys.executable, "scripts/dev/config_reference.py", "--help"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and "--check" in run.stdout and "--derive" in run.stdout
    run = subprocess.run([sys.executable, "scripts/dev/config_reference.py", "--derive", "vllm.prot"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.startswith("error: --derive: vllm.prot is not a key")
    assert "Traceback" not in run.stderr


def test_the_readme_points_to_the_reference():
    """The front page links the generated reference and holds no hand-kept table of keys."""
    readme = (REPO_ROOT / "README.md").read_text()
    assert "(docs/configuration.md)" in readme and "| key |" not in readme
