"""``model``: a known profile, a revision (a commit outside trials), the license acknowledged."""

from __future__ import annotations

import re

from ..errors import ConfigError
from ..model import MODELS, ModelProfile
from .patterns import COMMIT_RE, REVISION_RE, SERVED_MODEL_NAME_RE, git_ref_problem
from .raw import RawConfig

# A Hub pull request's head (``refs/pr/<number>``), a revision the Hub accepts like a branch.
HUB_PULL_REQUEST_RE = re.compile(r"^refs/pr/[0-9]+\Z")


def check_profile(raw: RawConfig) -> ModelProfile:
    """The model profile named by ``model.profile``.

    Raises:
        ConfigError: not a key of ``model.MODELS``.
    """
    model = MODELS.get(raw.model.profile)
    if model is None:
        raise ConfigError("model.profile", raw.model.profile, f"is not a known model (allowed: {', '.join(MODELS)})")
    return model


def check_served_model_name(raw: RawConfig, model: ModelProfile) -> None:
    """``model.servedModelName``, when set: a name (``patterns.SERVED_MODEL_NAME_RE``: 1-128
    letters, digits, ``. _ : / -``, starting with a letter or digit). An empty one is refused, not
    replaced by the profile's name behind the user's back.

    Raises:
        ConfigError: empty, or not such a name.
    """
    name = raw.model.served_model_name
    if name is None:
        return
    if not name.strip():
        raise ConfigError(
            "model.servedModelName", name,
            f"is empty: remove the key to serve the profile's name ({model.name}), or give the name clients send",
        )
    if not SERVED_MODEL_NAME_RE.match(name):
        raise ConfigError(
            "model.servedModelName", name,
            "is not a model name (1-128 letters, digits, '.', '_', ':', '/', '-', starting with a letter or digit; "
            "clients send it as `model`)",
        )


def check_revision_and_license(raw: RawConfig, model: ModelProfile, warnings: list[str]) -> str:
    """``model.revision`` (a lower-case 40-hex commit; a branch or tag only in a trial, with a
    warning) and ``model.licenseAcknowledged`` true (an example value left in is a blocker:
    ``examples.example_value_blockers``).

    Returns:
        The revision.

    Raises:
        ConfigError: the first invalid value.
    """
    rev = raw.model.revision
    if not REVISION_RE.match(rev):
        raise ConfigError("model.revision", rev, "is not a revision (a 40-hex commit, or in a trial a branch or tag name)")
    if (problem := git_ref_problem(rev)) is not None:
        # The revision becomes a directory (/models/<profile>/<revision>) and an S3 key prefix.
        raise ConfigError("model.revision", rev, f"{problem}: a revision is a 40-hex commit, or in a trial a branch or tag name")
    if re.fullmatch(r"[0-9a-fA-F]{40}", rev) and not COMMIT_RE.match(rev):
        raise ConfigError("model.revision", rev, "is a commit in upper case: write it in lower case as the hub does")
    if re.fullmatch(r"[0-9a-fA-F]{30,39}|[0-9a-fA-F]{41,50}", rev):
        # A commit cut or run on when copied: no branch is named with 30 or more hex digits.
        off = len(rev) - 40
        count = f"{abs(off)} hex digit{'s' if abs(off) != 1 else ''} {'short of' if off < 0 else 'more than'}"
        raise ConfigError("model.revision", rev, f"has {len(rev)} hex digits, {count} a commit (40): copy the whole commit")
    if not COMMIT_RE.match(rev):
        if raw.environment != "trial":
            raise ConfigError(
                "model.revision",
                rev,
                f"must be a 40-hex commit in {raw.environment} (branches move; pin the commit the trial resolved)",
            )
        if HUB_PULL_REQUEST_RE.match(rev):
            # The Hub names a pull request's head refs/pr/N; anyone with an account can open one
            # (https://huggingface.co/docs/hub/repositories-pull-requests-discussions, read 2026-12).
            runs = (" and, with --trust-remote-code, its Python" if model.trust_remote_code else "")
            warnings.append(
                f"model.revision '{rev}' is a Hub pull request, which anyone can open, not the publisher's "
                f"release: the nodes load its weights{runs}; review it and pin its commit, or use a commit of main"
            )
        else:
            warnings.append(
                f"model.revision '{rev}' is a branch, not a commit: the weight sync resolves and records the "
                "commit; pin it before staging or prod"
            )
    if raw.model.license_acknowledged is not True:
        raise ConfigError(
            "model.licenseAcknowledged",
            raw.model.license_acknowledged,
            f"must be true: {model.display_name} license is {model.license_summary}",
        )
    return rev
