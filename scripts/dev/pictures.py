"""Draw what a stack builds, from the stacks themselves: the EC2 boot chain (b300's systemd units),
the EKS layout (gb300's and b300-prod's resources) and the stage-then-serve timeline (b300's
modelled phases), as PNGs in docs/pictures/.

Each picture is drawn from a manifest: the resources, units or phases it shows, read from the real
program run under Pulumi's mocks (``components.plan_engine.run_program``, as the offline plan does)
at the fixed clock of the docs. The manifest is written beside the picture (``<name>.json``) and
its sha256 is stored in the PNG's text chunk ``kimi-deploy-manifest-sha256``: ``tests/test_pictures.py``
recomputes every manifest and fails when a picture no longer matches the resources it shows
(a unit, node group, workload or phase added, removed or renamed, a phase's modelled seconds changed).

    python scripts/dev/pictures.py --write     # redraw every picture (graphviz + diagrams, matplotlib)
    python scripts/dev/pictures.py --check     # exit 1 naming each picture whose manifest is stale

Drawing uses ``diagrams`` (cloud diagrams as code; the ``dot`` program of Debian's graphviz) for the
boot chain and the EKS layout and ``matplotlib`` for the timeline. Exit status: 0 ok, 1 stale
(``--check``) or a drawing tool missing, 2 usage.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
PICTURES_DIR = REPO_ROOT / "docs" / "pictures"
# The clock the pictures are drawn at (expiry dates in resource inputs depend on it).
PICTURE_NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
MANIFEST_KEY = "kimi-deploy-manifest-sha256"
SYSTEMD_DIR = "/etc/systemd/system/"


@contextlib.contextmanager
def _shipped_stacks() -> Iterator[None]:
    """The stacks as shipped: no ``KIMI_DEPLOY_CONFIG_OVERLAY`` while a manifest is computed."""
    from components.core.config import CONFIG_OVERLAY_ENV

    saved = os.environ.pop(CONFIG_OVERLAY_ENV, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[CONFIG_OVERLAY_ENV] = saved


def _run(stack: str):
    from components.core.config import read_stack_config
    from components.plan_engine import run_program

    with _shipped_stacks():
        return run_program(read_stack_config(stack), stack=stack, now=PICTURE_NOW, allow_blockers=True)


def _parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file -> section -> key -> values (repeated keys kept, space-separated lists split)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            out.setdefault(section, {})
            continue
        key, _, value = line.partition("=")
        out.setdefault(section, {}).setdefault(key.strip(), []).extend(value.split())
    return out


def boot_chain_manifest() -> dict[str, Any]:
    """b300's GPU instance: every systemd unit its user data writes, and the ordering and start
    edges between them (``After=``/``Requires=``/``Wants=``/``OnFailure=`` to another of these units,
    and ``systemctl start X`` in an ``ExecStart*=`` line: how the weights unit starts vLLM)."""
    import yaml

    run = _run("b300")
    template = next(r for r in run.resources if r.type == "aws:ec2/launchTemplate:LaunchTemplate")
    cloud_config = yaml.safe_load(base64.b64decode(template.inputs["userData"]).decode())
    units = {f["path"].rsplit("/", 1)[1]: _parse_unit(f["content"]) for f in cloud_config["write_files"]
             if f["path"].startswith(SYSTEMD_DIR) and "/" not in f["path"][len(SYSTEMD_DIR):]}
    edges: set[tuple[str, str, str]] = set()
    for name, unit in units.items():
        for key in ("After", "Requires", "Wants", "BindsTo", "OnFailure"):
            for other in unit.get("Unit", {}).get(key, []):
                if other in units and other != name:
                    # "A then B" for ordering; "B wants A" (and the others) from the unit that names them.
                    edges.add((other, name, "then") if key == "After" else (name, other, key.lower()))
        for key, values in unit.get("Service", {}).items():
            if key.startswith("ExecStart") and "start" in values:
                for other in values[values.index("start") + 1:]:
                    if other in units:
                        edges.add((name, other, "starts"))
        if "Timer" in unit:
            # A timer without Unit= starts the service of its own name (systemd.timer(5)): kimi-watch.timer
            # was drawn alone.
            for other in unit["Timer"].get("Unit", []) or [name.removesuffix(".timer") + ".service"]:
                if other in units:
                    edges.add((name, other, "triggers"))
    described = {n: " ".join(u.get("Unit", {}).get("Description", [])) or _timer_schedule(u)
                 for n, u in sorted(units.items())}
    return {"stack": "b300", "resource": template.name, "units": described,
            "edges": [list(e) for e in sorted(edges)]}


def _timer_schedule(unit: dict[str, dict[str, list[str]]]) -> str:
    """A timer unit's schedule in words (``OnBootSec=60 OnUnitActiveSec=60`` -> ``60 s after boot,
    then every 60 s``); "" for a unit that is no timer."""
    timer = unit.get("Timer", {})
    words = [f"{' '.join(timer[key])} s {what}" for key, what in (("OnBootSec", "after boot"),
                                                                ("OnUnitActiveSec", "after each run"))
             if key in timer]
    words += [f"at {' '.join(timer['OnCalendar'])}"] if "OnCalendar" in timer else []
    return ", then ".join(words)


def _gpu_instance_type(run) -> str:
    spec = run.context.spec
    return str(spec.instance.instance_type)


def eks_layout_manifest() -> dict[str, Any]:
    """gb300 and b300-prod on EKS: per stack the node groups (instance type, desired/max size), the
    workloads (LeaderWorkerSet leader/worker or Deployment, weight-sync Job), the Service and its
    type, the NetworkPolicy, the ComputeDomain, the S3 mirror and the FSx file system when declared."""
    stacks: dict[str, Any] = {}
    for stack in ("gb300", "b300-prod"):
        run = _run(stack)
        shown: dict[str, list[dict[str, Any]]] = {}

        def add(group: str, res, shown: dict[str, list[dict[str, Any]]] = shown, **facts: Any) -> None:
            shown.setdefault(group, []).append({"name": res.name, "type": res.type, **facts})

        for res in run.resources:
            inputs = res.inputs
            if res.type == "aws:eks/nodeGroup:NodeGroup":
                scaling = inputs.get("scalingConfig") or {}
                types = inputs.get("instanceTypes") or [_gpu_instance_type(run)]
                add("node_groups", res, instance_types=types, desired=scaling.get("desiredSize"), max=scaling.get("maxSize"),
                    gpu=_gpu_instance_type(run) in types)
            elif res.type == "aws:eks/cluster:Cluster":
                add("cluster", res, version=inputs.get("version"))
            elif res.type == "aws:s3/bucket:Bucket":
                add("mirror", res)
            elif res.type == "aws:fsx/lustreFileSystem:LustreFileSystem":
                add("fsx", res, capacity_gib=inputs.get("storageCapacity"), deployment=inputs.get("deploymentType"))
            elif res.type == "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation":
                add("fsx_association", res, path=inputs.get("dataRepositoryPath"))
            elif res.type == "aws:ec2/natGateway:NatGateway":
                add("nat", res)
            elif res.type.endswith(":LeaderWorkerSet"):
                spec = inputs["spec"]
                template = spec["leaderWorkerTemplate"]
                add("workloads", res, kind="LeaderWorkerSet", replicas=spec.get("replicas"),
                    group_size=template.get("size"),
                    claims={role: sorted(c["resourceClaimTemplateName"] for c in
                                         ((template.get(f"{role}Template") or {}).get("spec") or {}).get("resourceClaims") or [])
                            for role in ("leader", "worker")})
            elif res.type == "kubernetes:apps/v1:Deployment":
                add("workloads", res, kind="Deployment", replicas=inputs["spec"].get("replicas"))
            elif res.type == "kubernetes:batch/v1:Job":
                add("jobs", res)
            elif res.type == "kubernetes:core/v1:Service":
                annotations = (inputs.get("metadata") or {}).get("annotations") or {}
                lb = annotations.get("service.beta.kubernetes.io/aws-load-balancer-scheme")
                add("services", res, service_type=inputs["spec"].get("type"), scheme=lb)
            elif res.type == "kubernetes:networking.k8s.io/v1:NetworkPolicy":
                add("network_policies", res)
            elif res.type.endswith(":ComputeDomain"):
                channel = ((inputs.get("spec") or {}).get("channel") or {}).get("resourceClaimTemplate") or {}
                add("compute_domains", res, kind=res.type.split(":")[1] + "/ComputeDomain",
                    claim_template=channel.get("name"))
        # Registration order is not stable (the program registers resources from async callbacks): by name.
        shown = {group: sorted(items, key=lambda r: (r["name"], r["type"])) for group, items in sorted(shown.items())}
        stacks[stack] = {"target": run.context.spec.target.name, "shown": shown}
    return {"stacks": stacks}


def timeline_manifest() -> dict[str, Any]:
    """b300's stage-then-serve against one `pulumi up`: each scenario's phases (name, start, seconds,
    on the critical path) as the offline plan models them, and the money figures it prints."""
    from scripts.ops.plan import build_plan_document

    with _shipped_stacks():
        doc = build_plan_document("b300", now=PICTURE_NOW)
    sts = doc["stage_then_serve"]

    def phases(scenario: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"name": p["name"], "start_seconds": p["start_seconds"], "seconds": p["seconds"]}
                for p in scenario["phases"]]

    return {"stack": "b300", "single_up": phases(sts["single_up"]), "stage": phases(sts["stage"]),
            "serve": phases(sts["serve"]), "switch_at_seconds": sts["switch_at_seconds"],
            "single_up_gpu_usd": sts["single_up"]["gpu_usd"], "serve_gpu_usd": sts["serve"]["gpu_usd"],
            "staging_usd": sts["staging_usd"], "gpu_usd_saved": sts["gpu_usd_saved"]}


def manifest_digest(manifest: dict[str, Any]) -> str:
    """sha256 (hex) of the manifest's canonical JSON."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _stamp_png(path: Path, digest: str) -> None:
    """Rewrite ``path`` with the manifest digest in a PNG text chunk (Pillow, matplotlib's dependency)."""
    from PIL import Image, PngImagePlugin

    with Image.open(path) as image:
        image.load()
        info = PngImagePlugin.PngInfo()
        info.add_text(MANIFEST_KEY, digest)
        image.save(path, pnginfo=info)


