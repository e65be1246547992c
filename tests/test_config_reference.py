"""The configuration reference (docs/configuration.md) is generated from the typed config model
and is current: keys, types, defaults, ranges and descriptions on every run; what a change forces
derived again for the keys users change most (scripts/dev/config_reference.py CHECKED_KEYS), and a
stored row for every key."""

from __future__ import annotations

import copy
import json
import re
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
    block = _block(page, "network.vpcCidr")
    [forces] = [ln for ln in block.split("\n- ") if ln.startswith("**a change forces:**")]
    assert "`10.50.0.0/16`: b300: **replaces** `Subnet net-private-gpu`" in forces and "mi355x" not in forces
    assert "- **applies to:** read on aws-ec2, aws-eks (config/platform_keys.py)" in block
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


# --- the page in a terminal's width, and `kimi-deploy config explain KEY` from the same source --------


def _block(page: str, key: str) -> str:
    """The page's block of ``key``, its lines unwrapped (one line per item)."""
    start = page.index(f"\n### `{key}`\n")
    end = page.find("\n### ", start + 1)
    return re.sub(r"\n {2,}(?!- )", " ", page[start:end if end > 0 else None]).strip()


def _explain(capsys, *argv):
    from scripts import cli

    code = cli.main(["config", "explain", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_reference_reads_in_a_terminal():
    """Narrow tables and a block per key: the widest line was 1,217 characters (98 of 317 over 300)."""
    lines = ref.DOC_PATH.read_text().splitlines()
    wide = [ln for ln in lines if len(ln) > 120]
    assert max(map(len, lines)) <= 200 and len(wide) <= 10, wide
    assert all(ln.startswith(("- **example:**", "| `")) for ln in wide), wide
    assert "| key | type | default | summary |" in lines and all(f"### `{key}`" in lines for key in ROWS)


def test_config_explain_prints_the_key_s_block_from_the_model_the_stacks_and_the_derivation(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    code, out, err = _explain(capsys, "kimi-deploy:storage.fsx.throughputPerTib")
    assert code == 0 and err == ""
    text = " ".join(out.split())
    assert out.startswith("storage.fsx.throughputPerTib (kimi-deploy:storage.fsx)".replace(" (", "  ("))
    for words in ("type integer", "default 1000", "allowed 12 to 1000; per deployment type:",
                  "PERSISTENT_2: 125, 250, 500, 1000", "applies to read on aws-eks with storage.kind fsx or nvme-from-fsx",
                  "b300: 1000 (default); not read on aws-ec2", "mi355x: 1000 (default); not read on kubernetes",
                  "a change forces 500 in setting 'FSx': b300-prod: disrupts LustreFileSystem fsx-fs",
                  "source components/core/config/raw.py (FsxConfig.throughput_per_tib)",
                  "example pulumi config set --path kimi-deploy:storage.fsx.throughputPerTib 500"):
        assert words in text, words
    assert max(len(line) for line in out.splitlines()) <= 100
    # The page's block says the same (with the page's marks).
    block = _block(ref.DOC_PATH.read_text(), "storage.fsx.throughputPerTib")
    assert "- **default:** `1000`" in block and "  - mi355x: `1000` (default); not read on kubernetes" in block
    # A value the stack file sets is named as the file's.
    code, out, _ = _explain(capsys, "network.allowedCidrs")
    assert "b300: [10.0.0.0/8] (stack file)" in out and "mi355x: [] (default); not read on kubernetes" in out


@pytest.mark.parametrize("typed,key", [("autoscaling.schedule[0].start", "autoscaling.schedule[].start"),
                                       ("autoscaling.schedule.start", "autoscaling.schedule[].start"),
                                       ("VLLM.PORT", "vllm.port"), ("region", "aws:region"), ("hfToken", "hfToken")])
def test_config_explain_takes_a_key_as_users_write_it(capsys, typed, key):
    code, out, _ = _explain(capsys, typed)
    assert code == 0 and out.startswith(f"{key}  (")


def test_config_explain_of_an_unknown_key_is_one_line_with_the_nearest(capsys):
    code, out, err = _explain(capsys, "vllm.prot")
    assert code == 2 and out == ""
    assert err == "error: config explain: 'vllm.prot' is not a config key or section; did you mean vllm.port?\n"


def test_config_explain_without_a_key_lists_every_key_by_section(capsys):
    code, out, _ = _explain(capsys)
    assert code == 0
    listed = re.findall(r"^  (\S+)", out, re.M)
    assert set(ROWS) | set(SECRETS) | {"aws:region"} <= set(listed)
    assert out.index("kimi-deploy:storage.fsx: FSx for Lustre settings.") < out.index("  storage.fsx.throughputPerTib")
    code, section, _ = _explain(capsys, "storage.fsx")
    assert code == 0 and section.startswith("kimi-deploy:storage.fsx:") and "  vllm.port" not in section


def _set_path(config: dict, path: str, text: str, as_type: str | None) -> None:
    """``pulumi config set --path PATH TEXT [--type T]`` on a stack's ``config:`` map, as the CLI
    stores it (pulumi/pulumi sdk/go/common/resource/config/map.go adjustObjectValue: "true"/"false"
    -> booleans, integers without a leading zero -> numbers, anything else text; --type converts)."""
    if as_type == "float":
        value: object = float(text)
    elif text in ("true", "false"):
        value = text == "true"
    elif re.fullmatch(r"-?[1-9][0-9]*|0", text):
        value = int(text)
    else:
        value = text
    namespace, _, rest = path.partition(":")
    parts = [m.group(1) or m.group(2) or int(m.group(3))
             for m in re.finditer(r'\.?([A-Za-z_][A-Za-z0-9_]*)|\["([^"]+)"\]|\[(\d+)\]', rest)]
    node = config.setdefault(f"{namespace}:{parts[0]}", {})
    for part, following in zip(parts[1:-1], parts[2:], strict=True):
        empty: object = [] if isinstance(following, int) else {}
        if isinstance(part, int):
            while len(node) <= part:
                node.append(copy.deepcopy(empty))
            node = node[part]
        else:
            node = node.setdefault(part, empty)
    if isinstance(parts[-1], int):
        node.append(value)
    else:
        node[parts[-1]] = value


@pytest.mark.parametrize("key,stack", [("vllm.gpuMemoryUtilization", "b300"), ("vllm.port", "b300"),
                                       ("kubernetes.nodeSelector", "mi355x"), ("network.allowedCidrs", "b300"),
                                       ("storage.readGBps", "b300")])
def test_the_example_line_sets_a_value_the_config_accepts(key, stack):
    """Each example, stored as `pulumi config set` stores it (a decimal as text under --path), is accepted."""
    import shlex

    from components.core.config import namespace_config, read_stack_config
    from components.core.load import parse_spec
    from tests.conftest import FIXED_NOW

    configs = ref.stack_configs()
    for line in ref.set_commands(key, ref.example_value(key, configs)):
        words = shlex.split(line)
        assert words[:4] == ["pulumi", "config", "set", "--path"], line
        as_type = words[words.index("--type") + 1] if "--type" in words else None
        full = read_stack_config(stack)
        _set_path(full, words[4], words[5], as_type)
        values, secrets = namespace_config(full)
        parse_spec(values, stack=stack, now=FIXED_NOW, secrets_set=secrets)
        assert as_type is None, line
