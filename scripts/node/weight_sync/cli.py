"""The command line: ``python3 weight_sync.pyz ...``, ``python -m scripts.node.weight_sync ...`` and
``kimi-deploy sync ...`` all end in ``main``."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from . import metrics, verify
from .destinations import LocalDestination, S3Destination, Summary
from .model import MARKER_NAME, S3_PART_BYTES, S3_PART_CONCURRENCY, S5CMD_MIN_BYTES, SyncError, UsageError, human_bytes
from .retry import describe
from .sources import make_source


class _Parser(argparse.ArgumentParser):
    """argparse without abbreviated flags, whose usage errors are one line on stderr and exit 2
    (this file stays self-contained: the same behaviour as scripts/ops/_cli.py's CliParser)."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message):
        if message.startswith("unrecognized arguments: "):  # values may be secrets: flag names only
            message = "unrecognized arguments: " + (" ".join(
                t.split("=", 1)[0] for t in message.split(": ", 1)[1].split() if t.startswith("-")) or "(no flag)")
        self.exit(2, f"weight_sync: usage error: {' '.join(message.split())} (see --help)\n")

# ---------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; --help explains every flag."""
    p = _Parser(
        # "kimi-deploy sync" when dispatched by the kimi-deploy command (scripts/cli.py sets argv[0]).
        prog=sys.argv[0] if sys.argv and sys.argv[0].startswith("kimi-deploy ") else "weight_sync",
        description="Copy a model checkpoint with per-file size and sha256 verification, resuming "
                    "where an interrupted run stopped. The destination gets " + MARKER_NAME +
                    " only when every file is verified. Exit codes: 0 ok, 1 a check or transfer "
                    "failed, 2 usage error. Secrets come from the environment only (HF_TOKEN, "
                    "MODELSCOPE_API_TOKEN, AWS_*); AWS_ENDPOINT_URL and HF_ENDPOINT are honoured.")
    p.add_argument("--source", required=True, metavar="URI",
                   help="where the checkpoint is: hf://ORG/REPO@REV (a branch is resolved to its commit), "
                        "modelscope://ORG/REPO@REV, s3://BUCKET/PREFIX (a mirror with manifest.json), or "
                        "file:///PATH (a directory; its manifest.json is used when present)")
    p.add_argument("--dest", required=True, metavar="DIR_OR_URI",
                   help="a local directory (NVMe, FSx), or s3://BUCKET/PREFIX to publish a mirror "
                        "with manifest.json")
    p.add_argument("--workers", type=int, default=8, metavar="N",
                   help="files transferred at once (default 8); each S3 file also uses "
                        f"{S3_PART_CONCURRENCY} parallel ranged GETs of {S3_PART_BYTES >> 20} MiB")
    p.add_argument("--verify", choices=("fast", "sha256", "full"), default="fast",
                   help="fast (default): trust a marker whose manifest digest matches and files this "
                        "program already verified (same size and mtime); a complete copy of a pinned "
                        "source (a commit) is checked locally without contacting the source; files "
                        "from a verified copy (a directory with this program's marker) are copied "
                        "without hashing (sizes checked). sha256: hash every byte transferred against "
                        "the manifest. full: as sha256, and re-hash every file already in the "
                        "destination.")
    p.add_argument("--json", action="store_true",
                   help="print a JSON summary on stdout at the end (bytes, seconds, files "
                        "transferred, skipped and verified, throughput)")
    p.add_argument("--s3-client", choices=("auto", "s5cmd", "boto3"), default="auto",
                   help="S3 download client for s3:// sources: auto (s5cmd, if on PATH, for objects of "
                        f"{S5CMD_MIN_BYTES >> 20} MiB or more; boto3's transfer manager, CRT when installed, "
                        "for the rest), or force one for every object")
    p.add_argument("--staging-dir", metavar="DIR", default=None,
                   help="with an s3:// destination, local directory for verifying hub files before "
                        "upload (default: the system temporary directory); needs workers x largest file")
    p.add_argument("--source-wait-seconds", type=float, default=0.0, metavar="S",
                   help="with a file:// source fed by an import (FSx for Lustre linked to the S3 mirror by a data "
                        "repository association, whose files appear asynchronously and in any order): wait up to S "
                        "seconds in all for its marker, manifest.json and each listed file at its listed size, then "
                        "fail naming the file not imported (default 0: a missing file fails at once)")
    p.add_argument("--follow-branch", action="store_true",
                   help="with a branch in an hf:// or modelscope:// --source (ORG/REPO@main) and an s3:// --dest: ask "
                        "the hub what the branch points to now and publish that commit if it moved. By default a "
                        "branch is resolved once, by the run that fills the mirror, whose marker records the commit; "
                        "later runs over that complete mirror keep it without asking the hub, so serve loads the "
                        "commit staging resolved")
    p.add_argument("--quiet", action="store_true", help="no progress output (errors are still printed)")
    p.add_argument("--check-local", action="store_true",
                   help="only check, from local evidence, that the local --dest holds a complete copy made "
                        "from --source (its marker, manifest.json, and every file unchanged since verified: "
                        "size, mtime and sha256 in the journal); contacts nothing and reads no weight bytes. "
                        "Exit 0 when complete, 1 with the first difference otherwise (a node's boot uses it "
                        "to serve its copy when the hub, the mirror or the registry is down)")
    p.add_argument("--min-bytes-per-second", type=int, default=verify.MIN_BYTES_PER_SECOND, metavar="N",
                   help="abandon and retry a file transfer slower than N bytes/s over a window "
                        f"(default {verify.MIN_BYTES_PER_SECOND:,}; 0 = off)")
    p.add_argument("--throughput-window-seconds", type=float, default=verify.THROUGHPUT_WINDOW_SECONDS, metavar="S",
                   help=f"the window of --min-bytes-per-second (default {verify.THROUGHPUT_WINDOW_SECONDS:g} s)")
    return p


def run(args: argparse.Namespace) -> Summary:
    """Run one sync from parsed arguments. Raises UsageError, SyncError."""
    for flag, value in (("--source", args.source), ("--dest", args.dest)):
        if not value.strip() or value != value.strip():  # '' would mean the current directory
            raise UsageError(f"{flag} {value!r}: must be a non-empty URI or path without surrounding spaces")
    if args.workers < 1 or args.workers > 256:
        raise UsageError(f"--workers {args.workers}: must be between 1 and 256")
    if args.min_bytes_per_second < 0 or args.throughput_window_seconds <= 0:
        raise UsageError("--min-bytes-per-second must be >= 0 and --throughput-window-seconds > 0")
    verify.MIN_BYTES_PER_SECOND = args.min_bytes_per_second  # read by every Sink of this run
    verify.THROUGHPUT_WINDOW_SECONDS = args.throughput_window_seconds
    if args.source_wait_seconds < 0:
        raise UsageError(f"--source-wait-seconds {args.source_wait_seconds:g}: must be >= 0")
    check_not_nested(args.source, args.dest)
    source = make_source(args.source, args.s3_client, args.workers, args.source_wait_seconds)

    def log(message: str) -> None:
        sys.stderr.write(f"weight_sync: {message}\n")
        sys.stderr.flush()

    common = dict(source=source, workers=args.workers, verify=args.verify, log=log, progress_enabled=not args.quiet)
    if args.dest.startswith("s3://"):
        if args.check_local:
            raise UsageError(f"--check-local needs a local --dest, not {args.dest!r}")
        dest: S3Destination | LocalDestination = S3Destination(args.dest, args.staging_dir, follow_branch=args.follow_branch,
                                                               **common)
    elif "://" in args.dest:
        raise UsageError(f"--dest {args.dest!r}: expected a local directory or s3://BUCKET/PREFIX")
    elif args.follow_branch:
        raise UsageError(f"--follow-branch applies to an s3:// --dest (a mirror), not {args.dest!r}")
    else:
        dest = LocalDestination(args.dest, **common)
    if args.check_local:
        assert isinstance(dest, LocalDestination)  # refused above for s3://
        return check_local(dest)
    started = time.monotonic()
    summary = dest.run()
    summary.seconds = time.monotonic() - started
    return summary


def _tree(uri: str) -> tuple[str, tuple[str, ...]] | None:
    """``(where, path parts)`` of a local or S3 location (``s3`` + bucket, or ``file``), parts
    normalized (``.``/``..`` and symlinks of existing local directories resolved); None for a hub."""
    if uri.startswith("s3://"):
        bucket, _, prefix = uri[5:].partition("/")
        return f"s3://{bucket}", tuple(p for p in prefix.split("/") if p)
    if "://" in uri and not uri.startswith("file://"):
        return None
    path = os.path.realpath(uri[7:] if uri.startswith("file://") else uri)
    return "file", tuple(p for p in path.split(os.sep) if p)


def check_not_nested(source: str, dest: str) -> None:
    """``--dest`` is neither ``--source`` nor inside it, nor its parent: a copy into its own source
    would list and read the files it is writing (and its marker and partial files would land in the
    source's listing); a copy into the source's parent mixes the two trees.

    Raises:
        UsageError: the two locations overlap (one line naming both).
    """
    a, b = _tree(source), _tree(dest)
    if a is None or b is None or a[0] != b[0]:
        return
    (_, src), (_, dst) = a, b
    if dst[:len(src)] == src:
        where = "is --source itself" if dst == src else "is inside --source"
        raise UsageError(f"--dest {dest!r} {where} {source!r}: the copy would read what it writes; give a destination "
                         "outside the source")
    if src[:len(dst)] == dst:
        raise UsageError(f"--dest {dest!r} holds --source {source!r}: the copy would write beside the files it reads; "
                         "give a destination outside the source")


class IncompleteCopy(SyncError):
    """``--check-local`` found the local copy incomplete or changed (exit 1; not an error of the
    program: the caller then runs the sync)."""


def check_local(dest: LocalDestination) -> Summary:
    """``--check-local``: the summary of a complete local copy (every file skipped).

    Raises:
        IncompleteCopy: the copy is incomplete or changed since verified (the message says which
            file or what is missing).
    """
    problem, revision, entries = dest.local_copy_problem()
    if problem is not None:
        raise IncompleteCopy(f"{dest.root} is not a complete verified copy of {dest.source.uri}: {problem}")
    return Summary(dest.source.uri, dest.root, revision=revision, files_total=len(entries), files_skipped=len(entries),
                   bytes_total=sum(e.size_bytes for e in entries))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (0 ok, 1 failure, 2 usage)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        metrics.serve_from_env()
    except (ValueError, OSError) as exc:  # progress metrics are for the operator: never a reason not to copy
        print(f"weight_sync: warning: no /metrics ({exc})", file=sys.stderr)
    try:
        summary = run(args)
    except UsageError as exc:
        print(f"weight_sync: usage error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("weight_sync: interrupted; completed files are kept, run again to resume", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:  # run outside the venv / image: say how to install, exit 2
        print(f"weight_sync: error: the Python module {exc.name!r} is not installed for {sys.executable}: "
              "run `make setup` (or `pip install -r requirements.txt`) and use .venv/bin/python", file=sys.stderr)
        return 2
    except IncompleteCopy as exc:
        print(f"weight_sync: check-local: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # permanent failures end in one clear line, not a traceback
        if os.environ.get("WEIGHT_SYNC_DEBUG"):
            raise
        print(f"weight_sync: error: {describe(exc)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary.as_json(), sort_keys=True))
    else:
        s = summary.as_json()
        rows = [("source", s["source"]), ("dest", s["dest"]), ("revision", s["revision"]),
                ("files", f"{s['files_total']} ({s['files_transferred']} transferred, {s['files_skipped']} "
                          f"skipped, {s['files_verified']} verified)"),
                ("bytes", f"{human_bytes(s['bytes_transferred'])} of {human_bytes(s['bytes_total'])}"),
                ("time", f"{s['seconds']:.1f} s at {human_bytes(s['throughput_bytes_per_second'])}/s")]
        print("\n".join(f"{k:<9} {v}" for k, v in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
