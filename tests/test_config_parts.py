"""Config in parts: the recorded corpus of inputs keeps every message byte for byte
(tests/config_corpus.py builds tests/fixtures/config_errors.json), and each section's checks
can be called on their own."""

from __future__ import annotations

import json

import pytest

from tests.config_corpus import FIXTURE, OVERLAY_ENV, run_case

CORPUS = json.loads(FIXTURE.read_text())


def test_corpus_is_large_and_mostly_errors():
    cases = CORPUS["cases"]
    errors = [c for c in cases if "error" in c["expected"]]
    assert len(cases) > 900 and len(errors) > 500
    assert {c["kind"] for c in cases} == {"parse", "stack"}
    # Every section of the config has at least one recorded rejection.
    keys = {e["expected"]["error"].split(":", 2)[2 if e["expected"]["error"].startswith("ConfigError: kimi-deploy") else 1]
            .split(".")[0].split(":")[0].strip() for e in errors}
    for section in ("compute", "network", "storage", "model", "vllm", "kubernetes", "autoscaling", "observability",
                    "expiresAt", "trialTtlHours", "owner", "target", "platform", "environment", "timeToReady"):
        assert section in keys, section


def test_every_recorded_outcome_is_unchanged(monkeypatch):
    monkeypatch.delenv(OVERLAY_ENV, raising=False)
    changed = []
    for i, case in enumerate(CORPUS["cases"]):
        got = run_case(case, CORPUS["bases"])
        if got != case["expected"]:
            changed.append(f"case {i} ({case.get('key') or case['kind']}):\n  was {case['expected']}\n  now {got}")
    assert not changed, f"{len(changed)} of {len(CORPUS['cases'])} outcomes changed:\n" + "\n".join(changed[:20])


def test_the_replay_can_fail(monkeypatch):
    """A changed message is seen: the replay compares the whole line."""
    monkeypatch.delenv(OVERLAY_ENV, raising=False)
    case = next(c for c in CORPUS["cases"] if "error" in c["expected"] and c["kind"] == "parse")
    got = run_case(case, CORPUS["bases"])
    assert got == case["expected"]
    assert {"error": got["error"] + " "} != case["expected"]


@pytest.mark.parametrize("stack", sorted(CORPUS["bases"]))
def test_bases_are_stack_files_as_recorded(stack):
    """The bases are a snapshot: a stack file may change later without moving the corpus."""
    assert CORPUS["bases"][stack]["owner"]
