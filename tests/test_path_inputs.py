"""Config values that become paths refuse every way out of their directory: ``model.revision``
(``/models/<profile>/<revision>``, ``<prefix>/<org>/<repo>/<revision>`` in the mirror, the sync's
destination), ``storage.mirror.prefix`` (S3 keys and the FSx import path) and
``kubernetes.nvmeHostPath`` (the hostPath of the weights, staging and engine caches)."""

from __future__ import annotations

import copy

import pytest

from components.core.config import namespace_config, read_stack_config
from components.core.config.patterns import git_ref_problem, path_segments_problem
from components.core.errors import ConfigError
from components.core.load import parse_spec
from components.core.weights import serving_path
from tests.conftest import FIXED_NOW


def reject(config: dict, key: str, *fragments: str, stack: str = "test", secrets=frozenset()) -> str:
    """The one-line ConfigError ``parse_spec`` raises for ``config``, naming ``key`` and each fragment."""
    with pytest.raises(ConfigError) as info:
        parse_spec(config, stack=stack, now=FIXED_NOW, secrets_set=secrets)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"kimi-deploy:{key}:"), message
    for fragment in fragments:
        assert fragment in message, message
    return message


def _trial(stack: str = "b300") -> dict:
    ns, _ = namespace_config(read_stack_config(stack))
    cfg = copy.deepcopy(ns)
    cfg["environment"] = "trial"
    return cfg


ESCAPES = ["a/../../x", "..", "main/..", "a/./b", "./main", "a//b", "main/", "a/.hidden", "v1.lock", "main.", "a..b"]


@pytest.mark.parametrize("revision", ESCAPES)
def test_a_revision_that_leaves_its_directory_is_refused(revision):
    """Each passed the old pattern (``[A-Za-z0-9][A-Za-z0-9._/-]*``); ``a/../../x`` flowed into the
    serving path and the sync destination."""
    cfg = _trial()
    cfg["model"] = {**cfg["model"], "revision": revision}
    reject(cfg, "model.revision", repr(revision))


@pytest.mark.parametrize("revision", ["main", "refs/pr/1", "v1.0", "release-2026.01", "0123456789abcdef0123456789abcdef01234567"])
def test_branches_tags_and_commits_still_pass(revision):
    cfg = _trial()
    cfg["model"] = {**cfg["model"], "revision": revision}
    spec = parse_spec(cfg, stack="test", now=FIXED_NOW)
    assert serving_path(spec).endswith("/" + revision) and "/../" not in serving_path(spec)


@pytest.mark.parametrize("prefix", ["models/./x", ".", "a/."])
def test_a_mirror_prefix_with_a_dot_segment_is_refused(prefix):
    cfg = _trial()
    cfg["storage"] = {**cfg.get("storage", {}), "mirror": {**cfg.get("storage", {}).get("mirror", {}), "prefix": prefix}}
    reject(cfg, "storage.mirror.prefix", "'.'")


@pytest.mark.parametrize("host_path", ["/mnt//nvme", "/mnt/./nvme", "/mnt/nvme/.", "/mnt/nv\nme"])
def test_an_nvme_host_path_with_an_empty_or_dot_segment_is_refused(host_path):
    cfg = _trial("mi355x")
    cfg["kubernetes"] = {**cfg.get("kubernetes", {}), "nvmeHostPath": host_path}
    reject(cfg, "kubernetes.nvmeHostPath", stack="test", secrets=frozenset({"kubeconfig"}))


def test_the_path_rules():
    assert path_segments_problem("/mnt/nvme", absolute=True) is None
    assert path_segments_problem("mnt/nvme", absolute=True) == "must be an absolute path"
    assert path_segments_problem("/x", absolute=False) == "must be a relative path (no leading '/')"
    assert "backslash" in (path_segments_problem("a\\..\\b", absolute=False) or "")
    assert git_ref_problem("feature/x") is None and git_ref_problem("a/../b") is not None
