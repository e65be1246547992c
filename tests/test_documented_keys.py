"""Keys that a document names are keys a program writes: each pair is read on both sides.

The pairs (a document or reader -> the writer it depends on):
- the completion marker ``.weights-complete.json``: the plan's example-value warning
  (``components/core/examples.py``), the stack files' comments and the README's command that
  reads the resolved commit -> ``scripts/node/weight_sync`` (``destinations.marker_document``), run
  for real here;
- the mirror's ``manifest.json``: preflight's ``mirror`` check and the README's ``checksums`` ->
  ``weight_sync`` publishing to S3 (moto on 127.0.0.1);
- stack outputs: the README's ``pulumi stack output X`` and "``X`` output" -> the program's
  exports (the plans' outputs);
- the cost report: the README's ``--json`` keys -> ``scripts/ops/cost.py --json``;
- the plan document: the README's list of its JSON keys -> ``scripts/ops/plan.py`` ``build_plan_document``;
- tags: the README's stack tags and the mirror's ``kimi-deploy:role``/``retain`` -> the resources' tags.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid

import pytest

import scripts.node.weight_sync as ws
from components.core.config import STACKS_DIR
from components.core.examples import SHIPPED_EXAMPLE_VALUES
from components.core.load import load_stack
from components.core.weights import MANIFEST_NAME, MARKER_NAME
from tests.conftest import FIXED_NOW, REPO_ROOT, STACKS, plan_for
from tests.sync_fixtures import checkpoint_files, write_tree
from tests.user_docs import user_docs_text

README = user_docs_text()  # README.md and docs/*.md: a fact may live on its topic's page
_MARKER_KEY_IN_TEXT = re.compile(r"\(`?(\w+)`? in " + re.escape(MARKER_NAME) + r"\)")


def _marker_keys_named() -> dict[str, set[str]]:
    """Where a document names a key of the marker -> the keys it names."""
    named: dict[str, set[str]] = {}
    for examples in SHIPPED_EXAMPLE_VALUES.values():
        for text in examples.values():
            for match in _MARKER_KEY_IN_TEXT.finditer(text):
                named.setdefault("components/core/examples.py", set()).add(match.group(1))
    for stack in STACKS:  # the plan prints the example values as blockers (of the stacks as shipped)
        spec = load_stack(stack, now=FIXED_NOW)
        for warning in (*spec.warnings, *map(str, spec.blockers)):
            for match in _MARKER_KEY_IN_TEXT.finditer(warning):
                named.setdefault(f"plan of {stack}", set()).add(match.group(1))
    for path in sorted(STACKS_DIR.glob("Pulumi.*.yaml")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if MARKER_NAME in line and "#" in line:
                block = [line.split("#", 1)[1]]
                block += [ln for ln in lines[i + 1:i + 4] if ln.strip().startswith("#")]
                for match in re.finditer(r"`(\w+)`", " ".join(block)):
                    named.setdefault(path.name, set()).add(match.group(1))
    for line in README.splitlines():
        if MARKER_NAME in line:
            for match in re.finditer(r'\["(\w+)"\]', line):
                named.setdefault("README.md", set()).add(match.group(1))
    return named


def test_the_marker_keys_documents_name_are_the_ones_the_sync_writes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KIMI_DEPLOY_CONFIG_OVERLAY", "")  # the stacks as shipped, example values in
    files = checkpoint_files()
    write_tree(str(tmp_path / "src"), files)
    assert ws.main(["--source", f"file://{tmp_path / 'src'}", "--dest", str(tmp_path / "dst"), "--quiet"]) == 0, \
        capsys.readouterr().err
    written = set(json.loads((tmp_path / "dst" / MARKER_NAME).read_text()))
    named = _marker_keys_named()
    # Every kind of document is found (the regexes above still read them).
    assert {"components/core/examples.py", "plan of b300-prod", "Pulumi.b300-prod.yaml", "README.md"} <= set(named), named
    wrong = {where: sorted(keys - written) for where, keys in named.items() if keys - written}
    assert wrong == {}, f"keys the sync never writes (it writes {sorted(written)})"


@pytest.fixture
def mirror(sync_s3, tmp_path, capsys):
    """A mirror published by the real sync to moto: (bucket, spec of b300)."""
    spec = load_stack("b300", now=FIXED_NOW)
    from components.core.weights import mirror_key_prefix

    files = checkpoint_files(seed=3)
    write_tree(str(tmp_path / "src"), files)
    bucket = "docs-" + uuid.uuid4().hex[:12]
    sync_s3.create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/{mirror_key_prefix(spec)}"
    assert ws.main(["--source", f"file://{tmp_path / 'src'}", "--dest", uri, "--quiet"]) == 0, capsys.readouterr().err
    return bucket, spec, files


def test_the_manifest_preflight_reads_is_the_one_the_sync_publishes(mirror, sync_s3):
    from components.core.weights import mirror_key_prefix
    from scripts.ops.preflight import AwsClients, check_mirror

    bucket, spec, files = mirror
    check = check_mirror(spec, AwsClients(spec.region), bucket)
    assert check.status in ("pass", "warn") and f"{len(files)} files" in check.reason and "all present" in check.reason
    assert "no .weights-complete.json" not in check.reason
    # The README names the manifest's per-file `checksums`: the publish wrote them.
    [named] = re.findall(r"`manifest\.json` \(`(\w+)`", README)
    manifest = json.loads(sync_s3.get_object(Bucket=bucket, Key=f"{mirror_key_prefix(spec)}/{MANIFEST_NAME}")["Body"].read())
    assert all(named in entry for entry in manifest["files"]), named


def test_stack_outputs_the_readme_names_are_exported():
    named = set(re.findall(r"pulumi stack output (\w+)", README))
    named |= set(re.findall(r"`(\w+)` output\b", README)) | set(re.findall(r"`(\w+)` \(stack output\)", README))
    named |= set(re.findall(r"<(\w+) output>", README))
    exported = {name for stack in STACKS for name in plan_for(stack).outputs}
    # A stage exports what to wait for before the switch (mirrorCompleteMarker, switchToServe).
    staged = [s for s in STACKS if "mirrorBucket" in plan_for(s).outputs]
    exported |= {name for stack in staged for name in plan_for(stack, overrides={"kimi-deploy:phase": "stage"}).outputs}
    assert len(named) >= 8 and named - exported == set(), sorted(exported)


def test_cost_json_keys_the_readme_names_are_written():
    [sentence] = re.findall(r"\(([^()]*) in `--json`\)", README)
    named = set(re.findall(r"`(\w+)`", sentence))
    out = subprocess.run([sys.executable, "scripts/ops/cost.py", "--stack", "b300", "--tasks-per-month", "1000", "--json"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert named and named <= set(json.loads(out.stdout)), named



def _named_json_keys(text: str) -> dict[str, set[str]]:
    """``{parent path: keys}`` of a README listing such as "`a`, `b` {`c`, `d`}, `e` [{`f`}]"."""
    out: dict[str, set[str]] = {}
    stack: list[str] = [""]
    last = ""
    for token in re.findall(r"`(\w+)`|(\{)|(\})", text):
        name, opening, closing = token
        if name:
            out.setdefault(stack[-1], set()).add(name)
            last = f"{stack[-1]}.{name}".lstrip(".")
        elif opening:
            stack.append(last)
        elif closing and len(stack) > 1:
            stack.pop()
    return out


def test_the_plan_json_keys_the_readme_lists_are_in_the_document():
    from scripts.ops.plan import build_plan_document

    [listing] = re.findall(r"The JSON document has (.*?)\. Secret values", README, re.S)
    named = _named_json_keys(re.sub(r"\([^()]*\)", "", listing))  # remarks in parentheses name no key
    doc = build_plan_document("b300", now=FIXED_NOW)
    assert len(named[""]) >= 8
    for parent, keys in named.items():
        node = doc
        for part in filter(None, parent.split(".")):
            node = node[part]
            node = node[0] if isinstance(node, list) else node
        assert keys <= set(node), (parent, sorted(keys - set(node)))


def test_the_tags_the_readme_names_are_on_the_resources():
    run = plan_for("b300")
    every = re.search(r"Every AWS resource carries the tags (.*?) and, on trials, `expires-at`", README, re.S)
    assert every
    stack_tags = set(re.findall(r"`([\w:-]+)`", every.group(1)))
    instance = next(r for r in run.resources if r.type == "aws:ec2/instance:Instance")
    assert stack_tags | {"expires-at"} <= set(instance.inputs["tags"]), sorted(instance.inputs["tags"])
    mirror_tags = dict(pair.split("=", 1) for pair in re.findall(r"`(kimi-deploy:\w+=[\w-]+)`", README))
    bucket = next(r for r in run.resources if r.type == "aws:s3/bucket:Bucket")
    assert mirror_tags and mirror_tags.items() <= bucket.inputs["tags"].items(), mirror_tags
