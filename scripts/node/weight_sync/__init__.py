"""Fast, verified, resumable copy of a model checkpoint (hub -> S3 mirror -> NVMe or FSx).

Sources: hf://ORG/REPO@REV, modelscope://ORG/REPO@REV, s3://BUCKET/PREFIX (a mirror holding
manifest.json), file:///PATH. Destinations: a local directory, or s3://BUCKET/PREFIX (publishes
a mirror and its manifest.json). Every file is checked against the source's size and digest;
a file gets its final name only after both match; the completion marker is written last.

Modules: ``model`` (names, errors, manifest), ``retry`` (the one retry layer), ``hub`` (hub errors
a user can act on), ``progress``, ``verify`` (the sink that hashes/checksums as bytes arrive, stall
detection, manifest comparison), ``fsio`` (durability helpers), ``sources``, ``destinations``,
``cli``. Run as ``python -m scripts.node.weight_sync``, ``kimi-deploy sync``, or on a node as
``python3 /opt/kimi-deploy/weight_sync.pyz`` (one deterministic zipapp of this package built by
``components/sync_artifact.py``: same source, same bytes, same sha256).

Design for speed (docs/weight-sync.md, "Design for speed"):

- sha256 is verified once per file, when the mirror is filled from the hub; publishing records
  each file's object checksums (crc32; crc64nvme with awscrt) in manifest.json and uploads with
  ``ChecksumAlgorithm`` so S3 stores its own. The mirror -> node copy checks size + that checksum
  (S3's value validated in flight by botocore with ``ChecksumMode=ENABLED`` when it matches the
  manifest, else computed by the sink), not sha256; ``--verify sha256`` keeps the full hash.
- The resume of a complete copy of a pinned source (a commit in the URI) is checked locally
  (marker, manifest digest, sizes) without importing boto3 (``LocalDestination._complete_pinned_copy``).
- dir -> dir from a verified copy (a directory with this program's marker matching its manifest)
  uses ``os.copy_file_range`` without hashing; other directories are hashed while copied.
- One retry layer (``retry.py``): no client below it retries.
- The completion marker is still written last, after one syncfs: vLLM never starts on partial weights.
- A hub branch (``hf://ORG/REPO@main``) is resolved once, by the publish that fills the mirror; its
  marker records the commit and later publishes over that complete mirror keep it without asking
  the hub (``S3Destination``; ``--follow-branch`` asks again), so serve loads what staging resolved.

Only the standard library is imported at package import (boto3, botocore, huggingface_hub,
modelscope and awscrt are imported where used), so ``import scripts.node.weight_sync`` is cheap and
a resume over a complete copy never loads boto3. Exit codes: 0 ok, 1 a check or transfer failed,
2 usage error.
"""
from __future__ import annotations

from .cli import build_parser, main, run
from .destinations import Destination, LocalDestination, S3Destination, Summary, marker_document
from .fsio import syncfs, write_json_atomic
from .hub import hub_error_message
from .model import (
    JOURNAL_NAME,
    MANIFEST_NAME,
    MARKER_NAME,
    S3_PART_CONCURRENCY,
    STATE_DIR_NAME,
    FileEntry,
    IntegrityError,
    SyncError,
    TransientError,
    UsageError,
    disk_free_bytes,
    human_bytes,
    manifest_digest,
    manifest_document,
    parse_manifest,
    validate_relative_path,
)
from .retry import RETRY_ATTEMPTS, describe, is_transient, with_retries
from .sources import FileSource, HfSource, ModelScopeSource, S3Source, Source, make_source
from .verify import Sink, hash_file

__all__ = [
    "JOURNAL_NAME", "MANIFEST_NAME", "MARKER_NAME", "RETRY_ATTEMPTS", "S3_PART_CONCURRENCY", "STATE_DIR_NAME",
    "Destination", "FileEntry", "FileSource", "HfSource", "IntegrityError", "LocalDestination", "ModelScopeSource",
    "S3Destination", "S3Source", "Sink", "Source", "Summary", "SyncError", "TransientError", "UsageError",
    "build_parser", "describe", "disk_free_bytes", "hash_file", "hub_error_message", "human_bytes", "is_transient", "main",
    "make_source", "manifest_digest", "manifest_document", "marker_document", "parse_manifest", "run", "syncfs",
    "validate_relative_path", "with_retries", "write_json_atomic",
]