def png_digest(path: Path) -> str | None:
    """The manifest digest stored in the PNG at ``path``, or None."""
    from PIL import Image

    with Image.open(path) as image:
        return image.text.get(MANIFEST_KEY) if hasattr(image, "text") else None


def draw_boot_chain(manifest: dict[str, Any], out: Path) -> None:
    """The units as a left-to-right graph; solid arrows order or start, dashed arrows on failure."""
    from diagrams import Diagram, Edge
    from diagrams.generic.compute import Rack
    from diagrams.onprem.compute import Server

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "boot"
        with Diagram("b300: the GPU instance's boot chain (systemd units of the EC2 user data)", filename=str(base),
                     outformat="png", show=False, direction="LR",
                     graph_attr={"fontsize": "20", "splines": "spline", "nodesep": "1.2", "ranksep": "1.8"}):
            nodes = {}
            for name, description in manifest["units"].items():
                icon = Server if name.endswith(".service") else Rack
                nodes[name] = icon(f"{name}\n" + textwrap.fill(description.removeprefix("kimi-deploy: "), 30))
            for src, dst, kind in manifest["edges"]:
                style = "dashed" if kind in ("onfailure", "wants", "requires", "bindsto") else "solid"
                color = {"starts": "darkgreen", "triggers": "purple", "onfailure": "firebrick"}.get(kind, "gray30")
                nodes[src] >> Edge(label=kind, style=style, color=color) >> nodes[dst]
        shutil.move(str(base) + ".png", out)


