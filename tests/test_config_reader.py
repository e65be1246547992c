"""One way to read config: the offline plan reads a stack file as the Pulumi engine hands config to
the program (top-level values as strings, ``--path`` objects as JSON) and through the program's
own reader; every unknown name is named with a did-you-mean; every value has its type and format."""

from __future__ import annotations

import ast
import json
import random
import re
import shutil
from pathlib import Path

import pytest
import yaml

from components.core.config import STACKS_DIR, read_stack_config
from components.core.config.reader import (
    AWS_PROVIDER_CONFIG_KEYS,
    KUBERNETES_PROVIDER_CONFIG_KEYS,
    cli_config_strings,
    read_config_strings,
)
from components.core.errors import ConfigError
from components.core.load import load_stack
from components.plan_engine import run_program
from scripts.ops import plan as plan_script  # noqa: E402
from tests.conftest import FIXED_NOW, REPO_ROOT, STACKS, without_overlay_notice

SITE = Path(yaml.__file__).resolve().parents[1]


def _as_cli_stores(value, top: bool):
    """What `pulumi config set KEY VALUE` (top level: a string) and `pulumi config set --path`
    (inside objects: "true"/"false" -> bool, integers without a leading zero -> int, anything
    else a string) write into the stack file. Source: pulumi/pulumi
    sdk/go/common/resource/config/map.go adjustObjectValue."""
    if isinstance(value, dict):
        return {k: _as_cli_stores(v, False) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_cli_stores(v, False) for v in value]
    text = "true" if value is True else "false" if value is False else str(value)
    if top:
        return text
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?[1-9][0-9]*|0", text):
        return int(text)
    return text


def _holds_non_string_scalars(value) -> bool:
    """Whether ``value`` (a stack file's config) holds a number or boolean the CLI would store as
    text (a float anywhere, or any non-string at the top level)."""
    def walk(item, top: bool) -> bool:
        if isinstance(item, dict):
            return any(walk(v, False) for v in item.values())
        if isinstance(item, list):
            return any(walk(v, False) for v in item)
        return isinstance(item, float) or (top and isinstance(item, (bool, int)))

    return any(walk(v, True) for v in value.values())


