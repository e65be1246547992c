"""Destinations: a local directory (NVMe, FSx) and an S3 mirror (publish)."""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import shutil
import tempfile
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

from .fsio import fsync_dir, syncfs, write_json_atomic
from .model import (
    HEX40,
    JOURNAL_NAME,
    MANIFEST_NAME,
    MARKER_NAME,
    S3_PART_BYTES,
    S3_PART_CONCURRENCY,
    STATE_DIR_NAME,
    FileEntry,
    SyncError,
    UsageError,
    disk_free_bytes,
    human_bytes,
    manifest_digest,
    manifest_document,
    parse_manifest,
    validate_relative_path,
)
from .progress import Progress
from .retry import with_retries
from .sources import (
    NO_RETRY_TRANSFER,
    FileSource,
    HfSource,
    ModelScopeSource,
    Source,
    parse_s3_uri,
    pinned_revision,
    read_json_or_none,
    resolve_nonempty,
    s3_client,
    s3_key,
)
from .verify import (
    CHECKSUM_BYTES,
    Sink,
    _WriteOnly,
    check_bytes,
    checksum_functions,
    copy_file,
    digest_file,
    fetch_verified,
    hash_file,
)

# LocalDestination makes its files durable in batches (one syncfs per batch, not an fsync per
# file); a batch ends after this many bytes and at the end of the run. See LocalDestination.
SYNC_EVERY_BYTES = 16 << 30


@dataclasses.dataclass
class Summary:
    """Outcome of one run; `as_json()` is what --json prints."""

    source: str
    dest: str
    revision: str = ""
    files_total: int = 0
    files_transferred: int = 0
    files_skipped: int = 0
    files_verified: int = 0
    bytes_total: int = 0
    bytes_transferred: int = 0
    seconds: float = 0.0

    def as_json(self) -> dict:
        doc = dataclasses.asdict(self)
        doc["seconds"] = round(self.seconds, 3)
        doc["throughput_bytes_per_second"] = int(self.bytes_transferred / self.seconds) if self.seconds else 0
        return doc


class Destination:
    """Common run logic: resolve, fast path on a matching marker, classify, transfer, mark."""

    def __init__(self, source: Source, workers: int, verify: str, log, progress_enabled: bool):
        self.source, self.workers, self.verify, self.log = source, workers, verify, log
        self.progress_enabled = progress_enabled

    def _run_pool(self, items, fn) -> list:
        """fn over items with `workers` threads; the first exception cancels the rest and is raised."""
        results = []
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            futures = [pool.submit(fn, item) for item in items]
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for f in pending:
                f.cancel()
            for f in futures:
                if f.done() and not f.cancelled() and (exc := f.exception()):
                    raise exc
            results = [f.result() for f in futures]
        return results


