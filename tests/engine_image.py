"""Local vLLM engine images for ``kimi-deploy engine verify`` against a real container runtime
(Debian's podman), served on 127.0.0.1 by the VM tier's registry stand-in and cached by content hash
under ``${XDG_CACHE_HOME:-~/.cache}/kimi-deploy/engine-image/``.

    python -m tests.engine_image build [VERSION ...]   # build and load what is missing (default: VERSIONS)
    python -m tests.engine_image status                # what is cached, with sizes and build times
    python -m tests.engine_image bench                 # CPU seconds: the build, one check inside each image
    python -m tests.engine_image clean                 # empty the cache (the next build is cold)

An image holds what ``scripts/node/engine_check.py`` reads in a real ``vllm/vllm-openai`` image, in
three layers (OCI image manifest, https://github.com/opencontainers/image-spec/blob/main/manifest.md):

1. the VM tier's stand-in base layer (``tests/vm/standin_image.py``: Debian 12 minbase with
   ``python3`` 3.11, already cached for the VM boots), as it is;
2. the vLLM parser venv's packages (``make vllm-parser``: vLLM's complete import closure for the
   parser, the serve subcommand and the parser registries, with CPU torch) in
   ``/usr/local/lib/python3.11/dist-packages``, the directory the real image's ``uv pip install
   --system`` fills; an opaque whiteout first, so the base layer's own packages (boto3 and
   huggingface_hub for the VM tier) are hidden and the directory holds exactly the venv's;
3. the vLLM package tree of one release: the parser venv's own tree when it is that release, else
   the release's wheel from PyPI (``pip download --no-deps vllm==X.Y.Z``, kept in the cache), installed
   with ``pip install --no-deps --target`` (bytecode compiled, as pip does); plus the ``vllm``
   console script (``/usr/local/bin/vllm``) and the real image's entry point ``vllm serve``.

Where it differs from ``vllm/vllm-openai`` (whose vllm-base stage is nvidia/cuda on Ubuntu with
deadsnakes' Python 3.12 as ``/usr/bin/python3`` and ``uv pip install --system`` of the wheel with
its full requirements: vLLM's docker/Dockerfile), and why none of it changes a check's verdict: Debian
12 and Python 3.11 (the checks use the standard library and vLLM's own Python files); torch
2.13.0+cpu instead of the CUDA build the wheel pins (only ``import torch`` is needed, and the CUDA
wheel is several GB); no GPU-only packages (flashinfer, nvidia-*: nothing the checks import). The
vLLM tree itself is the wheel's, file for file (its CUDA extension modules included, not loaded on CPU),
plus what the installer adds (RECORD, INSTALLER, bytecode).

The layer blobs are written only while podman has not loaded the image: after the first pull into
the cache's podman storage they are deleted (a pull then finds every layer present and fetches
the manifest and config alone, kept beside ``build.json``). One build at a time per cache (``flock``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.vm import image as vm_image
from tests.vm import standin_image
from tests.vm.standin_image import Layer, StandinImage

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_FORMAT = 1  # bump to force a rebuild when the recipe changes outside the hashed inputs
# The releases the tests verify: the one that serves K3.1 Pro on NVIDIA, and the one before it.
VERSIONS: tuple[str, ...] = ("0.34.0", "0.33.0")
PYTHON_SITE = standin_image.PYTHON_SITE  # usr/local/lib/python3.11/dist-packages
REPOSITORY = "vllm/vllm-openai"  # served under the real repository name and release tag
KEEP_REPOSITORY = "localhost/kimi-engine-check"  # the name that keeps a loaded image in podman storage
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
# The parser venv's own machinery, not packages an image would hold.
VENV_ONLY = frozenset({"_virtualenv.py", "_virtualenv.pth", "__pycache__"})
# Debian 12's python3 and the real image's PATH (console scripts in /usr/local/bin).
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CREATED = "2026-01-01T00:00:00Z"
PIP_TIMEOUT_SECONDS = 1800


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/kimi-deploy/engine-image``."""
    return vm_image.cache_root().parent / "engine-image"


def _log(message: str) -> None:
    print(f"engine-image: {message}", file=sys.stderr, flush=True)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# --- the package trees ------------------------------------------------------------------------------