def _write_stack(tmp_path: Path, name: str, config: dict) -> Path:
    (tmp_path / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    return tmp_path


@pytest.mark.parametrize("name", STACKS)
def test_stack_written_by_pulumi_config_set_gives_the_same_plan(name, tmp_path):
    original = read_stack_config(name)
    rewritten = {k: _as_cli_stores(v, True) for k, v in original.items()}
    text = yaml.safe_dump({"config": rewritten}, sort_keys=False)
    if _holds_non_string_scalars(original):
        assert "'" in text  # numbers and booleans the CLI stores as text are now quoted strings
    stacks_dir = _write_stack(tmp_path, name, rewritten)
    before = plan_script.build_plan_document(name, now=FIXED_NOW)
    after = plan_script.build_plan_document(name, now=FIXED_NOW, stacks_dir=stacks_dir)
    assert json.dumps(after, sort_keys=True) == json.dumps(before, sort_keys=True)


def test_quoted_and_unquoted_top_level_values_are_the_same_string():
    quoted = cli_config_strings({"kimi-deploy:trialTtlHours": "24", "kimi-deploy:protect": "true"})
    bare = cli_config_strings({"kimi-deploy:trialTtlHours": 24, "kimi-deploy:protect": True})
    assert quoted == bare == {"kimi-deploy:trialTtlHours": "24", "kimi-deploy:protect": "true"}
    values, _ = read_config_strings(bare)
    assert values == {"trialTtlHours": 24, "protect": True}


def test_a_string_that_looks_like_a_number_stays_a_string():
    """`pulumi config set kimi-deploy:owner 1234` hands the program "1234": owner is a string key."""
    values, _ = read_config_strings({"kimi-deploy:owner": "1234", "kimi-deploy:target": "b300"})
    assert values == {"owner": "1234", "target": "b300"}


def _program_error(name: str, overrides: dict) -> str:
    with pytest.raises(ConfigError) as info:
        run_program({**read_stack_config(name), **overrides}, stack=name, now=FIXED_NOW)
    return str(info.value)


def _plan_error(name: str, overrides: dict, tmp_path: Path) -> str:
    stacks_dir = _write_stack(tmp_path, name, {**read_stack_config(name), **overrides})
    with pytest.raises(ConfigError) as info:
        load_stack(name, stacks_dir=stacks_dir, now=FIXED_NOW)
    return str(info.value)


@pytest.mark.parametrize(
    "overrides,needle",
    [
        ({"kimi-deploy:trialTtlHours": "a day"}, "kimi-deploy:trialTtlHours: 'a day' is not an integer"),
        ({"kimi-deploy:protect": "yes please"}, "kimi-deploy:protect: 'yes please' is not a boolean"),
        ({"kimi-deploi:trialTtlHours": 24}, "did you mean kimi-deploy?"),
        ({"aws:regoin": "us-east-1"}, "aws:regoin: 'us-east-1' is not a key of the aws provider; did you mean region?"),
        ({"kimi-deploy:trialTTLHours": 24},
         "kimi-deploy:trialTTLHours: '[value not shown]' is not a known key; did you mean trialTtlHours?"),
        # `pulumi config set kimi-deploy:vllm.image X` without --path stores this literal dotted key.
        ({"kimi-deploy:vllm.image": "x"}, "kimi-deploy:vllm.image: '[value not shown]' is not a known key: set a path with "
                                          "`pulumi config set --path kimi-deploy:vllm.image ...`"),
        # Inside a map a quoted number stays a string (JSON), for `pulumi up` as for the plan.
        (
            {"kimi-deploy:compute": {"replicas": "1"}},
            "kimi-deploy:compute.replicas: '1' is not a whole number",
        ),
        (
            {"kimi-deploy:model": {"revision": 1234, "licenseAcknowledged": True}},
            "kimi-deploy:model.revision: 1234 is a number, not a string",
        ),
    ],
)
def test_plan_and_program_reject_the_same_names_and_types(overrides, needle, tmp_path):
    plan_msg = _plan_error("b300", overrides, tmp_path)
    program_msg = _program_error("b300", overrides)
    assert plan_msg == program_msg
    assert needle in plan_msg and "\n" not in plan_msg


def test_a_typo_in_the_namespace_no_longer_gives_the_default_ttl(tmp_path):
    cfg = {k: v for k, v in read_stack_config("b300").items() if k != "kimi-deploy:trialTtlHours"}
    cfg["kimi-deploi:trialTtlHours"] = 24
    stacks_dir = _write_stack(tmp_path, "b300", cfg)
    with pytest.raises(
        ConfigError,
        match=r"^kimi-deploi:trialTtlHours: '24' is in namespace 'kimi-deploi' that nothing reads .*did you mean kimi-deploy\?$",
    ):
        load_stack("b300", stacks_dir=stacks_dir, now=FIXED_NOW)


def test_nested_unknown_keys_get_a_did_you_mean():
    with pytest.raises(ConfigError,
                       match=r"^kimi-deploy:model\.revison: '\[value not shown\]' is not a known key; did you mean revision\?$"):
        read_and_parse({"kimi-deploy:model": {"revison": "main"}})
    with pytest.raises(ConfigError, match=r"kimi-deploy:storage\.mirror\.prefx: .*did you mean prefix\?"):
        read_and_parse({"kimi-deploy:storage": {"mirror": {"prefx": "models"}}})


def read_and_parse(overrides: dict, stack: str = "b300"):
    from components.core.config import namespace_config
    from components.core.load import parse_spec

    full = {**read_stack_config(stack), **overrides}
    ns, secrets = namespace_config(full)
    return parse_spec(ns, stack=stack, now=FIXED_NOW, secrets_set=secrets)


def test_empty_stack_file_says_it_is_empty(tmp_path):
    (tmp_path / "Pulumi.blank.yaml").write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match=r"^--stack: 'blank' file .*Pulumi\.blank\.yaml is empty"):
        read_stack_config("blank", tmp_path)


def test_yaml_errors_give_file_line_column_and_reason(tmp_path):
    (tmp_path / "Pulumi.bad.yaml").write_text("config:\n  kimi-deploy:target: b300\n  kimi-deploy:owner: [ml\n")
    with pytest.raises(ConfigError) as info:
        read_stack_config("bad", tmp_path)
    msg = str(info.value)
    assert re.search(r"Pulumi\.bad\.yaml is not valid YAML: line \d+, column \d+: ", msg), msg
    assert "\n" not in msg
    (tmp_path / "Pulumi.dup.yaml").write_text("config:\n  kimi-deploy:target: b300\n  kimi-deploy:target: gb300\n")
    with pytest.raises(ConfigError, match=r"line 3, column 3: duplicate key 'kimi-deploy:target'"):
        read_stack_config("dup", tmp_path)


