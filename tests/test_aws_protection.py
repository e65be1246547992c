"""Resource options that guard data and capacity, as the engine receives them: the mirror is
retained on destroy (and protected in prod), the file system is protected in prod and created
after its security-group rules, GPU node groups never reset their desired size, the GPU
instance is replaced delete-first, and its launch template keeps the DLAMI it was created with."""

from __future__ import annotations

import pytest
from pulumi.runtime import mocks as pulumi_mocks

from components.core.config import read_stack_config
from components.plan_engine import run_program
from tests.conftest import B300_PROD_FSX, B300_PROD_FSX_STORAGE, FIXED_NOW, TEST_SECRETS

_RUNS: dict[str, dict[str, dict]] = {}


def options_for(stack: str, overrides: dict | None = None) -> dict[str, dict]:
    """Logical name -> the options the engine received for each resource of ``stack``
    (``overrides`` replaces full config keys and disables caching). ``dependencies`` holds the
    logical names of every resource it waits for (explicit ``depends_on`` and inputs')."""
    if stack in _RUNS and overrides is None:
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
            "dependencies": sorted(urn.rsplit("::", 1)[1] for urn in request.dependencies),
        }
        return original(self, request)

    pulumi_mocks.MockMonitor.RegisterResource = recording
    try:
        run_program({**read_stack_config(stack), **(overrides or {})}, stack=stack, secrets=TEST_SECRETS, now=FIXED_NOW)
    finally:
        pulumi_mocks.MockMonitor.RegisterResource = original
    if overrides is None:
        _RUNS[stack] = seen
    return seen


MIRROR_GUARDS = (
    "mirror-bucket",
    "mirror-ownership",
    "mirror-public-access-block",
    "mirror-encryption",
    "mirror-tls-only",
    "mirror-lifecycle",
)


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
    opts = options_for("b300-prod", overrides=B300_PROD_FSX)
    assert opts["fsx-fs"]["protect"] is True
    # The association holds no data and a new revision replaces it: not protected.
    assert opts["fsx-mirror-dra"]["protect"] is False
    # Nothing else is protected: `pulumi destroy` removes the rest.
    protected = {n for n, o in opts.items() if o["protect"]}
    assert protected == {*MIRROR_GUARDS, "fsx-fs"}
    assert {n for n, o in options_for("b300-prod").items() if o["protect"]} == set(MIRROR_GUARDS)


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


def _rule_names(opts: dict[str, dict], prefix: str) -> set[str]:
    rule_types = (
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
        "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",
    )
    return {n for n, o in opts.items() if o["type"] in rule_types and n.startswith(prefix)}


def test_file_system_waits_for_its_security_group_rules():
    # FSx validates the Lustre port rules at creation (InvalidNetworkSettings without them).
    opts = options_for("b300-prod", overrides=B300_PROD_FSX)
    rules = _rule_names(opts, "net-fsx-")
    # Lustre 988 and 1018-1023 from itself and from each client group, plus the egress rule.
    assert {"net-fsx-self-988", "net-fsx-self-1018", "net-fsx-client0-988", "net-fsx-client1-1018", "net-fsx-egress"} <= rules
    assert rules <= set(opts["fsx-fs"]["dependencies"])


def test_file_system_with_efa_waits_for_the_efa_group_rules():
    storage = {**B300_PROD_FSX_STORAGE, "fsx": {**B300_PROD_FSX_STORAGE["fsx"], "efa": True}}
    opts = options_for("b300-prod", overrides={"kimi-deploy:storage": storage})
    deps = set(opts["fsx-fs"]["dependencies"])
    assert {"net-efa-in-self", "net-efa-out-self"} <= deps and _rule_names(opts, "net-fsx-") <= deps


