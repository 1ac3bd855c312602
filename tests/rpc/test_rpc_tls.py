"""TLS and mutual TLS through backend options, with certificates generated here."""

from __future__ import annotations

import datetime
import ipaddress
import operator
from typing import Any

import grpc
import pytest

pytest.importorskip("cryptography")
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402
from gradwire import errors  # noqa: E402
from gradwire.distributed import rpc  # noqa: E402

from .conftest import solo_options  # noqa: E402


def _pem_key(key: Any) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _ca(name: str) -> tuple[Any, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(ca_key: Any, ca_cert: x509.Certificate) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gradwire-worker")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


@pytest.fixture(scope="module")
def pki() -> dict[str, bytes]:
    ca_key, ca_cert = _ca("gradwire test CA")
    cert, key = _leaf(ca_key, ca_cert)
    other_key, other_ca = _ca("some other CA")
    other_cert, other_leaf_key = _leaf(other_key, other_ca)
    return {
        "ca": ca_cert.public_bytes(serialization.Encoding.PEM),
        "cert": cert,
        "key": key,
        "other_cert": other_cert,
        "other_key": other_leaf_key,
    }


def _address() -> str:
    return str(rpc.get_debug_info()["peers"][0]["address"])


def _health(channel: grpc.Channel) -> Any:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)


def test_tls_calls_work_and_plaintext_clients_fail(pki: dict[str, bytes], tmp_path: Any) -> None:
    (tmp_path / "ca.pem").write_bytes(pki["ca"])  # paths work as well as bytes
    opts = solo_options(tls_cert=pki["cert"], tls_key=pki["key"], tls_ca=str(tmp_path / "ca.pem"))
    rpc.init_rpc("tls", 0, 1, opts)
    try:
        assert rpc.rpc_sync("tls", operator.add, (20, 22)) == 42
        with grpc.insecure_channel(_address()) as plain, pytest.raises(grpc.RpcError):
            _health(plain)
    finally:
        rpc.shutdown()


def test_mutual_tls_rejects_clients_without_a_trusted_certificate(pki: dict[str, bytes]) -> None:
    opts = solo_options(
        tls_cert=pki["cert"], tls_key=pki["key"], tls_ca=pki["ca"], tls_require_client_auth=True
    )
    rpc.init_rpc("mtls", 0, 1, opts)
    try:
        assert rpc.rpc_sync("mtls", operator.mul, (6, 7)) == 42
        no_cert = grpc.ssl_channel_credentials(root_certificates=pki["ca"])
        with grpc.secure_channel(_address(), no_cert) as ch, pytest.raises(grpc.RpcError) as info:
            _health(ch)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        foreign = grpc.ssl_channel_credentials(pki["ca"], pki["other_key"], pki["other_cert"])
        with grpc.secure_channel(_address(), foreign) as ch, pytest.raises(grpc.RpcError):
            _health(ch)
        trusted = grpc.ssl_channel_credentials(pki["ca"], pki["key"], pki["cert"])
        with grpc.secure_channel(_address(), trusted) as ch:
            assert _health(ch).status == 1  # SERVING
    finally:
        rpc.shutdown()


def test_untrusted_server_is_an_unavailable_error(pki: dict[str, bytes]) -> None:
    # The worker trusts a CA that did not sign the server's certificate: calls cannot connect.
    opts = solo_options(tls_cert=pki["cert"], tls_key=pki["key"], tls_ca=pki["other_cert"])
    rpc.init_rpc("lonely", 0, 1, opts)
    try:
        with pytest.raises(errors.WorkerUnavailableError, match="'lonely' is unavailable"):
            rpc.rpc_sync("lonely", operator.add, (1, 2), timeout=5)
    finally:
        rpc.shutdown(graceful=False)