@pytest.mark.parametrize("region", ["../../etc/passwd", " ", "US-EAST-1", "us-east-1a"])
@pytest.mark.parametrize("stack", ["gb300", "b300"])
def test_region_format_is_checked_with_or_without_offering_facts(stack, region):
    with pytest.raises(ConfigError, match=r"^aws:region: .* is not an AWS region name"):
        read_and_parse({"aws:region": region}, stack)


def test_region_offerings_are_checked_where_known():
    with pytest.raises(ConfigError, match=r"^aws:region: 'eu-west-1' does not offer p6-b300.48xlarge"):
        compute = {k: v for k, v in read_stack_config("b300")["kimi-deploy:compute"].items() if k != "availabilityZone"}
        read_and_parse({"aws:region": "eu-west-1", "kimi-deploy:compute": compute}, "b300")


@pytest.mark.parametrize(
    "az,needle",
    [(1, "is a number, not a string"), ("1", "is not an availability zone name"), ("us-west-2a", "is not in region us-east-1")],
)
def test_capacity_availability_zone_has_its_format(az, needle):
    cfg = read_stack_config("gb300")
    compute = json.loads(json.dumps(cfg["kimi-deploy:compute"]))
    compute["capacity"]["availabilityZone"] = az
    with pytest.raises(ConfigError, match=r"^kimi-deploy:compute\.capacity\.availabilityZone: ") as info:
        read_and_parse({"kimi-deploy:compute": compute}, "gb300")
    assert needle in str(info.value)


@pytest.mark.parametrize(
    "section,path,value",
    [
        ("model", ("revision",), 1234),
        ("model", ("servedModelName",), 7),
        ("storage", ("mirror", "prefix"), 5),
    ],
)
def test_numbers_where_strings_are_expected_are_errors(section, path, value):
    cfg = json.loads(json.dumps(read_stack_config("b300")[f"kimi-deploy:{section}"]))
    node = cfg
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    key = ".".join((section, *path))
    with pytest.raises(ConfigError, match=rf"^kimi-deploy:{re.escape(key)}: {value} is a number, not a string: quote it"):
        read_and_parse({f"kimi-deploy:{section}": cfg})


def _sdk_config_keys(path: Path, pattern: str) -> set[str]:
    return set(re.findall(pattern, path.read_text()))


def test_provider_key_lists_match_the_installed_sdks():
    aws = _sdk_config_keys(SITE / "pulumi_aws" / "config" / "vars.py", r"__config__\.get\w*\('(\w+)'")
    assert set(AWS_PROVIDER_CONFIG_KEYS) == aws
    props = _sdk_config_keys(SITE / "pulumi_kubernetes" / "provider.py", r'__props__\.__dict__\["(\w+)"\]')
    camel = {p.split("_")[0] + "".join(w.title() for w in p.split("_")[1:]) for p in props}
    assert set(KUBERNETES_PROVIDER_CONFIG_KEYS) == camel


def test_secret_values_are_never_shown_in_name_errors():
    with pytest.raises(ConfigError) as info:
        read_config_strings({"kimi-deploy:hfTokn": "hf_SECRETVALUE0123456789abcdef"}, {"kimi-deploy:hfTokn"})
    assert "SECRETVALUE" not in str(info.value) and "did you mean hfToken?" in str(info.value)


def test_program_reads_config_only_through_the_reader():
    """components/program.py decodes no config value itself (no json.loads of config)."""
    tree = ast.parse((REPO_ROOT / "components" / "program.py").read_text())
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "json.loads" not in calls and "read_config_strings" in calls


def test_stack_files_are_unchanged_by_this_test_module():
    assert {p.name for p in STACKS_DIR.glob("Pulumi.*.yaml")} == {f"Pulumi.{s}.yaml" for s in STACKS}
    assert shutil.which("git") is not None


# --- hard limits at config time -------------------------------------------------------------


def test_oversized_extra_args_is_a_config_error_before_any_resource():
    from components.aws.userdata import USER_DATA_LIMIT_BYTES
    from components.plan_engine import RecordingMocks

    vllm = dict(read_stack_config("b300").get("kimi-deploy:vllm", {}))
    noise = random.Random(7)  # incompressible values: the limit applies to the gzip of an oversized text
    vllm["extraArgs"] = ["--override-generation-config",
                         "{" + ",".join(f'"k{i}": "{noise.randbytes(24).hex()}"' for i in range(1500)) + "}"]
    declared: list[str] = []
    original = RecordingMocks.new_resource

    def spy(self, args):
        declared.append(args.name)
        return original(self, args)

    RecordingMocks.new_resource = spy
    try:
        msg = _program_error("b300", {"kimi-deploy:vllm": vllm})
    finally:
        RecordingMocks.new_resource = original
    assert msg.startswith("kimi-deploy:vllm.extraArgs: ['--override-generation-config', ") and "\n" not in msg
    assert f"bytes gzip-compressed, over EC2's limit of {USER_DATA_LIMIT_BYTES:,} bytes (16 KB raw, before base64)" in msg
    assert declared == []