def test_ec2_launch_template_keeps_the_dlami_it_was_created_with():
    # A new DLAMI release must not make a new template version (that replaces the instance).
    assert options_for("b300")["gpu-lt"]["ignore_changes"] == ["imageId"]
    # An explicit compute.amiId is how the operator moves to another AMI: never ignored.
    compute = {"availabilityZone": "us-east-1a", "amiId": "ami-0123456789abcdef0", "amiArchitecture": "x86_64"}
    assert options_for("b300", overrides={"kimi-deploy:compute": compute})["gpu-lt"]["ignore_changes"] == []
    # EKS templates carry no imageId unless compute.amiId is set: nothing to pin there.
    assert options_for("gb300")["eks-gpu-lt"]["ignore_changes"] == []


# --- shipped example values (components/core/examples.py) ------------------------------------


@pytest.mark.parametrize(("stack", "reservation"), [("b300-prod", "cr-0a1b2c3d4e5f60718"), ("gb300", "cr-0123456789abcdef0")])
def test_pulumi_up_refuses_a_shipped_reservation_id_before_any_resource(stack, reservation, monkeypatch):
    """A valid deployer CIDR (the one blocker of old) but the shipped reservation id: `pulumi up`
    stops at spec load with one line naming the key, and the engine is asked for no resource
    (before, it built the VPC, NAT, EKS and the FSx, then failed at the GPU node group)."""
    import json

    from components.core.config import CONFIG_OVERLAY_ENV
    from components.core.errors import ConfigError
    from components.plan_engine import run_program as run
    from tests.conftest import TEST_DEPLOYER_CIDR, TEST_ENGINE_DIGEST, TEST_ENGINE_TAG, TEST_REVISION

    # pinned by digest: a prod stack's tag is its own blocker
    overlay = {"kimi-deploy:vllm": {"image": f"vllm/vllm-openai:{TEST_ENGINE_TAG}@{TEST_ENGINE_DIGEST}"},
               "kimi-deploy:network": {"apiServerPublicCidrs": [TEST_DEPLOYER_CIDR]},
               "kimi-deploy:model": {"revision": TEST_REVISION}}  # b300-prod's example commit: its own blocker
    monkeypatch.setenv(CONFIG_OVERLAY_ENV, json.dumps({"stacks": {stack: overlay}}))
    config = read_stack_config(stack)
    assert config["kimi-deploy:compute"]["capacity"]["reservationId"] == reservation
    registered: list[str] = []
    original = pulumi_mocks.MockMonitor.RegisterResource

    def recording(self, request):
        registered.append(request.type)
        return original(self, request)

    monkeypatch.setattr(pulumi_mocks.MockMonitor, "RegisterResource", recording)
    with pytest.raises(ConfigError) as info:
        run(config, stack=stack, secrets=TEST_SECRETS, now=FIXED_NOW)
    msg = str(info.value)
    assert msg.startswith(f"kimi-deploy:compute.capacity.reservationId: '{reservation}' is the example value shipped in stacks/")
    assert "\n" not in msg
    assert [t for t in registered if t != "pulumi:pulumi:Stack"] == []  # the stack itself, no resource
    # The offline plan still renders the same config, and marks the stack refused.
    rendered = run(config, stack=stack, secrets=TEST_SECRETS, now=FIXED_NOW, allow_blockers=True)
    assert rendered.resources and [str(b) for b in rendered.context.spec.up_blockers] == [msg]


def test_pulumi_up_refuses_the_shipped_example_commit_in_every_phase(monkeypatch):
    from components.core.errors import ConfigError
    from components.plan_engine import run_program as run

    for phase in ("serve", "stage"):
        config = {**read_stack_config("b300"), "kimi-deploy:phase": phase}
        config["kimi-deploy:model"] = {**config["kimi-deploy:model"], "revision": "4f1e2d3c5b6a79880716253443526170819a0b1c"}
        with pytest.raises(ConfigError, match=r"^kimi-deploy:model.revision: '4f1e2d3c5b6a79880716253443526170819a0b1c' "
                                              r"is the example value shipped in stacks/: replace it with the commit"):
            run(config, stack="b300", secrets=TEST_SECRETS, now=FIXED_NOW)