def draw_eks_layout(manifest: dict[str, Any], out: Path) -> None:
    """One cluster box per stack: node groups, the LeaderWorkerSet or Deployment, the Service and its
    NetworkPolicy, the ComputeDomain (a custom resource, not a pod: the DRA driver's IMEX channel,
    claimed by each pod of the group), the weight-sync Job, the mirror, FSx and the NAT gateway.

    Edges use graphviz's curved splines: with ``ortho`` (diagrams' default) edges between clusters
    ended beside their nodes, in empty space."""
    from diagrams import Cluster, Diagram, Edge
    from diagrams.aws.compute import EC2, EKS
    from diagrams.aws.network import NATGateway
    from diagrams.aws.storage import S3, Fsx
    from diagrams.k8s.compute import Job, Pod
    from diagrams.k8s.network import SVC, Netpol
    from diagrams.k8s.others import CRD

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "eks"
        with Diagram("The EKS stacks: what `pulumi up` builds", filename=str(base), outformat="png", show=False,
                     direction="LR", graph_attr={"fontsize": "20", "splines": "spline", "nodesep": "0.6",
                                                 "ranksep": "1.2"}):
            for stack, doc in manifest["stacks"].items():
                shown = doc["shown"]
                with Cluster(f"{stack} ({doc['target']})"):
                    mirror = S3("S3 mirror\n" + ", ".join(r["name"] for r in shown.get("mirror", [])))
                    nat = [NATGateway(f"{r['name']}\n(hub download egress)") for r in shown.get("nat", [])]
                    with Cluster("EKS " + ", ".join(f"{r['name']} {r.get('version') or ''}" for r in shown.get("cluster", []))):
                        eks = EKS("control plane")
                        groups = {r["name"]: (EC2(f"{r['name']}\n{', '.join(r['instance_types'])}\n"
                                                  f"{r['desired']} (max {r['max']})"), r["gpu"])
                                  for r in shown.get("node_groups", [])}
                        gpu_groups = [node for node, gpu in groups.values() if gpu]
                        for node, _ in groups.values():
                            eks >> Edge(style="dotted", label="node group") >> node
                        pods = []
                        for r in shown.get("workloads", []):
                            if r["kind"] == "LeaderWorkerSet":
                                with Cluster(f"LeaderWorkerSet {r['name']}: {r['replicas']} copy x {r['group_size']} pods"):
                                    leader, worker = Pod("leader (rank 0)"), Pod("worker")
                                    leader >> Edge(label="TP over NVLink") >> worker
                                serving, role_pods = leader, {"leader": leader, "worker": worker}
                                for cd in shown.get("compute_domains", []):
                                    domain = CRD(f"{cd['kind']}\n{cd['name']}\n(IMEX channel)")
                                    for role, pod in role_pods.items():
                                        if cd["claim_template"] in r["claims"].get(role, []):
                                            domain >> Edge(style="dashed", label="resource claim") >> pod
                                pods += [leader, worker]
                            else:
                                serving = Pod(f"Deployment {r['name']}\n{r['replicas']} replicas")
                                pods.append(serving)
                            for svc in shown.get("services", []):
                                scheme = f" ({svc['scheme']} NLB)" if svc.get("scheme") else ""
                                SVC(f"{svc['name']}\n{svc['service_type']}{scheme}") >> serving
                            for pol in shown.get("network_policies", []):
                                Netpol(pol["name"]) >> Edge(style="dashed", label="allows") >> serving
                        for group in gpu_groups:
                            for pod in pods:
                                group >> Edge(style="dotted", label="runs") >> pod
                        for job in shown.get("jobs", []):
                            Job(job["name"]) >> Edge(label="publish") >> mirror
                    for n in nat:
                        for node, _ in groups.values():
                            node >> Edge(style="dotted") >> n
                    for fsx in shown.get("fsx", []):
                        f = Fsx(f"FSx {fsx['deployment']}\n{fsx['capacity_gib']} GiB")
                        mirror >> Edge(label="import") >> f
                        for group in gpu_groups:
                            f >> Edge(label="mount") >> group
                    if not shown.get("fsx"):
                        for group in gpu_groups:
                            mirror >> Edge(label="copy to NVMe") >> group
        shutil.move(str(base) + ".png", out)