def test_a_pinned_commit_on_b300_plans_with_gzip_user_data_that_cloud_init_reads_back():
    """Pinning model.revision to a commit (the plan asks for it before staging) made b300's user data
    16,401 bytes, over EC2's 16 KB: over the limit it is sent gzip-compressed, which cloud-init reads."""
    import base64
    import gzip

    from components.aws.userdata import USER_DATA_LIMIT_BYTES
    from tests.conftest import plan_for

    commit = "9d2c7e1f0a3b4c5d6e7f8091a2b3c4d5e6f70812"
    model = {**read_stack_config("b300").get("kimi-deploy:model", {}), "revision": commit}
    run = plan_for("b300", overrides={"kimi-deploy:model": model})
    data = base64.b64decode(run.named("gpu-lt").inputs["userData"])
    assert len(data) <= USER_DATA_LIMIT_BYTES
    text = gzip.decompress(data).decode() if data[:2] == b"\x1f\x8b" else data.decode()
    assert text.startswith("#cloud-config") and commit in text
    shipped = base64.b64decode(plan_for("b300").named("gpu-lt").inputs["userData"])
    assert shipped.startswith(b"#cloud-config")  # under the limit the text stays plain


def test_shipped_ec2_stack_user_data_fits_with_the_longest_bucket_name():
    from components.aws.compute import check_ec2_user_data
    from components.aws.userdata import USER_DATA_LIMIT_BYTES
    from components.core.sizing import compute_sizing
    from components.core.vllm import build_vllm_command

    spec = load_stack("b300", now=FIXED_NOW)
    size = check_ec2_user_data(spec, build_vllm_command(spec, compute_sizing(spec)), compute_sizing(spec), hub_token_set=True)
    assert 4_000 < size <= USER_DATA_LIMIT_BYTES


def test_unknown_top_level_key_of_the_stack_file_gets_a_did_you_mean(tmp_path):
    (tmp_path / "Pulumi.typo.yaml").write_text("confg:\n  kimi-deploy:target: b300\n")
    with pytest.raises(ConfigError, match=r"top-level key 'confg' that Pulumi does not read .*; did you mean config\?$"):
        read_stack_config("typo", tmp_path)
    (tmp_path / "Pulumi.esc.yaml").write_text("environment:\n  - team/gpu\nconfig:\n  kimi-deploy:target: b300\n")
    assert read_stack_config("esc", tmp_path)["kimi-deploy:target"] == "b300"


def test_existing_claim_is_a_kubernetes_name():
    cfg = read_stack_config("mi355x")
    storage = {"kind": "pvc", "existingClaim": "Weights_PVC"}
    with pytest.raises(ConfigError, match=r"^kimi-deploy:storage\.existingClaim: 'Weights_PVC' is not a DNS-1123 subdomain"):
        read_and_parse({"kimi-deploy:storage": {**cfg.get("kimi-deploy:storage", {}), **storage}}, "mi355x")


def test_region_in_our_namespace_points_to_aws_region():
    with pytest.raises(ConfigError, match=r"^kimi-deploy:region: 'us-east-1' is not read: the region is aws:region"):
        read_config_strings({"kimi-deploy:region": "us-east-1"})


def test_provider_default_tags_count_against_the_limit():
    many = {f"team{i}": "x" for i in range(44)}
    with pytest.raises(
        ConfigError, match=r"^aws:defaultTags\.tags: 44 tags plus 7 per-resource tags exceed AWS's 50 tags per resource$"
    ):
        read_config_strings({"aws:defaultTags": json.dumps({"tags": many})})
    with pytest.raises(
        ConfigError,
        match=r"^aws:defaultTags\.tags\.cost-center: 'x{119}\.\.\. \(259 characters\) "
        r"tag value is 257 characters; AWS allows 256$",
    ):
        read_config_strings({"aws:defaultTags": json.dumps({"tags": {"cost-center": "x" * 257}})})
    values, _ = read_config_strings({"aws:defaultTags": json.dumps({"tags": {f"t{i}": "x" for i in range(43)}})})
    assert values == {}