def site_packages_of(python: Path) -> tuple[Path, str]:
    """``(site-packages holding vllm, vllm's version)`` of a venv's python (vLLM is not imported).

    Raises:
        vm_image.BuildError: the python has no vllm package.
    """
    code = ("import importlib.metadata as m, importlib.util as u, os; s = u.find_spec('vllm'); "
            "print(os.path.dirname(os.path.dirname(s.origin)) if s else ''); print(m.version('vllm') if s else '')")
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or len(lines) != 2 or not lines[0]:
        raise vm_image.BuildError(f"{python} has no vllm package: {proc.stderr.strip()[-300:]}")
    return Path(lines[0]), lines[1]


def _is_vllm(name: str) -> bool:
    return name == "vllm" or (name.startswith("vllm-") and name.endswith(".dist-info"))


def deps_identity(site: Path) -> str:
    """sha256 over every distribution's ``RECORD`` in ``site`` but vLLM's (RECORD holds the sha256 of
    each installed file: the tree's content without reading its 1.4 GB)."""
    h = hashlib.sha256()
    for record in sorted(site.glob("*.dist-info/RECORD")):
        if not _is_vllm(record.parent.name):
            h.update(record.parent.name.encode() + b"\0" + hashlib.sha256(record.read_bytes()).digest())
    h.update("\0".join(sorted(p.name for p in site.iterdir() if not _is_vllm(p.name))).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class VllmTree:
    """Where one release's vLLM package tree comes from.

    Attributes:
        version: ``X.Y.Z``.
        site: the site-packages directory holding ``vllm/`` and ``vllm-X.Y.Z.dist-info/``.
        identity: sha256 of its ``RECORD`` (the installed files' hashes).
        origin: ``parser venv`` or the wheel's file name.
    """

    version: str
    site: Path
    identity: str
    origin: str


def _tree(site: Path, version: str, origin: str) -> VllmTree:
    record = site / f"vllm-{version}.dist-info" / "RECORD"
    if not record.is_file():
        raise vm_image.BuildError(f"{site} holds no vllm-{version}.dist-info/RECORD")
    return VllmTree(version, site, hashlib.sha256(record.read_bytes()).hexdigest(), origin)


def wheel_tree(version: str, root: Path) -> VllmTree:
    """vLLM ``version`` installed from its PyPI wheel into ``<root>/vllm-<version>/site`` (once):
    ``pip download --no-deps`` (pip's configured indexes and find-links) then ``pip install
    --no-deps --target`` for Debian 12's CPython 3.11 on x86_64.

    Raises:
        vm_image.BuildError: pip failed (no network to the index, no such release).
    """
    final = root / f"vllm-{version}"
    if (final / "site" / f"vllm-{version}.dist-info" / "RECORD").is_file():
        return _tree(final / "site", version, (final / "wheel").read_text().strip())
    work = root / f"build-vllm-{version}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "wheels").mkdir(parents=True)
    log = work / "build.log"
    target = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
              "--platform", "manylinux_2_28_x86_64", "--only-binary=:all:"]
    _log(f"downloading the vllm {version} wheel (pip download --no-deps; log {log})")
    vm_image.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-cache-dir",
                  "--no-deps", *target, "--dest", str(work / "wheels"), f"vllm=={version}"], log=log, timeout=PIP_TIMEOUT_SECONDS)
    wheels = sorted((work / "wheels").glob(f"vllm-{version}-*.whl"))
    if len(wheels) != 1:
        raise vm_image.BuildError(f"pip download of vllm=={version} left {[w.name for w in wheels]} (log: {log})")
    vm_image.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                  "--no-index", "--target", str(work / "site"), str(wheels[0])], log=log, timeout=PIP_TIMEOUT_SECONDS)
    shutil.rmtree(work / "site" / "bin", ignore_errors=True)  # scripts with this host's python: written below instead
    (work / "wheel").write_text(f"{wheels[0].name} sha256:{_sha256_file(wheels[0])}\n")
    shutil.rmtree(work / "wheels")
    shutil.rmtree(final, ignore_errors=True)
    work.rename(final)
    return _tree(final / "site", version, (final / "wheel").read_text().strip())


# --- layers -------------------------------------------------------------------------------------------

