#!/usr/bin/env python3
"""Download the pinned upstream CRDs the schema tests validate against (``make crds``).

    python3 scripts/dev/crds.py [--dest .crds]       # download, verify sha256, write atomically
    python3 scripts/dev/crds.py --verify DIR          # check a local copy against the pins

Each CRD is pinned by project, release tag, path in the project's repository and the sha256 of
the file; it is fetched from ``https://raw.githubusercontent.com/<project>/<tag>/<path>`` and
kept only when its sha256 matches. Where the internet is not reachable, point ``KIMI_CRDS_DIR``
at a local copy of the same files instead (``--verify`` checks one). The tests read the
directory from ``KIMI_CRDS_DIR``, else ``.crds`` in the repository (tests/test_k8s_schemas.py).

Only the standard library is used, so it runs before any virtualenv exists.
Exit codes: 0 all files present and verified, 1 a download failed or a file does not match its
pin, 2 usage error.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DEST = REPO_ROOT / ".crds"
TIMEOUT_SECONDS = 20


@dataclass(frozen=True)
class Crd:
    """One pinned CRD file: ``kind`` and served ``api_version`` it defines, where it comes from
    (``project`` on GitHub, release ``tag``, ``path`` in the repository) and its ``sha256``."""

    kind: str
    api_version: str
    file: str
    project: str
    tag: str
    path: str
    sha256: str

    @property
    def url(self) -> str:
        return f"https://raw.githubusercontent.com/{self.project}/{self.tag}/{self.path}"


# Versions: the releases the components deploy (components/core/versions.py pins the charts).
# Paths: each project's generated CRDs (controller-gen output) at that tag.
CRDS: tuple[Crd, ...] = (
    Crd("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1", "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
        "kubernetes-sigs/lws", "v0.9.0", "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
        "c5dcad8ed943e495490241f00b9a1b45d51203b6d484020db3636d5bf553568e"),
    Crd("ComputeDomain", "resource.nvidia.com/v1beta1", "resource.nvidia.com_computedomains.yaml",
        "NVIDIA/k8s-dra-driver-gpu", "v25.12.0",
        "deployments/helm/nvidia-dra-driver-gpu/crds/resource.nvidia.com_computedomains.yaml",
        "653b477ad084f6cfed479ecdcc1149f3c14499bcac2ae1d2acbb82ccf7419f89"),
    Crd("ScaledObject", "keda.sh/v1alpha1", "keda.sh_scaledobjects.yaml",
        "kedacore/keda", "v2.20.2", "config/crd/bases/keda.sh_scaledobjects.yaml",
        "af35555862a83933b074af14ad439c4b4ceabaf4daa3e9338e9b23e36d308d80"),
    Crd("TriggerAuthentication", "keda.sh/v1alpha1", "keda.sh_triggerauthentications.yaml",
        "kedacore/keda", "v2.20.2", "config/crd/bases/keda.sh_triggerauthentications.yaml",
        "275307b4cb19ca8f0f506a879282aa4c67587ac16ec757f494d6585c5c185d65"),
    Crd("PodMonitor", "monitoring.coreos.com/v1", "monitoring.coreos.com_podmonitors.yaml",
        "prometheus-operator/prometheus-operator", "v0.93.0",
        "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
        "45a93443daa687d3654f7e9631909ff7edcdf3ec09c5e60251b74aa2722aee5d"),
    Crd("ServiceMonitor", "monitoring.coreos.com/v1", "monitoring.coreos.com_servicemonitors.yaml",
        "prometheus-operator/prometheus-operator", "v0.93.0",
        "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
        "a99047972c9dd7679ce2050b9968e8a08773492e671b3e17abd476d42aa78a32"),
    Crd("PrometheusRule", "monitoring.coreos.com/v1", "monitoring.coreos.com_prometheusrules.yaml",
        "prometheus-operator/prometheus-operator", "v0.93.0",
        "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
        "78be98554b9c8506ab2b4f4feb91c5f3a56e536a0a510f3a8e876a459970d56d"),
)
CRD_FILES: dict[str, str] = {c.kind: c.file for c in CRDS}


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def verify(directory: Path) -> list[str]:
    """Problems of a local copy: files missing or not matching their pinned sha256 (one line each)."""
    problems = []
    for crd in CRDS:
        path = directory / crd.file
        if not path.is_file():
            problems.append(f"{path}: missing ({crd.project} {crd.tag} {crd.path})")
        elif sha256_of(path) != crd.sha256:
            problems.append(f"{path}: sha256 {sha256_of(path)} is not the pinned {crd.sha256} ({crd.project} {crd.tag})")
    return problems


def download(crd: Crd, dest: Path, opener=urllib.request.urlopen) -> None:
    """Fetch ``crd.url`` into ``dest / crd.file`` (temporary file, sha256 check, rename).

    Raises:
        OSError: the URL cannot be fetched (offline, DNS, HTTP error): the message names it.
        ValueError: the bytes do not match the pinned sha256 (nothing is written).
    """
    target = dest / crd.file
    if target.is_file() and sha256_of(target) == crd.sha256:
        return
    try:
        with opener(crd.url, timeout=TIMEOUT_SECONDS) as response:
            data = response.read()
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", None) or err
        raise OSError(f"cannot download {crd.url} ({' '.join(str(reason).split())})") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != crd.sha256:
        raise ValueError(f"{crd.url}: sha256 {digest} is not the pinned {crd.sha256}; not written")
    fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{crd.file}.")
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/dev/crds.py", allow_abbrev=False,
        description="Download the pinned upstream CRDs (LeaderWorkerSet, ComputeDomain, KEDA, Prometheus "
        "Operator) for the schema tests, or verify a local copy.",
        epilog="Exit codes: 0 every file present and verified, 1 a download failed or a file does not match "
        "its pin, 2 usage error. Offline: set KIMI_CRDS_DIR to a local copy of the same files instead.")
    parser.add_argument(
        "--dest", type=Path, default=DEFAULT_DEST, help=f"directory to write (default {DEFAULT_DEST.name}/ in the repository)"
    )
    parser.add_argument("--verify", type=Path, metavar="DIR", help="only check DIR against the pins (no network)")
    parser.add_argument("--list", action="store_true", help="print the pins (kind, project, tag, URL, sha256) and exit")
    args = parser.parse_args(argv)
    if args.list:
        for c in CRDS:
            print(f"{c.kind:<22} {c.project} {c.tag}  {c.url}  sha256:{c.sha256}")
        return 0
    if args.verify is not None:
        problems = verify(args.verify)
        for line in problems:
            print(f"crds: {line}", file=sys.stderr)
        if not problems:
            print(f"crds: {args.verify}: all {len(CRDS)} CRDs match their pins")
        return 1 if problems else 0
    # Everything goes to a staging directory first: an offline run leaves no empty --dest behind
    # (the tests would take an existing directory for a copy).
    args.dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dest.parent, prefix=f".{args.dest.name}.") as staging:
        for crd in CRDS:
            try:
                if (args.dest / crd.file).is_file() and sha256_of(args.dest / crd.file) == crd.sha256:
                    continue
                download(crd, Path(staging))
            except (OSError, ValueError) as err:
                print(f"crds: error: {err}. Without internet access, point KIMI_CRDS_DIR at a local copy of the "
                      f"pinned files instead (check it with `python3 scripts/dev/crds.py --verify DIR`)", file=sys.stderr)
                return 1
        args.dest.mkdir(exist_ok=True)
        for name in os.listdir(staging):
            os.replace(os.path.join(staging, name), args.dest / name)
    print(f"crds: {len(CRDS)} CRDs verified in {args.dest} (the tests read it; or set KIMI_CRDS_DIR={args.dest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