@pytest.mark.parametrize(
    ("key", "value", "set_by"),
    [
        # A past expiry on prod (which has no expires-at of its own) would mark every resource expired.
        ("expires-at", "2020-01-01T00:00:00Z", r"kimi-deploy:expiresAt / kimi-deploy:trialTtlHours"),
        # A retain tag on every resource would keep every expired trial's NAT, volumes and cluster.
        ("kimi-deploy:retain", "true", r"the toolkit on the weight mirror only \(to keep a stack, set kimi-deploy:protect\)"),
        ("kimi-deploy:environment", "trial", r"kimi-deploy:environment"),
        ("kimi-deploy:stack", "other", r"the Pulumi stack name"),
    ],
)
def test_provider_default_tags_cannot_set_the_toolkits_tags(key, value, set_by):
    with pytest.raises(
        ConfigError,
        match=rf"^aws:defaultTags\.tags\.{key}: '{value}' cannot be set through aws:defaultTags: the toolkit owns "
        rf"this tag \(the sweeper and the expiry read it\); it is set by {set_by}",
    ):
        read_config_strings({"aws:defaultTags": json.dumps({"tags": {"cost-center": "ml", key: value}})})
    # A key that only looks alike is the user's own tag.
    values, _ = read_config_strings({"aws:defaultTags": json.dumps({"tags": {f"team:{key}": value}})})
    assert values == {}


# --- random bad stack files: never a traceback, and the same verdict from plan and program --------

_BAD_VALUES = (1234, "1234", True, "true", None, "", [], {}, "../../etc/passwd", " ", 0.5, "x" * 300, {"secure": "AAEA"}, [1, 2])


def _mutations(seed: int, count: int):
    import random

    rng = random.Random(seed)
    base = read_stack_config("b300")
    out = []
    for _ in range(count):
        cfg = json.loads(json.dumps(base, default=str))
        key = rng.choice(sorted(cfg))
        if rng.random() < 0.25:  # a typo in a name
            name = key if not isinstance(cfg[key], dict) or rng.random() < 0.5 else rng.choice(sorted(cfg[key]))
            i = rng.randrange(len(name) - 1)
            typo = name[:i] + name[i + 1] + name[i] + name[i + 2:]
            if name == key:
                cfg[typo] = cfg.pop(key)
            else:
                cfg[key][typo] = cfg[key].pop(name)
        elif isinstance(cfg[key], dict) and cfg[key] and rng.random() < 0.7:
            cfg[key][rng.choice(sorted(cfg[key]))] = rng.choice(_BAD_VALUES)
        else:
            cfg[key] = rng.choice(_BAD_VALUES)
        out.append(cfg)
    return out


def _verdict(fn) -> str:
    try:
        fn()
    except ConfigError as err:
        return f"error: {err}"
    return "ok"


@pytest.mark.parametrize("index,cfg", list(enumerate(_mutations(seed=12, count=30))))
def test_random_bad_stack_files_get_the_same_one_line_verdict_from_plan_and_program(index, cfg, tmp_path):
    stacks_dir = _write_stack(tmp_path, "b300", cfg)
    plan = _verdict(lambda: load_stack("b300", stacks_dir=stacks_dir, now=FIXED_NOW))
    assert "\n" not in plan
    if "is a secret and must be set with" in plan or "is not a secret key" in plan:
        return  # the plan's committed-file rule about secure values; the engine decrypts them
    program = _verdict(lambda: run_program(read_stack_config("b300", stacks_dir), stack="b300", now=FIXED_NOW))
    assert plan == program


def test_the_size_check_renders_the_same_user_data_as_the_program():
    """check_ec2_user_data measures render_ec2_user_data; it must equal what the launch template
    gets (so a field added to one and not the other fails here)."""
    import base64

    from components.aws.compute import render_ec2_user_data
    from tests.conftest import plan_for

    run = plan_for("b300")
    lt = next(r for r in run.resources if r.type == "aws:ec2/launchTemplate:LaunchTemplate")
    actual = base64.b64decode(lt.inputs["userData"]).decode()
    sha = re.search(r"\b[0-9a-f]{64}\b", actual).group(0)
    spec = run.context.spec
    rendered = render_ec2_user_data(spec, run.context.vllm, run.context.sizing, bucket="mirror-bucket-a1b2c3d", tools_sha256=sha,
                                    hub_token_set=spec.hub_token_key in spec.secrets_set, expires=True)
    assert rendered == actual