class _HashingWriter(io.RawIOBase):
    """A file that hashes what is written to it (sha256)."""

    def __init__(self, f):
        self.f, self.hash, self.size = f, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.f.write(data)
        self.hash.update(data)
        self.size += len(data)
        return len(data)


def _dir_info(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
    return info


def _add_tree(tar: tarfile.TarFile, src: Path, arcname: str) -> None:
    """``src`` (a file, link or directory, recursively) as ``arcname``: sorted, owner root, modes
    and mtimes kept (bytecode stays valid), symlinks as links."""
    info = tar.gettarinfo(str(src), arcname=arcname)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if info.isreg():
        with open(src, "rb") as f:
            tar.addfile(info, f)
        return
    tar.addfile(info)
    if info.isdir():
        for child in sorted(os.listdir(src)):
            _add_tree(tar, src / child, f"{arcname}/{child}")


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _write_layer(out: Path, fill) -> Layer:
    """An uncompressed tar layer at ``out`` written by ``fill(tar)``; its digest is its diff_id."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as raw:
        hashing = _HashingWriter(raw)
        with tarfile.open(fileobj=hashing, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            parts = PYTHON_SITE.split("/")
            for depth in range(1, len(parts) + 1):
                tar.addfile(_dir_info("/".join(parts[:depth])))
            fill(tar)
    digest = "sha256:" + hashing.hash.hexdigest()
    return Layer(out, digest, digest, hashing.size, {})


def deps_layer(site: Path, out: Path) -> Layer:
    """Layer 2: an opaque whiteout of the dist-packages directory (the base layer's packages are
    hidden), then every entry of ``site`` but vLLM's and the venv's own files."""

    def fill(tar: tarfile.TarFile) -> None:
        _add_bytes(tar, f"{PYTHON_SITE}/.wh..wh..opq", b"", 0o644)
        for name in sorted(os.listdir(site)):
            if not _is_vllm(name) and name not in VENV_ONLY:
                _add_tree(tar, site / name, f"{PYTHON_SITE}/{name}")

    return _write_layer(out, fill)


def console_script(site: Path, version: str) -> bytes:
    """``/usr/local/bin/vllm`` as pip writes it, from the distribution's ``entry_points.txt``."""
    for line in (site / f"vllm-{version}.dist-info" / "entry_points.txt").read_text().splitlines():
        name, _, target = (part.strip() for part in line.partition("="))
        if name == "vllm" and ":" in target:
            module, func = target.split(":", 1)
            return (f"#!/usr/bin/python3\nimport sys\nfrom {module} import {func}\n"
                    f"if __name__ == \"__main__\":\n    sys.exit({func}())\n").encode()
    raise vm_image.BuildError(f"vllm-{version}.dist-info names no vllm console script")


def vllm_layer(tree: VllmTree, out: Path) -> Layer:
    """Layer 3: ``vllm/`` and ``vllm-X.Y.Z.dist-info/`` of ``tree``, and ``/usr/local/bin/vllm``."""

    def fill(tar: tarfile.TarFile) -> None:
        for name in ("vllm", f"vllm-{tree.version}.dist-info"):
            _add_tree(tar, tree.site / name, f"{PYTHON_SITE}/{name}")
        tar.addfile(_dir_info("usr/local/bin"))
        _add_bytes(tar, "usr/local/bin/vllm", console_script(tree.site, tree.version), 0o755)

    return _write_layer(out, fill)


def assemble(layers: list[tuple[Layer, str]], version: str) -> StandinImage:
    """OCI config and manifest over ``(layer, media type)`` pairs (bottom first)."""
    config = json.dumps({
        "architecture": "amd64", "os": "linux", "created": CREATED,
        "config": {"Env": [f"PATH={IMAGE_PATH}"], "Entrypoint": ["vllm", "serve"], "WorkingDir": "/",
                   "Labels": {"org.opencontainers.image.version": version}},
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer, _ in layers]},
        "history": [{"created": CREATED, "created_by": "tests/engine_image.py"} for _ in layers],
    }, sort_keys=True).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "size": len(config), "digest": config_digest},
        "layers": [{"mediaType": media, "size": layer.size_bytes, "digest": layer.digest} for layer, media in layers],
    }, sort_keys=True).encode()
    blobs: dict[str, Path | bytes] = {config_digest: config, **{layer.digest: layer.path for layer, _ in layers}}
    return StandinImage(manifest, "sha256:" + hashlib.sha256(manifest).hexdigest(), blobs)


