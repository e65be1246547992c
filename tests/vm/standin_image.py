"""The image standing in for ``vllm/vllm-openai`` in the VM tier: two layers and a Docker image
manifest, served by the registry stand-in (``services.Registry``) under the name and tag the
plan renders.

- Base layer (built once, cached by content hash beside the guest image): Debian 12 minbase with
  ``python3`` and ``ca-certificates`` (debootstrap), boto3 and huggingface_hub at
  ``requirements.txt``'s pins (pip, compiled to .pyc in the tree by its own python3), the test CA
  appended to the system bundle. What the sync steps and engine_cache.py need of the real image.
- Top layer (built per run, a few KB): ``/usr/local/bin/vllm`` = ``standin_vllm.py``.
- Config: the bundle for every TLS client (``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``,
  ``AWS_CA_BUNDLE``), entry point ``vllm serve`` as the real image.

Media types are Docker's schema 2 (``application/vnd.docker.distribution.manifest.v2+json``),
which docker.io 20.10 pulls through a registry mirror
(https://distribution.github.io/distribution/spec/manifest-v2-2/).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import stat
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.vm import image as vm_image

REPO_ROOT = Path(__file__).resolve().parents[2]
PYTHON_SITE = "usr/local/lib/python3.11/dist-packages"  # Debian 12's python3 reads it
PINNED = ("boto3", "huggingface_hub")
# botocore's service models kept (the rest is ~80 MB the stand-in never loads).
BOTOCORE_SERVICES = ("s3", "sts", "sso", "sso-oidc", "ssm")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_MEDIA_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_MEDIA_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"
BUILD_FORMAT = 1


def pins() -> dict[str, str]:
    """``PINNED`` packages at requirements.txt's versions."""
    found = {}
    for line in (REPO_ROOT / "requirements.txt").read_text().splitlines():
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s#]+).*", line.strip())
        if m and m.group(1).lower().replace("-", "_") in PINNED:
            found[m.group(1).lower().replace("-", "_")] = m.group(2)
    missing = set(PINNED) - set(found)
    if missing:
        raise vm_image.BuildError(f"requirements.txt pins no {sorted(missing)}")
    return found


@dataclass(frozen=True)
class Layer:
    """One image layer: ``path`` (gzip), ``digest`` (sha256 of the gzip), ``diff_id`` (sha256 of
    the tar), ``size_bytes`` (gzip), ``info`` (build.json for the base layer)."""

    path: Path
    digest: str
    diff_id: str
    size_bytes: int
    info: dict