def test_stack_files_are_read_as_yaml_1_2_like_the_pulumi_cli(tmp_path):
    """go-yaml v3 (the CLI) reads YAML 1.2: `1:12` and `yes` are text there, `017` is 17. PyYAML's
    default (YAML 1.1) would make them 72, True and 15, and the plan would accept what `pulumi up`
    refuses (a fresh-user trial found `trialTtlHours: 1:12` planned as a 72 h expiry)."""
    import yaml as pyyaml

    from components.core.config.stack_file import _UniqueKeyLoader
    from components.core.errors import ConfigError
    from components.core.load import load_stack

    assert pyyaml.safe_load("a: 1:12")["a"] == 72  # the YAML 1.1 reading this guards against
    read = {text: pyyaml.load(f"a: {text}", Loader=_UniqueKeyLoader)["a"] for text in
            ("1:12", "yes", "on", "off", "true", "False", "017", "0o17", "0x1f", "1_000", "0.95", "-3", "1e3")}
    assert read == {"1:12": "1:12", "yes": "yes", "on": "on", "off": "off", "true": True, "False": False,
                    "017": 17, "0o17": 15, "0x1f": 31, "1_000": "1_000", "0.95": 0.95, "-3": -3, "1e3": 1000.0}
    text = (REPO_ROOT / "stacks" / "Pulumi.b300.yaml").read_text()
    assert "kimi-deploy:trialTtlHours:" in text
    bad = "\n".join(
        "  kimi-deploy:trialTtlHours: 1:12" if line.strip().startswith("kimi-deploy:trialTtlHours:") else line
        for line in text.splitlines()
    )
    (tmp_path / "Pulumi.t.yaml").write_text(bad + "\n")
    with pytest.raises(ConfigError, match="trialTtlHours"):
        load_stack("t", stacks_dir=tmp_path, now=FIXED_NOW)


# --- KIMI_DEPLOY_CONFIG_OVERLAY sets each leaf as `pulumi config set --path` would -------------------
# pulumi/pulumi sdk/go/common/resource/config/map.go (Map.Set with path=true): a missing map on the
# way is created, a top-level scalar is replaced by a map, a scalar or list on the way is an error,
# a map of only "secure" is reserved.


def test_a_nested_override_keeps_its_siblings(monkeypatch):
    from components.core.config.stack_file import CONFIG_OVERLAY_ENV

    before = load_stack("b300-prod", now=FIXED_NOW).config.compute.capacity
    assert before.type == "odcr" and before.reservation_id
    monkeypatch.setenv(CONFIG_OVERLAY_ENV, json.dumps({
        "kimi-deploy:compute": {"capacity": {"reservationId": "cr-0fedcba9876543210"}},
        "kimi-deploy:storage": {"mirror": {"prefix": "weights"}},
        "kimi-deploy:vllm": {"imageTag": "nightly-" + "0" * 40},
    }))
    spec = load_stack("b300-prod", now=FIXED_NOW)
    cap = spec.config.compute.capacity
    # The reservation's type and zone stay (a one-level merge dropped them: on-demand in no zone).
    assert (cap.type, cap.reservation_id, cap.availability_zone) == (before.type, "cr-0fedcba9876543210",
                                                                     before.availability_zone)
    assert spec.config.compute.replicas == 2 and spec.config.storage.kind == "nvme"
    assert spec.config.storage.mirror.prefix == "weights" and spec.config.storage.mirror.enabled


def test_overlay_follows_pulumi_config_set_path_rules():
    from components.core.config import StackFileError
    from components.core.config.stack_file import overlay_config

    stack = {"kimi-deploy:owner": "team", "kimi-deploy:compute": {"capacity": {"type": "odcr", "reservationId": "cr-1"},
             "availabilityZone": "us-east-1c"}, "kimi-deploy:vllm": {"extraArgs": ["--a"]},
             "kimi-deploy:hfToken": {"secure": "v1:abc"}}
    merged = overlay_config(stack, {"kimi-deploy:compute": {"capacity": {"type": "capacity-block"}},
                                    "kimi-deploy:owner": {"team": "x"}, "kimi-deploy:storage": {"fsx": {"efa": True}}})
    assert merged["kimi-deploy:compute"] == {"capacity": {"type": "capacity-block", "reservationId": "cr-1"},
                                             "availabilityZone": "us-east-1c"}
    assert merged["kimi-deploy:owner"] == {"team": "x"}  # a top-level scalar is replaced by the map
    assert merged["kimi-deploy:storage"] == {"fsx": {"efa": True}}  # missing maps are created
    assert stack["kimi-deploy:compute"]["capacity"]["type"] == "odcr"  # the input is not modified
    # A list is a leaf: replaced whole, as `pulumi config set --path --json key '[...]'`.
    assert overlay_config(stack, {"kimi-deploy:vllm": {"extraArgs": ["--b"]}})["kimi-deploy:vllm"] == {"extraArgs": ["--b"]}
    for extra, words in (
        ({"kimi-deploy:compute": {"availabilityZone": {"x": 1}}},
         "kimi-deploy:compute.availabilityZone is the text 'us-east-1c' in the stack file, not a map"),
        ({"kimi-deploy:vllm": {"extraArgs": {"x": 1}}}, "kimi-deploy:vllm.extraArgs is a list in the stack file, not a map"),
        ({"kimi-deploy:hfToken": {"x": "y"}}, "kimi-deploy:hfToken is a secret in the stack file"),
        ({"kimi-deploy:storage": {"fsx": {"secure": "x"}}}, "a map holding only 'secure' is reserved"),
    ):
        with pytest.raises(StackFileError) as err:
            overlay_config(stack, extra)
        assert str(err.value).startswith("KIMI_DEPLOY_CONFIG_OVERLAY: ") and words in str(err.value), str(err.value)


