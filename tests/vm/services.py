"""What the guest reaches instead of AWS, the hub and Docker Hub, all on the host's 127.0.0.1:

- ``Imds``: instance metadata with IMDSv2 required (a PUT for a token, then every GET with it):
  region, availability zone, instance id, the instance role's credentials, the identity document.
  Paths and headers as the EC2 User Guide ("Use the Instance Metadata Service to access instance
  metadata") documents them, which botocore's ``InstanceMetadataFetcher`` and the AWS CLI use.
- ``TlsFront``: one TLS endpoint for every AWS host name and the hub (the guest's /etc/hosts points
  them at it), with a certificate for those names signed by the test CA; it forwards each request
  by its Host header to moto (S3, SSM) or the hub stand-in, and refuses the TLS handshake of a
  service marked down (an unreachable endpoint, as the client sees it).
- ``Registry``: a read-only Docker registry (distribution API v2: ``/v2/``, manifests and blobs by
  tag or digest) holding the stand-in image; down: every connection is closed unanswered.
- ``Services``: all of them plus moto (``tests/sync_fixtures.MotoServer``) and the hub
  (``tests/hub_server.HubServer``), seeded with what ``pulumi up`` puts in S3 and SSM.
"""

from __future__ import annotations

import datetime
import http.client
import json
import secrets
import ssl
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.hub_server import HubServer
from tests.sync_fixtures import MotoServer
from tests.vm import guest_env
from tests.vm.image import CertificateAuthority
from tests.vm.standin_image import MANIFEST_MEDIA_TYPE, StandinImage


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):  # a guest that hangs up is not a test failure
        pass

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    @property
    def port(self) -> int:
        return self.server_address[1]


def _reply(handler: BaseHTTPRequestHandler, status: int, body: bytes = b"", headers: dict | None = None,
           head_only: bool = False) -> None:
    handler.send_response(status)
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    if "Content-Length" not in (headers or {}):
        handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if body and not head_only:
        handler.wfile.write(body)


# --- instance metadata ---------------------------------------------------------------------------

class Imds(_QuietServer):
    """IMDSv2 stand-in (http_tokens=required, as compute.metadata_options sets)."""

    def __init__(self, region: str, availability_zone: str, instance_id: str, role: str = "kimi-vm-instance-role"):
        super().__init__(("127.0.0.1", 0), _ImdsHandler)
        self.region, self.availability_zone, self.instance_id, self.role = region, availability_zone, instance_id, role
        self.tokens: set[str] = set()
        self.requests: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()