class LocalDestination(Destination):
    """A local directory (NVMe RAID0, FSx). Layout: files at their relative paths, manifest.json,
    the marker, and STATE_DIR_NAME/ (journal of verified files, partial files, hub staging).

    Durability is batched. A file is written under a temporary name in STATE_DIR_NAME/partial,
    verified (size and sha256 of the bytes as they streamed in), renamed to its final name, and
    then recorded in the journal with a sequence number `seq`; none of this waits for the disk
    (no fsync per file, which cost up to 2x the copy time: each fsync waits for the file's
    writeback and a file-system journal commit, serialising the workers behind the disk). Every
    SYNC_EVERY_BYTES and at the end, one syncfs of the destination makes everything written so
    far durable, and a line {"synced_through": N} is appended to the journal: it is written only
    after syncfs returned, and N is the last seq recorded *before* syncfs started, so each
    record with seq <= N names a file whose data and rename were on stable storage.

    What each failure leaves:
    - The process dies (SIGKILL, OOM, a bug): the page cache survives, so every final name holds
      a complete, verified file (renamed only after verification), partial files sit under
      temporary names, and the marker is absent. Resume keeps the completed files.
    - The machine loses power: files renamed after the last sync point may be empty or short
      under their final names (their journal records may or may not have survived). Resume in
      fast mode trusts only records with seq <= the largest synced_through; a file with a later
      record (or none) is re-hashed, or fetched again, before it counts, so nothing unverified
      is kept. Records without seq come from versions that fsynced each file and are trusted.
    - The marker is written only after the final syncfs (then the compacted journal and
      manifest.json, each fsynced), so a marker on disk means every file is verified and
      durable. Readers must check the marker, never the presence of files.
    """

    def __init__(self, root: str, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.root = os.path.abspath(root)
        self.state = os.path.join(self.root, STATE_DIR_NAME)
        self.partial = os.path.join(self.state, "partial")
        self.journal_path = os.path.join(self.state, JOURNAL_NAME)
        self.marker_path = os.path.join(self.root, MARKER_NAME)
        self._journal_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._seq = 0  # last journal sequence number used (continues across runs)
        self._unsynced_bytes = 0

    def target(self, rel: str) -> str:
        """Absolute path of `rel` under the root. Raises SyncError if it would leave the root
        (through '..' or a symlinked directory)."""
        path = os.path.join(self.root, *validate_relative_path(rel).split("/"))
        real_parent = os.path.realpath(os.path.dirname(path))
        if real_parent != os.path.realpath(self.root) and not real_parent.startswith(os.path.realpath(self.root) + os.sep):
            raise SyncError(f"{rel}: resolves outside the destination {self.root}")
        return path

    def _load_journal(self) -> dict[str, dict]:
        """path -> latest record. Each record gets "trusted": False when its file may not have
        reached stable storage (seq after the last sync point); see the class docstring."""
        records, synced, last_seq = {}, 0, self._seq
        try:
            with open(self.journal_path) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                        if "synced_through" in rec:
                            synced = max(synced, int(rec["synced_through"]))
                            last_seq = max(last_seq, synced)
                            continue
                        records[rec["path"]] = rec
                        if "seq" in rec:
                            last_seq = max(last_seq, int(rec["seq"]))
                    except (ValueError, KeyError, TypeError, AttributeError):
                        continue  # a line cut short by a crash
        except FileNotFoundError:
            pass
        self._seq = last_seq  # new records continue after every number already used
        for rec in records.values():
            rec["trusted"] = "seq" not in rec or rec["seq"] <= synced
        return records

    def _journal_append(self, rec: dict) -> None:
        """Record a verified file under its final name. Not fsynced: it counts only once a
        later sync point covers its seq (`_sync_point`)."""
        with self._journal_lock, open(self.journal_path, "a") as f:
            self._seq += 1
            f.write(json.dumps(dict(rec, seq=self._seq), sort_keys=True) + "\n")

    def _sync_point(self) -> None:
        """Make every file recorded so far durable (one syncfs), then say so in the journal."""
        with self._sync_lock:
            with self._journal_lock:
                through = self._seq  # records after this one may be renamed after syncfs starts
            syncfs(self.root)
            with self._journal_lock, open(self.journal_path, "a") as f:
                f.write(json.dumps({"synced_through": through}) + "\n")

    def _maybe_sync_point(self, n_bytes: int) -> None:
        """A sync point every SYNC_EVERY_BYTES, run by the worker that crosses the threshold
        (the others go on copying); bounds what a power loss makes resume re-hash."""
        with self._journal_lock:
            self._unsynced_bytes += n_bytes
            due = self._unsynced_bytes >= SYNC_EVERY_BYTES
            if due:
                self._unsynced_bytes = 0
        if due:
            self._sync_point()

    def _read_marker(self) -> dict | None:
        try:
            with open(self.marker_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _known_hash(self, entry: FileEntry, rec: dict | None) -> FileEntry:
        """Fill a sha256 the source cannot give from the journal: a hub file outside LFS with
        the same git blob id, or a file:// file whose size and mtime are unchanged since copied."""
        if entry.sha256 or not rec or rec.get("size_bytes") != entry.size_bytes:
            return entry
        same_blob = entry.git_sha1 and rec.get("git_sha1") == entry.git_sha1
        stats = getattr(self.source, "stats", {})
        same_source = entry.path in stats and rec.get("source_stat") == stats[entry.path]
        return dataclasses.replace(entry, sha256=rec["sha256"]) if same_blob or same_source else entry

    def _journal_match(self, entry: FileEntry, rec: dict | None, st) -> bool:
        if not rec or not rec.get("trusted") or rec.get("size_bytes") != st.st_size or rec.get("mtime_ns") != st.st_mtime_ns:
            return False
        if entry.sha256:
            return rec.get("sha256") == entry.sha256
        return bool(entry.git_sha1) and rec.get("git_sha1") == entry.git_sha1

    def run(self) -> Summary:
        summary = Summary(self.source.uri, self.root)
        if isinstance(self.source, FileSource):
            if os.path.realpath(self.source.root) == os.path.realpath(self.root):
                raise UsageError("--source and --dest are the same directory")
        if self.verify != "full" and (complete := self._complete_pinned_copy(summary)) is not None:
            return complete
        if isinstance(self.source, (HfSource, ModelScopeSource)):
            self.source.staging_dir = os.path.join(self.state, "hub")  # created with the state directory
        revision, entries = resolve_nonempty(self.source)  # before anything is written
        os.makedirs(self.root, exist_ok=True)
        os.makedirs(self.state, exist_ok=True)
        self._check_entries(entries)
        summary.revision, summary.files_total = revision, len(entries)
        summary.bytes_total = sum(e.size_bytes for e in entries)
        journal = self._load_journal()
        entries = [self._known_hash(e, journal.get(e.path)) for e in entries]
        marker = self._read_marker()
        # Reused only when it names this source: a copy of the same repo and revision from another hub
        # (huggingface vs modelscope) is a new sync, and the marker it ends with names this one.
        if (self.verify != "full" and marker and marker.get("source") == self.source.uri and all(e.sha256 for e in entries)
                and marker.get("manifest_sha256") == manifest_digest(entries)
                and self._changed_file(entries, journal) is None):
            summary.files_skipped = len(entries)
            return summary
        # A new sync starts: the marker goes first, so nothing reads a half-updated directory.
        if os.path.exists(self.marker_path):
            os.unlink(self.marker_path)
            fsync_dir(self.root)
        shutil.rmtree(self.partial, ignore_errors=True)
        os.makedirs(self.partial, exist_ok=True)

        check_progress = Progress(0, len(entries), enabled=False)

        def classify(entry: FileEntry):
            path = self.target(entry.path)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return entry, "fetch"
            if st.st_size != entry.size_bytes:
                return entry, "fetch"
            rec = journal.get(entry.path)
            if self.verify != "full" and rec is not None and self._journal_match(entry, rec, st):
                return dataclasses.replace(entry, sha256=rec["sha256"]), "skip"
            # Full mode re-hashes everything; fast mode re-hashes a file whose record came after
            # the last sync point (a power loss may have left it short or empty: see the class).
            if (self.verify == "full" or (rec and not rec.get("trusted"))) and (entry.sha256 or rec):
                _, sha = hash_file(path, check_progress)
                expected = entry.sha256 or (
                    rec.get("sha256") if rec and entry.git_sha1 and rec.get("git_sha1") == entry.git_sha1 else None
                )
                if sha == expected:
                    self._journal_append(self._record(entry.path, sha, entry.git_sha1, path))
                    return dataclasses.replace(entry, sha256=sha), "verified"
            return entry, "fetch"

        plan = self._run_pool(entries, classify)
        fetch = [e for e, action in plan if action == "fetch"]
        summary.files_verified = sum(1 for _, action in plan if action == "verified")
        summary.files_skipped = len(entries) - len(fetch)
        need_bytes = sum(e.size_bytes for e in fetch)
        free_bytes = disk_free_bytes(self.root)
        if need_bytes > free_bytes:
            valid_bytes = summary.bytes_total - need_bytes
            raise SyncError(f"not enough free space in {self.root}: need {human_bytes(need_bytes)} "
                            f"({need_bytes} bytes = {human_bytes(summary.bytes_total)} total - "
                            f"{human_bytes(valid_bytes)} already valid), available {human_bytes(free_bytes)} "
                            f"({free_bytes} bytes)")

        progress = Progress(need_bytes, len(fetch), enabled=self.progress_enabled).start()
        try:
            fetched = self._run_pool(sorted(fetch, key=lambda e: -e.size_bytes),
                                     lambda e: self._transfer(e, progress))
        finally:
            progress.stop()
        done = {e.path: e for e, _ in plan}
        done.update({e.path: e for e in fetched})
        final = [done[e.path] for e in entries]
        summary.files_transferred = len(fetched)
        summary.files_verified += len(fetched)
        summary.bytes_transferred = need_bytes
        self._finish(summary, revision, final)
        return summary

    def _complete_pinned_copy(self, summary: Summary) -> Summary | None:
        """The resume of a complete copy of a pinned source, without contacting the source (no
        boto3 import, no request): ``local_copy_problem`` finds nothing and the URI pins the
        marker's revision (``sources.pinned_revision``: a commit, so the content cannot have
        changed). Returns the summary (everything skipped), or None to take the normal path."""
        if pinned_revision(self.source.uri) is None:
            return None
        try:
            problem, revision, entries = self.local_copy_problem()
        except SyncError:
            return None
        if problem is not None:
            return None
        summary.revision, summary.files_total = revision, len(entries)
        summary.files_skipped = len(entries)
        summary.bytes_total = sum(e.size_bytes for e in entries)
        return summary

    def local_copy_problem(self) -> tuple[str | None, str, list[FileEntry]]:
        """Whether the destination holds a complete copy made from this source, from local
        evidence only (no request to the source, no byte of the weights read): the marker names
        this source URI (and, for a pinned URI, its revision), the local manifest.json has the
        marker's digest, and every file it lists is unchanged since verified
        (``_changed_file``). A reboot of a node uses it to serve its copy without the hub, the
        mirror or the registry (``--check-local``).

        Returns:
            ``(problem, revision, entries)``: ``problem`` None when complete, else one line saying
            what is missing or changed; the marker's revision and the manifest's entries (empty
            when there is no usable manifest).

        Raises:
            SyncError: a manifest path escapes the destination.
        """
        marker = read_json_or_none(self.marker_path)
        if not isinstance(marker, dict):
            return "no completion marker (never completed, or a sync was interrupted)", "", []
        revision = str(marker.get("revision", ""))
        if marker.get("source") != self.source.uri:
            return f"the marker names source {marker.get('source')!r}, not {self.source.uri!r}", revision, []
        pinned = pinned_revision(self.source.uri)
        if pinned is not None and revision != pinned:
            return f"the marker names revision {revision!r}, not the pinned {pinned!r}", revision, []
        document = read_json_or_none(os.path.join(self.root, MANIFEST_NAME))
        if document is None:
            return f"no readable {MANIFEST_NAME}", revision, []
        _, entries = parse_manifest(document, MANIFEST_NAME)
        if marker.get("manifest_sha256") != manifest_digest(entries):
            return f"{MANIFEST_NAME} does not match the marker", revision, entries
        return self._changed_file(entries, self._load_journal()), revision, entries

    def _check_entries(self, entries: list[FileEntry]) -> None:
        seen = set()
        for e in entries:
            self.target(e.path)
            if e.path in seen or e.path.lower() in seen:
                raise SyncError(f"manifest lists {e.path!r} twice")
            seen.add(e.path)
        dirs = {"/".join(e.path.split("/")[:i]) for e in entries for i in range(1, e.path.count("/") + 1)}
        if clash := dirs & seen:
            raise SyncError(f"manifest uses {sorted(clash)[0]!r} both as a file and as a directory")

    def _changed_file(self, entries: list[FileEntry], journal: dict[str, dict]) -> str | None:
        """The first file that is not as verified, as one line, or None: every file exists with
        its size and matches its trusted journal record (size, mtime and sha256 recorded when it
        was verified). A file rewritten in place since, even at the same size, has another mtime,
        so it is found here and fetched again rather than served. Stat calls only."""
        for e in entries:
            try:
                st = os.stat(self.target(e.path))
            except FileNotFoundError:
                return f"{e.path} is missing"
            if st.st_size != e.size_bytes:
                return f"{e.path} has {st.st_size} bytes, the manifest {e.size_bytes}"
            rec = journal.get(e.path)
            if (not rec or not rec.get("trusted") or rec.get("size_bytes") != st.st_size
                    or rec.get("mtime_ns") != st.st_mtime_ns or (e.sha256 and rec.get("sha256") != e.sha256)):
                return f"{e.path} changed since it was verified (not as recorded in {STATE_DIR_NAME}/{JOURNAL_NAME})"
        return None

    def _record(self, rel: str, sha: str, git_sha1: str | None, path: str) -> dict:
        st = os.stat(path)
        return {"path": rel, "size_bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha,
                "git_sha1": git_sha1, "source_stat": getattr(self.source, "stats", {}).get(rel)}

    def _transfer(self, entry: FileEntry, progress: Progress) -> FileEntry:
        final_path = self.target(entry.path)
        tmp = os.path.join(self.partial, hashlib.sha256(entry.path.encode()).hexdigest()[:32] + ".partial")
        result: list[str] = []
        source = self.source
        trusted = (self.verify == "fast" and isinstance(source, FileSource) and source.verified
                   and entry.sha256 is not None)

        def fetch():
            if trusted and isinstance(source, FileSource) and entry.sha256:
                # A verified copy (see FileSource.resolve): kernel-side copy, no hashing; the
                # size is checked, the manifest's sha256 is recorded.
                size_bytes = copy_file(source.ready_path(entry), tmp, progress)
                return result.append(check_bytes(entry, size_bytes, entry.sha256))
            return result.append(fetch_verified(source, entry, tmp, progress, durable=False, writeback=True,
                                                by_checksum=self.verify == "fast"))
        with_retries(fetch, entry.path, self.log)
        os.makedirs(os.path.dirname(final_path), exist_ok=True)
        os.replace(tmp, final_path)  # verified; durable at the next sync point (see the class)
        self._journal_append(self._record(entry.path, result[-1], entry.git_sha1, final_path))
        progress.file_done()
        self._maybe_sync_point(entry.size_bytes)
        return dataclasses.replace(entry, sha256=result[-1])

    def _finish(self, summary: Summary, revision: str, entries: list[FileEntry]) -> None:
        # The final sync point: every file (data, rename, directory entry) durable, one syncfs.
        self._sync_point()
        with self._journal_lock:  # compact: one line per current file, all covered by the sync
            records = self._load_journal()
            write_lines = [json.dumps({k: v for k, v in records[e.path].items() if k != "trusted"}, sort_keys=True)
                           for e in entries if e.path in records]
            write_lines.append(json.dumps({"synced_through": self._seq}))
            with open(self.journal_path + ".tmp", "w") as f:
                f.write("".join(line + "\n" for line in write_lines))
                f.flush()
                os.fsync(f.fileno())
            os.replace(self.journal_path + ".tmp", self.journal_path)
        if not any(e.path == MANIFEST_NAME for e in entries):
            write_json_atomic(os.path.join(self.root, MANIFEST_NAME), manifest_document(self.source.uri, revision, entries))
        shutil.rmtree(self.partial, ignore_errors=True)
        write_json_atomic(self.marker_path, marker_document(self.source.uri, revision, entries))


def _known_blob(entry: FileEntry, published: FileEntry | None) -> FileEntry:
    """``entry`` with the sha256 the mirror recorded for the same git blob (a hub file outside
    LFS: the hub gives its blob id, the mirror's manifest the sha256 verified when it was
    published), else unchanged."""
    if (entry.sha256 or not entry.git_sha1 or published is None or published.git_sha1 != entry.git_sha1
            or published.size_bytes != entry.size_bytes):
        return entry
    return dataclasses.replace(entry, sha256=published.sha256, checksums=published.checksums)


def marker_document(source: str, revision: str, entries: list[FileEntry]) -> dict:
    """The completion marker: source, resolved revision, file count, total bytes, manifest digest."""
    return {"source": source, "revision": revision, "file_count": len(entries),
            "total_bytes": sum(e.size_bytes for e in entries), "manifest_sha256": manifest_digest(entries),
            "completed_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


class S3Destination(Destination):
    """Publish a mirror: objects at s3://BUCKET/PREFIX/<path> (user metadata sha256), then
    manifest.json, then the marker. Files from hubs or S3 are staged in a local temporary
    directory and verified before upload; file:// sources are uploaded from where they are.

    A branch of a hub (``hf://ORG/REPO@main``) is resolved once, by the run that fills the
    mirror, and its marker records the commit: a later run over a complete mirror whose marker
    names the same source keeps that commit without asking the hub (``_complete_pinned_mirror``),
    so serve loads what staging resolved whatever the branch has become. ``follow_branch`` asks
    the hub again and publishes what the branch points to now."""

    def __init__(self, uri: str, staging_dir: str | None, *args, follow_branch: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.uri = uri
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.staging_root = staging_dir
        self.follow_branch = follow_branch

    def run(self) -> Summary:
        from boto3.s3.transfer import TransferConfig

        summary = Summary(self.source.uri, self.uri)
        client = s3_client(max_pool_connections=self.workers * S3_PART_CONCURRENCY + 8)
        config = TransferConfig(multipart_threshold=S3_PART_BYTES, multipart_chunksize=S3_PART_BYTES,
                                max_concurrency=S3_PART_CONCURRENCY, **NO_RETRY_TRANSFER)
        marker_key = s3_key(self.prefix, MARKER_NAME)
        existing = self._list(client)
        marker, mirror_entries = self._published(client, existing)
        if self.verify != "full" and (complete := self._complete_pinned_mirror(summary, existing, marker, mirror_entries)):
            return complete
        if self.staging_root:
            os.makedirs(self.staging_root, exist_ok=True)  # e.g. a fresh NVMe mount
        staging = tempfile.mkdtemp(prefix="weight-sync-", dir=self.staging_root)
        try:
            if isinstance(self.source, (HfSource, ModelScopeSource)):
                self.source.staging_dir = os.path.join(staging, "hub")
            revision, entries = resolve_nonempty(self.source)
            seen = set()
            for e in entries:
                if e.path in seen:
                    raise SyncError(f"manifest lists {e.path!r} twice")
                seen.add(e.path)
            summary.revision, summary.files_total = revision, len(entries)
            summary.bytes_total = sum(e.size_bytes for e in entries)
            # Hub files outside LFS come with a git blob id, not a sha256: the mirror's manifest
            # gives the sha256 it verified for the same blob, so a complete mirror stays a no-op.
            entries = [_known_blob(e, mirror_entries.get(e.path)) for e in entries]
            if (self.verify != "full" and marker and marker.get("source") == self.source.uri
                    and all(e.sha256 for e in entries)
                    and marker.get("manifest_sha256") == manifest_digest(entries)
                    and all(existing.get(s3_key(self.prefix, e.path)) == e.size_bytes for e in entries)):
                summary.files_skipped = len(entries)
                return summary

            def classify(entry: FileEntry):
                key = s3_key(self.prefix, entry.path)
                if existing.get(key) != entry.size_bytes:
                    return entry, "fetch"
                if self.verify != "full":
                    meta = client.head_object(Bucket=self.bucket, Key=key).get("Metadata", {})
                    sha = meta.get("sha256")
                    local = self.source.local_path(entry)
                    if not entry.sha256 and local is not None:  # a local read is cheaper than an upload
                        entry = dataclasses.replace(entry, sha256=hash_file(local)[1])
                    if sha and sha == entry.sha256:
                        kept = {n: meta[n] for n in CHECKSUM_BYTES if meta.get(n)} or entry.checksums
                        return dataclasses.replace(entry, sha256=sha, checksums=kept), "skip"
                    return entry, "fetch"
                sink = Sink(os.path.join(staging, "check", key.replace("/", "_")), Progress(0, 0, False))
                try:
                    client.download_fileobj(self.bucket, key, _WriteOnly(sink), Config=config)
                finally:
                    sink.close(durable=False)
                    os.unlink(sink.tmp_path)
                assert sink.sha256 is not None  # a Sink hashes sha256 unless told not to
                sha = sink.sha256.hexdigest()
                return (dataclasses.replace(entry, sha256=sha), "verified") if sha == (entry.sha256 or sha) else (entry, "fetch")

            plan = self._run_pool(entries, classify)
            fetch = [e for e, action in plan if action == "fetch"]
            summary.files_verified = sum(1 for _, a in plan if a == "verified")
            summary.files_skipped = len(entries) - len(fetch)
            if fetch:
                # Objects are about to change: readers must not trust the mirror until the new
                # marker is written last (a mirror with nothing to upload keeps its marker).
                client.delete_object(Bucket=self.bucket, Key=marker_key)
            if fetch and not isinstance(self.source, FileSource):
                need_bytes = min(self.workers, len(fetch)) * max(e.size_bytes for e in fetch)
                free_bytes = disk_free_bytes(staging)
                if need_bytes > free_bytes:
                    raise SyncError(f"not enough free space in staging directory {staging}: need "
                                    f"{human_bytes(need_bytes)} ({self.workers} workers x largest file), "
                                    f"available {human_bytes(free_bytes)}; use --staging-dir")
            need_bytes = sum(e.size_bytes for e in fetch)
            progress = Progress(need_bytes, len(fetch), enabled=self.progress_enabled).start()

            algorithms = tuple(n for n in CHECKSUM_BYTES if n in checksum_functions())
            upload_algorithm = algorithms[0].upper()  # CRC64NVME with awscrt, else CRC32

            def publish(entry: FileEntry) -> FileEntry:
                key = s3_key(self.prefix, entry.path)
                tmp = os.path.join(staging, "partial", hashlib.sha256(entry.path.encode()).hexdigest()[:32])
                shas: list[str] = []
                crcs: dict[str, str] = {}

                def attempt():
                    # sha256 verified here, once, against the hub; the object checksums computed in
                    # the same pass go in the manifest (what node copies check) and the metadata.
                    local = self.source.local_path(entry)
                    if local is not None:  # upload in place after hashing it once
                        size_bytes, sha, found = digest_file(local, progress, algorithms)
                        shas.append(check_bytes(entry, size_bytes, sha))
                        crcs.update(found)
                        path = local
                    else:
                        shas.append(fetch_verified(self.source, entry, tmp, progress, durable=False,
                                                   checksums=algorithms, checksums_out=crcs))
                        path = tmp
                    # S3 computes and stores its own checksum of the upload (ChecksumAlgorithm;
                    # full-object for CRC64NVME, also for multipart), returned on GET with
                    # ChecksumMode=ENABLED and compared with the manifest by the node copy.
                    client.upload_file(path, self.bucket, key, Config=config, ExtraArgs={
                        "Metadata": {"sha256": shas[-1], **crcs}, "ChecksumAlgorithm": upload_algorithm})

                try:
                    with_retries(attempt, entry.path, self.log)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
                progress.file_done()
                return dataclasses.replace(entry, sha256=shas[-1], checksums=dict(crcs) or None)

            try:
                fetched = self._run_pool(sorted(fetch, key=lambda e: -e.size_bytes), publish)
            finally:
                progress.stop()
            done = {e.path: e for e, _ in plan}
            done.update({e.path: e for e in fetched})
            final = [done[e.path] for e in entries]
            summary.files_transferred, summary.bytes_transferred = len(fetched), need_bytes
            summary.files_verified += len(fetched)
            def put(name, doc):
                return client.put_object(Bucket=self.bucket, Key=s3_key(self.prefix, name),
                                         Body=json.dumps(doc, indent=1, sort_keys=True).encode(),
                                         ContentType="application/json")
            if (not fetched and marker and marker.get("source") == self.source.uri
                    and marker.get("revision") == revision and marker.get("manifest_sha256") == manifest_digest(final)
                    and {e.path: e.git_sha1 for e in final} == {p: e.git_sha1 for p, e in mirror_entries.items()}):
                return summary  # everything was there and verified: nothing to write
            put(MANIFEST_NAME, manifest_document(self.source.uri, revision, final))
            put(MARKER_NAME, marker_document(self.source.uri, revision, final))
            return summary
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _published(self, client, existing: dict[str, int]) -> tuple[dict | None, dict[str, FileEntry]]:
        """The mirror's marker and the entries of its manifest.json, by path ({} when either is
        missing or unreadable: the mirror is then treated as incomplete)."""
        marker_key, manifest_key = s3_key(self.prefix, MARKER_NAME), s3_key(self.prefix, MANIFEST_NAME)
        if marker_key not in existing or manifest_key not in existing:
            return None, {}
        try:
            marker = json.loads(client.get_object(Bucket=self.bucket, Key=marker_key)["Body"].read())
            document = json.loads(client.get_object(Bucket=self.bucket, Key=manifest_key)["Body"].read())
            _, entries = parse_manifest(document, f"s3://{self.bucket}/{manifest_key}")
        except (ValueError, SyncError):
            return None, {}
        if not isinstance(marker, dict) or marker.get("manifest_sha256") != manifest_digest(entries):
            return None, {}
        return marker, {e.path: e for e in entries}

    def _complete_pinned_mirror(self, summary: Summary, existing: dict[str, int], marker: dict | None,
                                mirror_entries: dict[str, FileEntry]) -> Summary | None:
        """A complete mirror recognised without contacting the source: the marker names this URI
        and a commit (the URI's own when it pins one: its content cannot change; for a hub branch,
        the commit the run that filled the mirror resolved, unless ``follow_branch``), the manifest
        matches the marker, and every object it lists has its size. Returns the summary (everything
        skipped), or None to take the normal path."""
        if not marker or marker.get("source") != self.source.uri or not mirror_entries:
            return None
        pinned = pinned_revision(self.source.uri)
        if pinned is None:
            recorded = str(marker.get("revision", ""))
            if self.follow_branch or not isinstance(self.source, (HfSource, ModelScopeSource)) or not HEX40.match(recorded):
                return None
            pinned = recorded
        if marker.get("revision") != pinned:
            return None
        if any(existing.get(s3_key(self.prefix, e.path)) != e.size_bytes for e in mirror_entries.values()):
            return None
        if pinned_revision(self.source.uri) is None:
            self.log(f"{self.uri} holds {self.source.uri} as resolved when it was filled: commit {pinned}; kept "
                     "without asking the hub (--follow-branch publishes what the branch points to now)")
        summary.revision, summary.files_total = pinned, len(mirror_entries)
        summary.files_skipped = len(mirror_entries)
        summary.bytes_total = sum(e.size_bytes for e in mirror_entries.values())
        return summary

    def _list(self, client) -> dict[str, int]:
        sizes = {}
        for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=s3_key(self.prefix, "") if self.prefix else ""):
            for obj in page.get("Contents", []):
                sizes[obj["Key"]] = obj["Size"]
        return sizes