def test_an_overlay_error_is_one_line_and_exit_2():
    import subprocess
    import sys

    env = {**__import__("os").environ,
           "KIMI_DEPLOY_CONFIG_OVERLAY": '{"kimi-deploy:compute": {"availabilityZone": {"zone": "us-east-1a"}}}'}
    out = subprocess.run([sys.executable, "scripts/ops/plan.py", "--stack", "b300", "--now", FIXED_NOW.isoformat()],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(
        "error: KIMI_DEPLOY_CONFIG_OVERLAY: 'kimi-deploy:compute.availabilityZone.zone' cannot be set: "
        "kimi-deploy:compute.availabilityZone is the text 'us-east-1a' in the stack file, not a map")


# --- unreadable, non-UTF-8 and out-of-range inputs: one line, exit 2 --------------------------------


def test_a_non_utf8_or_unreadable_stack_file_is_one_line(tmp_path):
    from components.core.config import StackFileError

    (tmp_path / "Pulumi.latin1.yaml").write_bytes(b"config:\n  kimi-deploy:owner: caf\xe9\n")
    with pytest.raises(StackFileError) as err:
        load_stack("latin1", stacks_dir=tmp_path, now=FIXED_NOW)
    assert str(err.value) == (f"--stack: 'latin1' file {tmp_path}/Pulumi.latin1.yaml is not UTF-8 text: byte 0xe9 at "
                              "line 2, column 25 (save it as UTF-8)")
    # A file the OS will not read (as root too: reading /proc/self/mem at offset 0 is an I/O error).
    (tmp_path / "Pulumi.unreadable.yaml").symlink_to("/proc/self/mem")
    with pytest.raises(StackFileError, match=r"file .*Pulumi.unreadable.yaml cannot be read: Input/output error$"):
        load_stack("unreadable", stacks_dir=tmp_path, now=FIXED_NOW)
    # A UTF-8 file with a byte-order mark is read (YAML allows one).
    (tmp_path / "Pulumi.bom.yaml").write_bytes(b"\xef\xbb\xbf" + (REPO_ROOT / "stacks" / "Pulumi.b300.yaml").read_bytes())
    assert load_stack("bom", stacks_dir=tmp_path, now=FIXED_NOW).stack == "bom"


@pytest.fixture
def bad_stack_files():
    """A non-UTF-8 and an unreadable stack file in stacks/ (the commands read only from there)."""
    import uuid

    names = {"latin1": f"t-latin1-{uuid.uuid4().hex[:8]}", "unreadable": f"t-unreadable-{uuid.uuid4().hex[:8]}"}
    latin1, unreadable = (STACKS_DIR / f"Pulumi.{names[k]}.yaml" for k in ("latin1", "unreadable"))
    latin1.write_bytes(b"config:\n  kimi-deploy:owner: caf\xe9\n")
    unreadable.symlink_to("/proc/self/mem")
    try:
        yield names
    finally:
        latin1.unlink()
        unreadable.unlink()


@pytest.mark.parametrize("command", [["scripts/ops/plan.py"], ["scripts/ops/preflight.py"], ["scripts/ops/cost.py"],
                                     ["scripts/ops/deploy_policy.py"]])
def test_commands_refuse_unreadable_inputs_in_one_line(command, bad_stack_files, tmp_path):
    import subprocess
    import sys

    for kind, name in bad_stack_files.items():
        out = without_overlay_notice(subprocess.run([sys.executable, *command, "--stack", name], cwd=REPO_ROOT,
                                                    capture_output=True, text=True, timeout=120))
        assert out.returncode == 2 and out.stderr.count("\n") == 1, (kind, out.stderr)
        assert out.stderr.startswith(f"error: --stack: '{name}' file stacks/Pulumi.{name}.yaml ")
        assert ("is not UTF-8 text: byte 0xe9" if kind == "latin1" else "cannot be read") in out.stderr


@pytest.mark.parametrize("argv", [
    ["scripts/ops/plan.py", "--stack", "b300", "--now", "9999-12-31T23:00:00Z"],
    ["scripts/ops/plan.py", "--stack", "b300", "--now", "1970-01-01T00:00:00Z"],
    ["scripts/ops/plan_diff.py", "--against", "HEAD", "--stack", "b300", "--now", "9999-12-31T23:00:00Z"],
    ["scripts/ops/sweep.py", "--now", "9999-12-31T23:00:00Z"],
    ["scripts/ops/plan.py", "--stack", "b300", "--now", "9999-12-31T23:00:00-05:00"],
])
def test_a_far_off_clock_is_one_line(argv):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"error: --now: '{argv[-1]}' is out of range ("), out.stderr