class _ImdsHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Imds

    def log_message(self, *args):
        pass

    def _log(self, status: int) -> None:
        with self.server.lock:
            self.server.requests.append((self.command, self.path, status))

    def do_PUT(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self._log(400)
            return _reply(self, 400)
        token = secrets.token_urlsafe(32)
        with self.server.lock:
            self.server.tokens.add(token)
        self._log(200)
        ttl = self.headers["X-aws-ec2-metadata-token-ttl-seconds"]
        _reply(self, 200, token.encode(), {"Content-Type": "text/plain", "X-aws-ec2-metadata-token-ttl-seconds": ttl})

    def do_GET(self):
        s = self.server
        if self.headers.get("X-aws-ec2-metadata-token") not in s.tokens:
            self._log(401)
            return _reply(self, 401)  # IMDSv2 required: no token, no answer
        now = datetime.datetime.now(datetime.UTC)
        creds = {"Code": "Success", "LastUpdated": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "Type": "AWS-HMAC",
                 "AccessKeyId": "ASIAKIMIVMTESTROLE00", "SecretAccessKey": "kimi-vm-test-secret-key",
                 "Token": "kimi-vm-test-session-token",
                 "Expiration": (now + datetime.timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ")}
        identity = {"region": s.region, "availabilityZone": s.availability_zone, "instanceId": s.instance_id,
                    "instanceType": "p6-b300.48xlarge", "accountId": "123456789012", "architecture": "x86_64"}
        paths = {
            "/latest/meta-data/instance-id": s.instance_id,
            "/latest/meta-data/placement/region": s.region,
            "/latest/meta-data/placement/availability-zone": s.availability_zone,
            "/latest/meta-data/iam/security-credentials/": s.role,
            f"/latest/meta-data/iam/security-credentials/{s.role}": json.dumps(creds),
            "/latest/dynamic/instance-identity/document": json.dumps(identity),
        }
        body = paths.get(urllib.parse.urlsplit(self.path).path)
        self._log(200 if body is not None else 404)
        if body is None:
            return _reply(self, 404)
        _reply(self, 200, body.encode(), {"Content-Type": "text/plain"})


# --- the TLS front ---------------------------------------------------------------------------------

def server_certificate(ca: CertificateAuthority, names: tuple[str, ...]) -> tuple[bytes, bytes]:
    """(cert PEM, key PEM) for ``names`` (and the wildcard of each S3 host, for any bucket), signed
    by the test CA, valid one day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    wild = [f"*.{n}" for n in names if n.startswith("s3.")]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in (*names, *wild)]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def service_of(host: str) -> str:
    """Which stand-in answers ``host``: ``s3``, ``ssm``, ``sts`` or ``hub``."""
    host = host.split(":")[0].lower()
    if host == guest_env.HUB_HOST:
        return "hub"
    if host.startswith("ssm."):
        return "ssm"
    if host.startswith("sts."):
        return "sts"
    return "s3"


class TlsFront(_QuietServer):
    """TLS for every name the guest resolves to ``guest_env.FRONT_ADDRESS``; requests forwarded by Host.

    Attributes:
        backends: service -> host port on 127.0.0.1 (``service_of``).
        down: services whose TLS handshakes are refused (unreachable, as the client sees it).
        requests: (service, method, path, status) of every forwarded request.
    """

    def __init__(self, cert_pem: bytes, key_pem: bytes, backends: dict[str, int]):
        super().__init__(("127.0.0.1", 0), _FrontHandler)
        self.backends = backends
        self.down: set[str] = set()
        self.refused: dict[str, int] = {}
        self.requests: list[tuple[str, str, str, int]] = []
        self.lock = threading.Lock()
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert.write_bytes(cert_pem)
            key.write_bytes(key_pem)
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(str(cert), str(key))
        self.context.sni_callback = self._sni

    def _sni(self, sslobj, server_name, context):
        service = service_of(server_name or "")
        if service in self.down:
            with self.lock:
                self.refused[service] = self.refused.get(service, 0) + 1
            return ssl.ALERT_DESCRIPTION_HANDSHAKE_FAILURE
        return None

    def count(self, service: str, predicate: Callable[[str, str], bool] = lambda m, p: True) -> int:
        """Requests forwarded to ``service`` whose (method, path) match ``predicate``."""
        with self.lock:
            return sum(1 for s, m, p, _ in self.requests if s == service and predicate(m, p))


class _FrontHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: TlsFront
    HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}

    def setup(self):
        self.request.settimeout(300)
        self.request = self.server.context.wrap_socket(self.request, server_side=True)
        super().setup()

    def log_message(self, *args):
        pass

    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(self):
        host = self.headers.get("Host", "")
        service = service_of(host)
        body = self._body()
        conn = http.client.HTTPConnection("127.0.0.1", self.server.backends[service], timeout=300)
        conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for k, v in self.headers.items():
            if k.lower() not in self.HOP and k.lower() != "content-length":
                conn.putheader(k, v)
        if body or self.command in ("PUT", "POST"):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        resp = conn.getresponse()
        data = resp.read()
        with self.server.lock:
            self.server.requests.append((service, self.command, self.path, resp.status))
        self.send_response(resp.status, resp.reason)
        length = None
        for k, v in resp.getheaders():
            if k.lower() == "content-length":
                length = v
            elif k.lower() not in self.HOP and k.lower() not in ("server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", length if self.command == "HEAD" and length is not None else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


# --- the registry ----------------------------------------------------------------------------------

class Registry(_QuietServer):
    """Read-only Docker registry (distribution API v2) of the stand-in image.

    Attributes:
        images: (repository, tag) -> image.
        down: every connection is closed unanswered.
        requests: (method, path, status).
    """

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _RegistryHandler)
        self.images: dict[tuple[str, str], StandinImage] = {}
        self.down = False
        self.requests: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()

    def add(self, reference: str, image: StandinImage) -> None:
        """Serve ``image`` as ``reference`` (``name:tag``; a Docker Hub name without a registry)."""
        name, _, tag = reference.rpartition(":")
        if "/" not in name:
            name = f"library/{name}"
        self.images[(name, tag)] = image

    def pulls(self) -> int:
        """Manifest GETs answered 200 (one per pull)."""
        with self.lock:
            return sum(1 for m, p, s in self.requests if m == "GET" and "/manifests/" in p and s == 200)


class _RegistryHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Registry

    def log_message(self, *args):
        pass

    def handle_one_request(self):
        if self.server.down:
            self.close_connection = True
            return
        super().handle_one_request()

    def _answer(self, head_only: bool):
        s, path = self.server, urllib.parse.urlsplit(self.path).path
        status, body, headers = 404, json.dumps({"errors": [{"code": "NAME_UNKNOWN", "message": path}]}).encode(), {
            "Content-Type": "application/json"}
        blob_file: Path | None = None
        api = {"Docker-Distribution-API-Version": "registry/2.0"}
        if path in ("/v2/", "/v2"):
            status, body, headers = 200, b"{}", {"Content-Type": "application/json"}
        elif "/manifests/" in path:
            name, _, ref = path[len("/v2/"):].partition("/manifests/")
            for (n, tag), image in s.images.items():
                if n == name and ref in (tag, image.digest):
                    status, body = 200, image.manifest
                    # The manifest's own media type (Docker schema 2, or OCI for tests/engine_image.py).
                    media_type = json.loads(image.manifest).get("mediaType") or MANIFEST_MEDIA_TYPE
                    headers = {"Content-Type": media_type, "Docker-Content-Digest": image.digest}
        elif "/blobs/" in path:
            name, _, digest = path[len("/v2/"):].partition("/blobs/")
            for (n, _tag), image in s.images.items():
                if n == name and digest in image.blobs:
                    blob = image.blobs[digest]
                    status, headers = 200, {"Content-Type": "application/octet-stream", "Docker-Content-Digest": digest}
                    if isinstance(blob, Path):
                        blob_file, body = blob, b""
                        headers["Content-Length"] = str(blob.stat().st_size)
                    else:
                        body = blob
        with s.lock:
            s.requests.append((self.command, path, status))
        _reply(self, status, body, {**api, **headers}, head_only=head_only or blob_file is not None)
        if blob_file is not None and not head_only:
            with open(blob_file, "rb") as f:
                while chunk := f.read(1 << 20):
                    self.wfile.write(chunk)

    def do_GET(self):
        self._answer(head_only=False)

    def do_HEAD(self):
        self._answer(head_only=True)


# --- all of them -----------------------------------------------------------------------------------

@dataclass
class Services:
    """Every stand-in of one VM run, started by ``start_services``; ``stop()`` ends them.

    Attributes:
        imds, front, registry, moto, hub: the servers.
        forwards: guest address -> host port, for QEMU's guestfwd rules.
        s3: a boto3 S3 client on moto (what the test reads back).
    """

    imds: Imds
    front: TlsFront
    registry: Registry
    moto: MotoServer
    hub: HubServer
    s3: Any  # boto3 clients on moto
    ssm: Any
    forwards: dict[tuple[str, int], int] = field(default_factory=dict)

    def stop(self) -> None:
        for server in (self.front, self.registry, self.imds):
            server.stop()
        self.hub.__exit__(None, None, None)
        self.moto.__exit__(None, None, None)


def start_services(ca: CertificateAuthority, *, bucket: str, region: str, availability_zone: str, instance_id: str,
                   image_reference: str, image: StandinImage) -> Services:
    """Start moto, the hub, the IMDS, the TLS front and the registry on 127.0.0.1 (nothing seeded
    but the bucket and the image: the scenario puts in what ``pulumi up`` would)."""
    import boto3

    moto = MotoServer().__enter__()
    # moto's backends are global to the process: start from an empty account (moto's reset API).
    urllib.request.urlopen(urllib.request.Request(f"{moto.endpoint}/moto-api/reset", method="POST"), timeout=30).close()
    hub = HubServer().__enter__()
    imds = Imds(region, availability_zone, instance_id)
    imds.start()
    cert, key = server_certificate(ca, guest_env.endpoint_names(bucket, region))
    front = TlsFront(cert, key, {"s3": moto.port, "ssm": moto.port, "sts": moto.port, "hub": hub.server_address[1]})
    front.start()
    registry = Registry()
    registry.add(image_reference, image)
    registry.start()
    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": region}
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, **creds)
    ssm = boto3.client("ssm", endpoint_url=moto.endpoint, **creds)
    s3.create_bucket(Bucket=bucket)
    forwards = {
        (guest_env.IMDS_ADDRESS, guest_env.IMDS_PORT): imds.port,
        (guest_env.FRONT_ADDRESS, guest_env.FRONT_PORT): front.port,
        (guest_env.REGISTRY_ADDRESS, guest_env.REGISTRY_PORT): registry.port,
    }
    return Services(imds, front, registry, moto, hub, s3, ssm, forwards)


def wait_for(predicate: Callable[[], object], timeout_seconds: float, poll_seconds: float = 2.0) -> object:
    """``predicate()``'s first truthy value, or None after ``timeout_seconds``."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(poll_seconds)