def base_key(ca: vm_image.CertificateAuthority) -> str:
    """Content hash of the base layer's inputs (16 hex characters)."""
    h = hashlib.sha256(json.dumps({"format": BUILD_FORMAT, "suite": vm_image.SUITE, "pins": pins(),
                                   "services": BOTOCORE_SERVICES, "ca": ca.fingerprint}, sort_keys=True).encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


def _load(directory: Path) -> Layer | None:
    info_path = directory / "build.json"
    if not info_path.is_file():
        return None
    info = json.loads(info_path.read_text())
    return Layer(directory / "layer.tar.gz", info["digest"], info["diff_id"], info["size_bytes"], info)


def cached_base_layer(root: Path | None = None) -> Layer | None:
    """The base layer of this tree when cached, else None."""
    root = root or vm_image.cache_root()
    if not (root / "ca" / "ca.pem").is_file():
        return None
    return _load(root / f"standin-base-{base_key(vm_image.load_ca(root))}")


def _skip(rel: str) -> bool:
    top = rel.split("/", 1)[0]
    return (top in ("dev", "proc", "sys", "run", "tmp") and "/" in rel) or rel.startswith(
        ("usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/locale/", "var/cache/apt/", "var/lib/apt/lists/"))


def write_layer(tree: Path, out: Path) -> tuple[str, str, int]:
    """tar (PAX, sorted, owners and modes kept; /dev, /proc, /sys, /run, /tmp emptied) of ``tree``,
    gzipped with no time stamp. Returns (digest, diff_id, gzip size)."""
    tar_path = out.with_suffix("")
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(tree):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                full = Path(dirpath) / name
                rel = full.relative_to(tree).as_posix()
                if _skip(rel):
                    continue
                info = tar.gettarinfo(str(full), arcname=rel)
                info.uname = info.gname = ""
                if info.isreg():
                    with open(full, "rb") as f:
                        tar.addfile(info, f)
                elif info.isdir() or info.issym() or info.islnk() or info.ischr() or info.isblk() or info.isfifo():
                    tar.addfile(info)
    diff_id = "sha256:" + _sha256_file(tar_path)
    with open(tar_path, "rb") as src, open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                                            compresslevel=6) as gz:
        shutil.copyfileobj(src, gz, 1 << 20)
    tar_path.unlink()
    return "sha256:" + _sha256_file(out), diff_id, out.stat().st_size


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def build_base_layer(root: Path | None = None) -> Layer:
    """The base layer: from the cache, else built (a few minutes). Holds the cache lock.

    Raises:
        vm_image.BuildError: a prerequisite is missing or a step failed.
    """
    root = root or vm_image.cache_root()
    with vm_image.build_lock(root):
        ca = vm_image.load_ca(root)
        key = base_key(ca)
        final = root / f"standin-base-{key}"
        if (layer := _load(final)) is not None:
            return layer
        if missing := vm_image.check_prerequisites():
            raise vm_image.BuildError(f"cannot build the stand-in image here: missing {', '.join(missing)}")
        work = root / f"build-standin-{key}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        log, tree = work / "build.log", work / "root"
        started = time.monotonic()
        vm_image._log(f"building the stand-in image's base layer {key} (log {log})")
        vm_image.debootstrap(tree, ("python3", "ca-certificates"), log)
        versions = pins()
        site = tree / PYTHON_SITE
        vm_image.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
                      "--target", str(site), "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
                      "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
                      "--only-binary=:all:", *[f"{name}=={version}" for name, version in sorted(versions.items())]],
                     log=log)
        shutil.rmtree(site / "bin", ignore_errors=True)
        data = site / "botocore" / "data"
        for entry in data.iterdir():
            if entry.is_dir() and entry.name not in BOTOCORE_SERVICES:
                shutil.rmtree(entry)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8"}
        vm_image.run(["chroot", str(tree), "python3", "-m", "compileall", "-q", "-j", "0", "/" + PYTHON_SITE], log=log,
                     env=env)
        bundle = tree / CA_BUNDLE.lstrip("/")
        bundle.write_bytes(bundle.read_bytes() + ca.cert_pem)
        digest, diff_id, size = write_layer(tree, work / "layer.tar.gz")
        shutil.rmtree(tree)
        info = {"key": key, "digest": digest, "diff_id": diff_id, "size_bytes": size, "pins": versions,
                "build_seconds": round(time.monotonic() - started, 1),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (work / "build.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
        for old in root.glob("standin-base-*"):
            shutil.rmtree(old, ignore_errors=True)
        work.rename(final)
        vm_image._log(f"stand-in base layer {key}: built in {info['build_seconds']:.0f} s, {size / 1e6:.0f} MB")
        layer = _load(final)
        assert layer is not None
        return layer


def top_layer(out_dir: Path) -> Layer:
    """``/usr/local/bin/vllm`` (``standin_vllm.py``, mode 0755) as a layer in ``out_dir``."""
    buf = io.BytesIO()
    data = (Path(__file__).parent / "standin_vllm.py").read_bytes()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("usr", "usr/local", "usr/local/bin"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        info = tarfile.TarInfo("usr/local/bin/vllm")
        info.size, info.mode = len(data), 0o755 | stat.S_IFREG
        tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    gz = gzip.compress(raw, mtime=0)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "top.tar.gz"
    path.write_bytes(gz)
    return Layer(path, "sha256:" + hashlib.sha256(gz).hexdigest(), "sha256:" + hashlib.sha256(raw).hexdigest(), len(gz), {})


@dataclass(frozen=True)
class StandinImage:
    """The assembled image: ``manifest`` bytes and its ``digest``; ``blobs``: digest -> file or bytes."""

    manifest: bytes
    digest: str
    blobs: dict[str, Path | bytes]


def assemble(layers: list[Layer]) -> StandinImage:
    """Config and schema-2 manifest over ``layers`` (bottom first)."""
    env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           *[f"{var}={CA_BUNDLE}" for var in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "AWS_CA_BUNDLE")]]
    config = json.dumps({
        "architecture": "amd64", "os": "linux", "created": "2026-01-01T00:00:00Z",
        "config": {"Env": env, "Entrypoint": ["vllm", "serve"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": "2026-01-01T00:00:00Z", "created_by": "tests/vm/standin_image.py"} for _ in layers],
    }, sort_keys=True).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "size": len(config), "digest": config_digest},
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "size": layer.size_bytes, "digest": layer.digest} for layer in layers],
    }, sort_keys=True).encode()
    blobs: dict[str, Path | bytes] = {config_digest: config, **{layer.digest: layer.path for layer in layers}}
    return StandinImage(manifest, "sha256:" + hashlib.sha256(manifest).hexdigest(), blobs)


def standin_image(run_dir: Path, root: Path | None = None) -> StandinImage:
    """The cached base layer (built if missing) plus this tree's top layer."""
    return assemble([build_base_layer(root), top_layer(run_dir)])