def test_cost_refuses_a_non_utf8_throughput_file_in_one_line(tmp_path):
    import subprocess
    import sys

    (tmp_path / "t.json").write_bytes(b"\xff\xfe{}")
    out = without_overlay_notice(subprocess.run([sys.executable, "scripts/ops/cost.py", "--stack", "b300", "--throughput-json",
                                                 str(tmp_path / "t.json")],
                                                cwd=REPO_ROOT, capture_output=True, text=True, timeout=120))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "is not UTF-8 text: byte 0xff at line 1, column 1" in out.stderr


def test_load_stack_refuses_an_overlay_that_cannot_be_set(monkeypatch):
    from components.core.config import StackFileError
    from components.core.config.stack_file import CONFIG_OVERLAY_ENV

    monkeypatch.setenv(CONFIG_OVERLAY_ENV, json.dumps({"kimi-deploy:compute": {"capacity": {"type": {"odcr": True}}}}))
    with pytest.raises(StackFileError) as err:
        load_stack("b300-prod", now=FIXED_NOW)
    assert str(err.value) == (
        "KIMI_DEPLOY_CONFIG_OVERLAY: 'kimi-deploy:compute.capacity.type.odcr' cannot be set: kimi-deploy:compute.capacity.type "
        "is the text 'odcr' in the stack file, not a map (`pulumi config set --path` refuses it too)"
    )


@pytest.mark.parametrize("key,value", [("aws:secretKey", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
                                       ("aws:token", "FwoGZXIvYXdzEXAMPLE"),
                                       ("kubernetes:kubeconfig", "apiVersion: v1\nkind: Config\nusers:\n- user: {token: abc}\n")])
def test_a_provider_credential_in_plain_text_is_refused_without_its_value(key, value):
    from components.core.config.reader import read_config_strings

    with pytest.raises(ConfigError) as info:
        read_config_strings({key: value}, frozenset())
    message = str(info.value)
    assert message.startswith(f"{key}: '[plaintext]' is a credential") and "--secret" in message and "\n" not in message
    assert value.splitlines()[0] not in message
    read_config_strings({key: value}, frozenset({key}))  # as a secret it is the provider's business


def test_a_kubeconfig_path_is_not_a_credential():
    from components.core.config.reader import read_config_strings

    read_config_strings({"kubernetes:kubeconfig": "~/.kube/team-config"}, frozenset())


@pytest.mark.parametrize("text,fragment", [
    ('{"stacks": {"gb30": {"kimi-deploy:owner": "x"}}}', "'stacks.gb30' names no stack file in stacks/"),
    ('{"kimi-deploy:owner": "a", "kimi-deploy:owner": "b"}', "'kimi-deploy:owner' is a key given twice"),
])
def test_an_overlay_that_would_apply_silently_wrong_is_one_line(monkeypatch, text, fragment):
    """A misspelt stack in the overlay's "stacks" would set nothing; a key given twice, json keeps the last."""
    from components.core.config.stack_file import config_overlay

    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", text)
    with pytest.raises(ConfigError) as info:
        config_overlay()
    assert str(info.value).startswith("KIMI_DEPLOY_CONFIG_OVERLAY: ") and fragment in str(info.value)
    assert "\n" not in str(info.value)