# --- podman -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Podman:
    """Debian's podman with its configuration in files of its own (nothing of the machine's is read
    or changed): storage in the cache (overlay, else vfs), run state in the temp directory, runc,
    cgroupfs, no default ulimits (this sandbox refuses raising RLIMIT_NOFILE), and each registry
    stand-in on 127.0.0.1 reachable over plain HTTP.

    Attributes:
        path: the podman binary.
        conf_dir: where the three configuration files are written.
        graphroot: image and container storage; runroot: its run state.
        driver: ``overlay`` or ``vfs``.
        registries: ``host:port`` locations allowed over plain HTTP.
    """

    path: str
    conf_dir: Path
    graphroot: Path
    runroot: Path
    driver: str
    registries: tuple[str, ...] = ()

    def env(self) -> dict[str, str]:
        """The variables that point podman at these files (containers.conf(5), containers-storage.conf(5),
        containers-registries.conf(5)); the files are (re)written now."""
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        files = {
            "containers.conf": '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n',
            "storage.conf": (f'[storage]\ndriver = "{self.driver}"\ngraphroot = "{self.graphroot}"\n'
                             f'runroot = "{self.runroot}"\n'),
            "registries.conf": "unqualified-search-registries = []\n" + "".join(
                f'\n[[registry]]\nlocation = "{location}"\ninsecure = true\n' for location in self.registries),
        }
        for name, text in files.items():
            (self.conf_dir / name).write_text(text)
        return {"CONTAINERS_CONF": str(self.conf_dir / "containers.conf"),
                "CONTAINERS_STORAGE_CONF": str(self.conf_dir / "storage.conf"),
                "CONTAINERS_REGISTRIES_CONF": str(self.conf_dir / "registries.conf")}

    def with_registry(self, location: str, conf_dir: Path) -> Podman:
        """The same storage, with ``location`` reachable over plain HTTP (configuration in ``conf_dir``)."""
        return Podman(self.path, conf_dir, self.graphroot, self.runroot, self.driver, (*self.registries, location))

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """``podman ARGS`` under this configuration."""
        return subprocess.run([self.path, *args], env={**os.environ, **self.env()}, capture_output=True, text=True,
                              timeout=timeout, check=False)


def podman_here() -> str | None:
    """Why podman cannot run images here (None: it can): not installed, or not root."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        return "podman and runc are not installed (apt: .ci/apt-packages.txt)"
    if os.geteuid() != 0:
        return "podman runs here as root only (rootless needs subuid ranges and user namespaces)"
    return None


def _podman_for(root: Path, driver: str, conf_dir: Path | None = None) -> Podman:
    """The cache's podman with ``driver``: storage under ``root``, run state in the temp directory."""
    runbase = Path(tempfile.gettempdir()) / f"kimi-deploy-podman-{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"
    return Podman(shutil.which("podman") or "podman", conf_dir or runbase / "conf", root / "podman" / driver,
                  runbase / driver, driver)


