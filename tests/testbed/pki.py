"""A throwaway certificate authority for the local cluster: serving certificates for the
API server and the webhook, client certificates for the kubelet and the control plane's
own components."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class CA:
    def __init__(self, name: str = "headroom-test-ca") -> None:
        self.key = _key()
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    def write(self, path: Path) -> Path:
        path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        return path

    def issue(
        self,
        directory: Path,
        name: str,
        hosts: list[str],
        common_name: str | None = None,
        organization: str | None = None,
    ) -> tuple[Path, Path]:
        """A serving certificate for `hosts` (DNS names or IPs), or with `common_name` (and
        `organization`, the groups) a client certificate for that user; (cert file, key file)."""
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        sans: list[x509.GeneralName] = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        subject = [x509.NameAttribute(NameOID.COMMON_NAME, common_name or hosts[0])]
        if organization:
            subject.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        if common_name:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
            )
        cert = builder.sign(self.key, hashes.SHA256())
        cert_file, key_file = directory / f"{name}.crt", directory / f"{name}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(_pem_key(key))
        return cert_file, key_file


def signing_key(directory: Path) -> tuple[Path, Path]:
    """A key pair for service-account token signing: (private key file, public key file)."""
    key = _key()
    private, public = directory / "sa.key", directory / "sa.pub"
    private.write_bytes(_pem_key(key))
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public
