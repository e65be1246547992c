"""Resource options that guard data and capacity, as the engine receives them: the mirror is
retained on destroy (and protected in prod), the file system is protected in prod, GPU node
groups never reset their desired size, and the GPU instance is replaced delete-first."""

from __future__ import annotations

import pytest
from pulumi.runtime import mocks as pulumi_mocks

from components.plan_engine import run_program
from components.spec.config import read_stack_config
from tests.conftest import FIXED_NOW, TEST_SECRETS

_RUNS: dict[str, dict[str, dict]] = {}


def options_for(stack: str) -> dict[str, dict]:
    """Logical name -> the options the engine received for each resource of ``stack``."""
    if stack in _RUNS:
        return _RUNS[stack]
    seen: dict[str, dict] = {}
    original = pulumi_mocks.MockMonitor.RegisterResource

    def recording(self, request):
        seen[request.name] = {
            "type": request.type,
            "protect": request.protect,
            "retain_on_delete": request.retainOnDelete,
            "ignore_changes": list(request.ignoreChanges),
            "delete_before_replace": request.deleteBeforeReplace,
        }
        return original(self, request)

    pulumi_mocks.MockMonitor.RegisterResource = recording
    try:
        run_program(read_stack_config(stack), stack=stack, secrets=TEST_SECRETS, now=FIXED_NOW)
    finally:
        pulumi_mocks.MockMonitor.RegisterResource = original
    _RUNS[stack] = seen
    return seen


MIRROR_GUARDS = ("mirror-bucket", "mirror-ownership", "mirror-public-access-block", "mirror-encryption", "mirror-tls-only", "mirror-lifecycle")


@pytest.mark.parametrize("stack", ["b300", "gb300", "b300-prod"])
def test_mirror_and_its_guards_are_retained_on_destroy(stack):
    opts = options_for(stack)
    prod = stack == "b300-prod"
    for name in MIRROR_GUARDS:
        assert opts[name]["retain_on_delete"] is True, name
        assert opts[name]["protect"] is prod, name
    # The toolkit object is not data: it goes with the stack.
    if "mirror-weight-sync-script" in opts:
        assert not opts["mirror-weight-sync-script"]["retain_on_delete"]


def test_file_system_is_protected_in_prod():
    opts = options_for("b300-prod")
    assert opts["fsx-fs"]["protect"] is True
    assert opts["fsx-mirror-dra"]["protect"] is True
    # Nothing else is protected: `pulumi destroy` removes the rest.
    protected = {n for n, o in opts.items() if o["protect"]}
    assert protected == {*MIRROR_GUARDS, "fsx-fs", "fsx-mirror-dra"}


def test_trial_protects_nothing():
    assert not any(o["protect"] for o in options_for("gb300").values())


@pytest.mark.parametrize("stack", ["gb300", "b300-prod"])
def test_node_groups_keep_the_desired_size_they_are_given(stack):
    opts = options_for(stack)
    for name in ("eks-gpu", "eks-system"):
        assert opts[name]["ignore_changes"] == ["scalingConfig.desiredSize"], name


def test_gpu_instance_is_replaced_delete_first():
    # A capacity block or ODCR holds only the instances paid for.
    assert options_for("b300")["gpu-instance"]["delete_before_replace"] is True