def draw_timeline(manifest: dict[str, Any], out: Path) -> None:
    """Three bars of phases (hours): one `pulumi up`, the stager, the serving stack after the switch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [("one `pulumi up` (GPU waits)", manifest["single_up"], 0.0),
            ("stage: the stager fills the mirror", manifest["stage"], 0.0),
            ("serve: GPU from the switch", manifest["serve"], float(manifest["switch_at_seconds"]))]
    names = sorted({p["name"] for _, phases, _ in rows for p in phases})
    cmap = plt.get_cmap("tab20")
    colors = {name: cmap(i % 20) for i, name in enumerate(names)}
    fig, ax = plt.subplots(figsize=(11, 3.8), dpi=110)
    for y, (_label, phases, offset) in enumerate(rows):
        for p in phases:
            ax.barh(y, p["seconds"] / 3600, left=(offset + p["start_seconds"]) / 3600, color=colors[p["name"]],
                    edgecolor="white", height=0.6)
    ax.axvline(manifest["switch_at_seconds"] / 3600, color="black", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("hours after the first `pulumi up`")
    ax.set_title(f"b300: stage, then serve (GPU USD {manifest['serve_gpu_usd']:,.2f} + staging USD "
                 f"{manifest['staging_usd']:,.2f}) against one `pulumi up` (GPU USD {manifest['single_up_gpu_usd']:,.2f})")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[n]) for n in names]
    ax.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(out, metadata={"Software": None})
    plt.close(fig)


PICTURES: dict[str, tuple[Callable[[], dict[str, Any]], Callable[[dict[str, Any], Path], None]]] = {
    "ec2-boot-chain": (boot_chain_manifest, draw_boot_chain),
    "eks-layout": (eks_layout_manifest, draw_eks_layout),
    "stage-then-serve": (timeline_manifest, draw_timeline),
}


def stale_pictures(directory: Path = PICTURES_DIR) -> list[str]:
    """Names of the pictures whose manifest, recomputed from the stacks, differs from the one drawn
    (the JSON beside the PNG and the digest inside it)."""
    stale = []
    for name, (make_manifest, _) in PICTURES.items():
        manifest = make_manifest()
        png, doc = directory / f"{name}.png", directory / f"{name}.json"
        if not png.exists() or not doc.exists():
            stale.append(name)
            continue
        if json.loads(doc.read_text()) != json.loads(json.dumps(manifest)) or png_digest(png) != manifest_digest(manifest):
            stale.append(name)
    return stale


def write_pictures(directory: Path = PICTURES_DIR, names: tuple[str, ...] = tuple(PICTURES)) -> None:
    """Recompute each manifest and redraw its picture."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        make_manifest, draw = PICTURES[name]
        manifest = json.loads(json.dumps(make_manifest()))
        png = directory / f"{name}.png"
        draw(manifest, png)
        _stamp_png(png, manifest_digest(manifest))
        (directory / f"{name}.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        print(f"pictures: wrote {png.relative_to(REPO_ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/dev/pictures.py", description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", action="store_true", help="redraw every picture")
    group.add_argument("--check", action="store_true", help="exit 1 naming each stale picture")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pictures()
        for name in stale:
            print(f"pictures: docs/pictures/{name}.png no longer matches the stacks: run python scripts/dev/pictures.py --write",
                  file=sys.stderr)
        return 1 if stale else 0
    if shutil.which("dot") is None:
        print("pictures: graphviz's `dot` is missing (apt-get install graphviz)", file=sys.stderr)
        return 1
    write_pictures()
    return 0


if __name__ == "__main__":
    sys.exit(main())
