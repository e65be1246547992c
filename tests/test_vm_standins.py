"""The VM tier's stand-ins (tests/vm/services.py) against the real clients that use them in the
guest, without a VM: botocore's instance-metadata fetcher (IMDSv2), a TLS client checking the
front's certificate against the test CA, and the registry's distribution API as Docker reads it."""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import ssl

import pytest

from tests.vm import guest_env
from tests.vm.services import Imds, Registry, TlsFront, server_certificate, service_of
from tests.vm.standin_image import MANIFEST_MEDIA_TYPE, Layer, assemble


@pytest.fixture
def imds():
    server = Imds("us-east-1", "us-east-1a", "i-0test")
    server.start()
    yield server
    server.stop()


def test_imds_requires_a_token_and_gives_botocore_the_role_credentials(imds):
    from botocore.utils import InstanceMetadataFetcher

    conn = http.client.HTTPConnection("127.0.0.1", imds.port, timeout=10)
    conn.request("GET", "/latest/meta-data/iam/security-credentials/")
    assert conn.getresponse().status == 401  # IMDSv2 only, as the launch template requires
    fetcher = InstanceMetadataFetcher(timeout=5, num_attempts=1, base_url=f"http://127.0.0.1:{imds.port}/")
    creds = fetcher.retrieve_iam_role_credentials()
    assert creds["role_name"] == imds.role and creds["access_key"].startswith("ASIA") and creds["token"]
    assert ("PUT", "/latest/api/token", 200) in imds.requests


def test_the_front_serves_the_aws_names_with_the_test_ca_and_refuses_a_service_marked_down(tmp_path):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from tests.vm.image import CertificateAuthority

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(key, hashes.SHA256()))
    ca = CertificateAuthority(cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    names = guest_env.endpoint_names("my-bucket", "us-east-1")
    front = TlsFront(*server_certificate(ca, names), {"s3": 9, "ssm": 9, "sts": 9, "hub": 9})
    front.start()
    try:
        context = ssl.create_default_context(cadata=ca.cert_pem.decode())

        def handshake(host: str) -> None:
            with socket.create_connection(("127.0.0.1", front.port), timeout=10) as sock:
                with context.wrap_socket(sock, server_hostname=host):
                    pass

        for host in ("my-bucket.s3.amazonaws.com", "other.s3.us-east-1.amazonaws.com", "ssm.us-east-1.amazonaws.com",
                     guest_env.HUB_HOST):
            handshake(host)  # verified against the test CA and the names
        with pytest.raises(ssl.SSLCertVerificationError):
            handshake("example.com")
        front.down.add("s3")
        with pytest.raises(ssl.SSLError):
            handshake("my-bucket.s3.amazonaws.com")
        handshake("ssm.us-east-1.amazonaws.com")  # only S3 is down
        assert front.refused == {"s3": 1}
    finally:
        front.stop()
    assert [service_of(n) for n in names] == ["s3"] * 4 + ["ssm", "sts", "sts", "hub"]


def test_the_registry_answers_as_the_distribution_api(tmp_path):
    blob = tmp_path / "layer.tar.gz"
    blob.write_bytes(b"layer bytes")
    digest = "sha256:" + hashlib.sha256(b"layer bytes").hexdigest()
    image = assemble([Layer(blob, digest, "sha256:" + "0" * 64, blob.stat().st_size, {})])
    registry = Registry()
    registry.add("vllm/vllm-openai:nightly-x", image)
    registry.start()
    try:
        def get(path: str, method: str = "GET") -> tuple[int, dict, bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", registry.port, timeout=10)
            conn.request(method, path)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()

        assert get("/v2/")[0] == 200
        status, headers, body = get("/v2/vllm/vllm-openai/manifests/nightly-x")
        assert status == 200 and headers["Content-Type"] == MANIFEST_MEDIA_TYPE
        assert headers["Docker-Content-Digest"] == "sha256:" + hashlib.sha256(body).hexdigest() == image.digest
        manifest = json.loads(body)
        assert get(f"/v2/vllm/vllm-openai/manifests/{image.digest}")[0] == 200
        config = get(f"/v2/vllm/vllm-openai/blobs/{manifest['config']['digest']}")[2]
        assert hashlib.sha256(config).hexdigest() == manifest["config"]["digest"].split(":")[1]
        assert get(f"/v2/vllm/vllm-openai/blobs/{digest}")[2] == b"layer bytes"
        assert get("/v2/vllm/vllm-openai/manifests/other-tag")[0] == 404
        assert registry.pulls() == 2
        registry.down = True
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            get("/v2/")
    finally:
        registry.stop()


def test_the_vllm_standin_hangs_its_health_on_sigusr1_and_still_stops_on_sigterm(tmp_path):
    """What the VM tier's watchdog scenario relies on: after SIGUSR1 the process is up and
    ``/health`` is accepted but never answered (a hung engine); SIGTERM (``docker stop``) still
    ends it cleanly."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from tests.vm.services import wait_for
    from tests.vm.standin_vllm import HANG_LINE

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = Path(__file__).parent / "vm" / "standin_vllm.py"
    log = tmp_path / "log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, str(script), "serve", str(model), "--host", "127.0.0.1", "--port",
                                 str(port)], stdout=out, stderr=subprocess.STDOUT)
    try:
        def health(timeout: float) -> int | None:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
                conn.request("GET", "/health")
                return conn.getresponse().status
            except OSError:
                return None

        assert wait_for(lambda: health(5) == 200, 60, poll_seconds=0.2), log.read_text()
        proc.send_signal(signal.SIGUSR1)
        assert wait_for(lambda: HANG_LINE in log.read_text(), 30, poll_seconds=0.2), log.read_text()
        with pytest.raises(TimeoutError):  # accepted, never answered
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            conn.getresponse()
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