def podman(root: Path | None = None, conf_dir: Path | None = None) -> Podman:
    """The cache's podman: overlay storage where the kernel mounts it, else vfs (each its own graphroot).

    Raises:
        vm_image.BuildError: podman is missing, or answers ``info`` with neither driver.
    """
    if why := podman_here():
        raise vm_image.BuildError(why)
    root = root or cache_root()
    errors = []
    for driver in ("overlay", "vfs"):
        candidate = _podman_for(root, driver, conf_dir)
        proc = candidate.run("info", "--format", "{{.Store.GraphDriverName}}", timeout=120)
        if proc.returncode == 0 and proc.stdout.strip() == driver:
            return candidate
        errors.append(f"{driver}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    raise vm_image.BuildError(f"podman cannot run here ({'; '.join(errors)})")


# --- the images -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EngineImage:
    """One release's engine image, loaded into the cache's podman storage.

    Attributes:
        version: vLLM ``X.Y.Z``; key: content hash of every input (16 hex).
        image: manifest, its digest and the blobs the registry stand-in serves (the layers only
            while podman lacks them; manifest and config always).
        keep_name: ``localhost/kimi-engine-check:<version>-<key>`` (the tag that keeps it stored).
        site: the vLLM tree's site-packages on this host (the same files as in the image).
        info: build.json (origin of each layer, sizes, seconds).
        built_now: built by this call (not found in the cache).
    """

    version: str
    key: str
    image: StandinImage
    keep_name: str
    site: Path
    info: dict
    built_now: bool = False

    def reference(self, registry: str) -> str:
        """``<registry>/vllm/vllm-openai:v<version>``: the name it is served under."""
        return f"{registry}/{REPOSITORY}:v{self.version}"


def image_key(base: Layer, deps_id: str, tree: VllmTree, driver: str) -> str:
    """Content hash of an image's inputs (16 hex): the base layer, the packages, the vLLM tree, this file."""
    h = hashlib.sha256(json.dumps({"format": BUILD_FORMAT, "base": base.digest, "deps": deps_id, "vllm": tree.identity,
                                   "version": tree.version, "driver": driver}, sort_keys=True).encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def _lock(root: Path) -> Iterator[None]:
    with vm_image.build_lock(root):
        yield


def _image_from_info(directory: Path, info: dict) -> StandinImage:
    """The manifest and config a pull needs once podman holds the layers."""
    blobs: dict[str, Path | bytes] = {info["config_digest"]: (directory / "config.json").read_bytes()}
    manifest = (directory / "manifest.json").read_bytes()
    return StandinImage(manifest, "sha256:" + hashlib.sha256(manifest).hexdigest(), blobs)


def _stored(pod: Podman, name: str, config_digest: str) -> bool:
    """Whether ``pod`` holds the image (by its ID, the config digest), named ``name`` (tagged now if not)."""
    image_id = config_digest.split(":", 1)[1]
    proc = pod.run("image", "inspect", "--format", "{{.Id}}", name, timeout=120)
    if proc.returncode == 0 and proc.stdout.strip() == image_id:
        return True
    return pod.run("image", "exists", image_id).returncode == 0 and pod.run("tag", image_id, name).returncode == 0


def _load_into_podman(pod: Podman, image: StandinImage, keep_name: str, directory: Path) -> None:
    """Pull ``image`` from a registry stand-in on 127.0.0.1 into ``pod``'s storage and tag it ``keep_name``."""
    from tests.vm.services import Registry

    registry = Registry()
    registry.start()
    try:
        location = f"127.0.0.1:{registry.port}"
        registry.add(f"{REPOSITORY}:load", image)
        loader = pod.with_registry(location, directory / "podman-conf")
        proc = loader.run("pull", "--quiet", f"{location}/{REPOSITORY}:load", timeout=3600)
        if proc.returncode != 0:
            raise vm_image.BuildError(f"podman pull of the engine image failed: {proc.stderr.strip()[-400:]}")
        # `podman untag IMAGE NAME` drops NAME alone (with no NAME it would drop every name).
        for args in (("tag", f"{location}/{REPOSITORY}:load", keep_name), ("untag", keep_name, f"{location}/{REPOSITORY}:load")):
            proc = loader.run(*args)
            if proc.returncode != 0:
                raise vm_image.BuildError(f"podman {args[0]} failed: {proc.stderr.strip()[-300:]}")
    finally:
        registry.stop()
        shutil.rmtree(directory / "podman-conf", ignore_errors=True)


def _forget_older(pod: Podman, version: str, keep_name: str) -> None:
    """Drop this release's images of other keys, and images left without a name, from ``pod``'s storage."""
    proc = pod.run("images", "--format", "{{.Repository}}:{{.Tag}}")
    for name in proc.stdout.split():
        if name.startswith(f"{KEEP_REPOSITORY}:{version}-") and name != keep_name:
            pod.run("rmi", name)  # another name of the same image (a run's) would stay: podman only untags then
    pod.run("image", "prune", "--force")


def build_images(versions: tuple[str, ...], vllm_python: Path, pod: Podman, root: Path | None = None) -> dict[str, EngineImage]:
    """The engine image of each vLLM release in ``versions``, loaded into ``pod``'s storage: from the
    cache, else built (layers written once, pulled through a registry stand-in, blobs deleted).
    Holds the cache lock.

    Args:
        versions: releases, ``X.Y.Z``.
        vllm_python: the vLLM parser venv's python (its packages are layer 2; its vLLM tree is
            layer 3 of the release it holds).
        pod: the podman to load them into.

    Returns:
        version -> EngineImage.

    Raises:
        vm_image.BuildError: a prerequisite is missing or a step failed (one line).
    """
    root = root or cache_root()
    base = standin_image.build_base_layer()  # the VM tier's; waits while `make test` builds it
    site, site_version = site_packages_of(vllm_python)
    built: dict[str, EngineImage] = {}
    with _lock(root):
        deps_id = deps_identity(site)
        deps_dir = root / f"packages-{deps_id[:16]}"
        deps: Layer | None = None
        try:
            for version in versions:
                tree = _tree(site, version, "parser venv") if site_version == version else wheel_tree(version, root)
                key = image_key(base, deps_id, tree, pod.driver)
                directory = root / f"image-{version}-{key}"
                keep_name = f"{KEEP_REPOSITORY}:{version}-{key}"
                info_path = directory / "build.json"
                if info_path.is_file():
                    info = json.loads(info_path.read_text())
                    if _stored(pod, keep_name, info["config_digest"]):
                        built[version] = EngineImage(version, key, _image_from_info(directory, info), keep_name, tree.site, info)
                        continue
                started = time.monotonic()
                shutil.rmtree(directory, ignore_errors=True)
                directory.mkdir(parents=True)
                _log(f"building the vllm {version} engine image {key} (vLLM from the {tree.origin}; packages of {site})")
                if deps is None:
                    deps = deps_layer(site, deps_dir / "layer.tar")
                top = vllm_layer(tree, directory / "vllm.tar")
                image = assemble([(base, OCI_LAYER_GZIP), (deps, OCI_LAYER), (top, OCI_LAYER)], version)
                config_digest = next(d for d, b in image.blobs.items() if isinstance(b, bytes))
                config = image.blobs[config_digest]
                assert isinstance(config, bytes)
                (directory / "manifest.json").write_bytes(image.manifest)
                (directory / "config.json").write_bytes(config)
                written = time.monotonic() - started
                _load_into_podman(pod, image, keep_name, directory)
                (directory / "vllm.tar").unlink()
                info = {"key": key, "version": version, "vllm_origin": tree.origin, "packages": str(site),
                        "base_layer": base.digest, "config_digest": config_digest, "manifest_digest": image.digest,
                        "layer_bytes": {"base": base.size_bytes, "packages": deps.size_bytes, "vllm": top.size_bytes},
                        "write_seconds": round(written, 1), "build_seconds": round(time.monotonic() - started, 1),
                        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "driver": pod.driver}
                info_path.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
                for old in root.glob(f"image-{version}-*"):
                    if old != directory:
                        shutil.rmtree(old, ignore_errors=True)
                _forget_older(pod, version, keep_name)
                _log(f"vllm {version} engine image {key}: built and loaded in {info['build_seconds']:.0f} s "
                     f"(layers {sum(info['layer_bytes'].values()) / 1e9:.2f} GB)")
                built[version] = EngineImage(version, key, _image_from_info(directory, info), keep_name, tree.site, info,
                                             built_now=True)
        finally:
            shutil.rmtree(deps_dir, ignore_errors=True)
    return built


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its waited-for children."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


# Runs engine_check.py as a child of the image's python and prints its report, then the child's CPU
# seconds (a container's processes are not this host's children: their time is read inside).
_TIMED_CHECK = ("import resource, subprocess, sys; p = subprocess.run([sys.executable, sys.argv[1]], stdout=subprocess.PIPE); "
                "r = resource.getrusage(resource.RUSAGE_CHILDREN); print(p.stdout.decode().strip().splitlines()[-1]); "
                "print(round(r.ru_utime + r.ru_stime, 1))")


def bench(versions: tuple[str, ...], vllm_python: Path, stack: str = "b300") -> dict:
    """Figures, not a test: CPU seconds of ``build_images`` (this process, pip and podman; cold when
    the cache is empty, see ``clean``) and, per image, of one check of ``stack``'s request inside it
    (the container's own count) and of the same check on this host (the parser venv's python on the
    same vLLM tree)."""
    from scripts.ops import engine_verify

    pod = podman()
    cpu, wall = _cpu_seconds(), time.monotonic()
    images = build_images(versions, vllm_python, pod)
    out: dict = {"build": {"cpu_seconds": round(_cpu_seconds() - cpu, 1), "wall_seconds": round(time.monotonic() - wall, 1),
                           "built": [v for v, i in images.items() if i.built_now]},
                 "checks": {}}
    for version, image in images.items():
        reference = f"{REPOSITORY}:v{version}"
        request = engine_verify.merged_request(engine_verify.stacks_for_image(reference, stack), reference)
        check_dir = engine_verify._check_dir()
        try:
            cmd = engine_verify.run_command(pod.path, image.keep_name, check_dir)
            cmd = [*cmd[: cmd.index(image.keep_name) + 1], "-c", _TIMED_CHECK, cmd[-1]]
            wall = time.monotonic()
            proc = subprocess.run(cmd, input=json.dumps(request), capture_output=True, text=True, check=False,
                                  env={**os.environ, **pod.env()}, timeout=1800)
            container_wall = time.monotonic() - wall
            lines = proc.stdout.strip().splitlines()
            cpu, wall = _cpu_seconds(), time.monotonic()
            host = subprocess.run([str(vllm_python), str(Path(check_dir) / "engine_check.py")],
                                  input=json.dumps({**request, "site_packages": str(image.site)}), capture_output=True,
                                  text=True, check=False, env={**os.environ, "PYTHONPATH": str(image.site)}, timeout=1800)
            host_cpu, host_wall = _cpu_seconds() - cpu, time.monotonic() - wall
        finally:
            shutil.rmtree(check_dir, ignore_errors=True)
        same = len(lines) == 2 and json.loads(lines[0])["checks"] == json.loads(host.stdout.strip().splitlines()[-1])["checks"]
        out["checks"][version] = {"container_cpu_seconds": float(lines[-1]) if len(lines) == 2 else None,
                                  "container_wall_seconds": round(container_wall, 1),
                                  "host_cpu_seconds": round(host_cpu, 1), "host_wall_seconds": round(host_wall, 1),
                                  "same_report": same}
    return out


def clean(root: Path | None = None) -> None:
    """Remove the cache: every image from its podman storage, then the directory."""
    root = root or cache_root()
    with _lock(root):
        if podman_here() is None:
            for driver in ("overlay", "vfs"):
                if (root / "podman" / driver).is_dir():
                    _podman_for(root, driver).run("rmi", "--all", "--force")
        for entry in root.iterdir():
            if entry.name != ".lock":
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def main(argv: list[str] | None = None) -> int:
    """``build`` or ``status``; exit 0 ok, 1 build failed, 2 usage."""
    parser = argparse.ArgumentParser(prog="python -m tests.engine_image", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("build", "status", "bench", "clean"),
                        help="build what is missing; show the cache; print the build's and the checks' CPU seconds; "
                             "empty the cache (then bench measures a cold build)")
    parser.add_argument("versions", nargs="*", default=list(VERSIONS), help=f"vLLM releases (default: {' '.join(VERSIONS)})")
    args = parser.parse_args(argv)
    from scripts.ops.vllm_parser import find_vllm_python

    if args.action == "status":
        infos = [json.loads(p.read_text()) for p in sorted(cache_root().glob("image-*/build.json"))]
        print(json.dumps({"cache": str(cache_root()), "images": infos}, indent=1, sort_keys=True))
        return 0
    if args.action == "clean":
        clean()
        return 0
    python = find_vllm_python()
    if python is None:
        print("engine-image: error: no vLLM parser venv (make vllm-parser)", file=sys.stderr)
        return 1
    try:
        if args.action == "bench":
            print(json.dumps(bench(tuple(args.versions), python), indent=1, sort_keys=True))
            return 0
        pod = podman()
        for version, built in build_images(tuple(args.versions), python, pod).items():
            print(json.dumps({"version": version, "key": built.key, "keep_name": built.keep_name}, sort_keys=True))
    except vm_image.BuildError as exc:
        print(f"engine-image: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
