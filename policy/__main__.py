"""kimi-deploy guardrails as a Pulumi CrossGuard policy pack.

    pulumi preview --policy-pack policy                       # from the repository root
    pulumi preview --policy-pack policy --policy-pack-config policy-config.json   # {"no-public-api-ingress": {"apiPort": 9000}}

The rule logic lives in ``policy/rules.py`` (plain functions, also run by the test suite over
every stack's offline plan); this file only adapts it to ``pulumi_policy``. Every rule runs as a
stack validation so that instances and node groups are judged together with their launch
template (instance type, IMDS options, block devices); each violation names the resource and
carries its URN.
"""

from __future__ import annotations

# Pulumi's policy runtime (pulumi.policy.__main__) runs this pack with runpy.run_path(<pack dir>),
# which puts the pack directory first on sys.path: `import rules` finds policy/rules.py. The rules
# import components.core, so the pack's venv has the project installed (`make policy-venv`:
# pip install --no-deps -e .); no sys.path edits. A venv made from policy/requirements.txt alone
# (what Pulumi makes when policy/venv does not exist) lacks it: one line says what to run.
from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyPack,
    ReportViolation,
    StackValidationArgs,
    StackValidationPolicy,
)

MISSING_PROJECT = (
    "kimi-deploy policy pack: its virtualenv (policy/venv) lacks the kimi-deploy project the rules import "
    "(No module named 'components'): run `make policy-venv` once in the repository root, then the pulumi "
    "command again"
)

try:
    import rules
except ModuleNotFoundError as err:
    if (err.name or "").split(".")[0] != "components":
        raise
    raise SystemExit(MISSING_PROJECT) from None

PACK_NAME = "kimi-deploy-guardrails"
API_PORT_SCHEMA = PolicyConfigSchema(
    properties={"apiPort": {"type": "integer", "default": rules.VLLM_PORT, "minimum": 1, "maximum": 65535}},
)


def _resources(args: StackValidationArgs) -> list[rules.Res]:
    out = []
    for r in args.resources:
        props = r.props
        ids = tuple(str(props.get(k)) for k in ("id", "arn", "bucket", "name") if isinstance(props.get(k), str))
        out.append(
            rules.Res(
                type=r.resource_type,
                name=r.name,
                props=props,
                urn=r.urn,
                dependencies=tuple(d.urn for d in (r.dependencies or [])),
                ids=ids,
            )
        )
    return rules.resolve_launch_templates(out)


def _policy(rule: rules.Rule) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        config = args.get_config() or {}
        # CrossGuard hands secrets to analyzers unwrapped: rules judge values by their shape.
        ctx = rules.RuleContext(secrets_masked=False, api_port=int(config.get("apiPort", rules.VLLM_PORT)))
        for res in _resources(args):
            for message in rule.check(res.type, res.props, res.name, ctx):
                report_violation(message, res.urn or None)

    return StackValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=validate,
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=API_PORT_SCHEMA if rule.name == "no-public-api-ingress" else None,
    )


def _s3_encryption(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    for message in rules.bucket_encryption(_resources(args)):
        report_violation(message, None)


PolicyPack(
    name=PACK_NAME,
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=[
        *(_policy(rule) for rule in rules.RESOURCE_RULES),
        StackValidationPolicy(
            name=rules.STACK_RULE_S3.name,
            description=rules.STACK_RULE_S3.description,
            validate=_s3_encryption,
            enforcement_level=EnforcementLevel.MANDATORY,
        ),
    ],
)
