"""The webhook's serving certificate, managed by the controller itself.

Rendering a certificate in the chart makes every `helm template` differ (GitOps drift)
and, after a re-render, leaves the API server trusting a CA that no longer signs the
served certificate — the webhook then fails open with nothing in Headroom's log. So the
leader keeps one Secret (`tls.crt`, `tls.key`, `ca.crt`) and the webhook configuration's
`caBundle` in step:

- missing, unreadable, for other names, within `renew_before` of expiry, not signed by a
  CA in `ca.crt`, or with a `tls.key` that is not its key ⇒ a new CA and serving
  certificate;
- from the Secret only the CA that verifiably signed `tls.crt` ever reaches the
  cluster-scoped `caBundle`: a CA appended to `ca.crt` by someone who can edit Secrets in
  the controller's namespace is not trusted;
- the new CA is added to the `caBundle` *before* the Secret changes, and the old CA stays
  in the bundle until the certificate it signed has expired, so replicas still serving the
  old certificate (the kubelet refreshes mounted Secrets with a delay) are trusted
  throughout: a rotation never makes the webhook fail open.

Every replica serves whatever its certificate directory holds and reloads it when it
changes (webhook/server.py). In a pod that directory is the Secret mounted read-only (the
kubelet keeps it). When it is a writable directory of the controller's own, as when the
controller runs off-cluster, the controller copies the Secret's `tls.crt` and `tls.key`
into it itself (`write_files`).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ..cluster.client import STRATEGIC_PATCH, Api, ApiError

log = logging.getLogger("headroom.certs")

WEBHOOK_NAME = "pods.kube-headroom.dev"
# CAs the caBundle keeps: the newest, the one that signed the certificate before it, and
# one more for a replica whose mounted Secret the kubelet has not refreshed through two
# rotations. Older ones go, whatever rotated them.
MAX_BUNDLE = 3
SKEW = datetime.timedelta(minutes=5)  # a certificate is valid from this long before it is issued
# A certificate for other names issued less than this ago is another writer's: not reissued.
FIGHT_WINDOW = datetime.timedelta(minutes=10)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def issue(names: Sequence[str], days: int) -> tuple[bytes, bytes, bytes]:
    """A fresh CA and a serving certificate for `names` (DNS names or IPs): (ca, crt, key) PEM."""
    now = _now() - SKEW  # tolerate a little clock skew
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"kube-headroom webhook CA {now:%Y%m%d%H%M%S}")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=days + 1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )  # digitalSignature, keyCertSign, cRLSign
        .sign(ca_key, hashes.SHA256())
    )
    key = _key()
    sans: list[x509.GeneralName] = []
    for n in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            sans.append(x509.DNSName(n))
    crt = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return _pem(ca), _pem(crt), key_pem


def _names_of(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n) for n in san.get_values_for_type(x509.DNSName)} | {
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)
    }


def _live_cas(bundle: bytes, until: datetime.datetime) -> list[bytes]:
    """The CAs of a bundle still valid at `until` (expired ones are dropped)."""
    out = []
    try:
        certs = x509.load_pem_x509_certificates(bundle)
    except ValueError:
        return []
    for c in certs:
        if c.not_valid_after_utc > until:
            out.append(_pem(c))
    return out


def _bundle(first: bytes, second: bytes | None, current: bytes) -> bytes:
    """`first`, then `second`, then the live CAs of `current`, newest first as they were
    added: at most MAX_BUNDLE CAs, so that no sequence of rotations grows the bundle."""
    cas = dict.fromkeys([first, *([second] if second else []), *_live_cas(current, _now())])
    return b"".join(list(cas)[:MAX_BUNDLE])


def _issuer(data: dict[str, bytes]) -> bytes | None:
    """The PEM of the CA in `ca.crt` that signed `tls.crt`, when `tls.key` is that
    certificate's key and the CA is still valid; None otherwise. Only this CA is ever taken
    from the Secret into the caBundle: anything else appended to `ca.crt` is not trusted."""
    try:
        cert = x509.load_pem_x509_certificate(data.get("tls.crt") or b"")
        key = serialization.load_pem_private_key(data.get("tls.key") or b"", password=None)
        cas = x509.load_pem_x509_certificates(data.get("ca.crt") or b"")
    except (ValueError, TypeError):
        return None
    spki = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        return None
    for ca in cas:
        if ca.subject != cert.issuer or ca.not_valid_after_utc <= _now():
            continue
        try:
            basic = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
            if not basic.ca:
                continue
            cert.verify_directly_issued_by(ca)
        except (x509.ExtensionNotFound, ValueError, TypeError, InvalidSignature):
            continue
        return _pem(ca)
    return None


@dataclass
class CertManager:
    api: Api
    namespace: str
    secret: str
    names: Sequence[str]  # what the API server dials: service.namespace.svc, or an IP in tests
    webhook_configuration: str
    days: int = 365
    renew_before: datetime.timedelta = datetime.timedelta(days=30)
    _said_other: tuple[str, ...] | None = None  # the other names last said to hold the Secret
    _said_at: datetime.datetime | None = None
    _written: bytes | None = None  # the tls.crt this manager last wrote into the Secret
    _displaced: bool = False  # another writer has replaced what this one wrote: it holds off

    @property
    def _path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets/{self.secret}"

    def _read(self) -> dict[str, bytes] | None:
        try:
            obj = self.api.get(self._path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        data = obj.get("data") or {}
        try:
            return {k: base64.b64decode(v) for k, v in data.items()} | {
                "_rv": str(obj["metadata"].get("resourceVersion", "")).encode()
            }
        except (ValueError, TypeError):
            return {"_rv": str(obj["metadata"].get("resourceVersion", "")).encode()}

    def _usable(self, data: dict[str, bytes] | None) -> bool:
        """The Secret holds a serving certificate for our names, valid now and not close to
        expiry, whose key is `tls.key` and which a CA in `ca.crt` signed: otherwise it is
        issued anew. A certificate not valid yet is not usable: no client accepts it."""
        if not data or _issuer(data) is None:
            return False
        cert = x509.load_pem_x509_certificate(data["tls.crt"])
        now = _now()
        return (
            cert.not_valid_before_utc <= now
            and cert.not_valid_after_utc > now + self.renew_before
            and set(self.names) <= _names_of(cert)
        )

    @property
    def _configuration_path(self) -> str:
        return f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{self.webhook_configuration}"

    def _update_bundle(self, change: Callable[[bytes], bytes | None]) -> None:
        """Set the webhook's caBundle to `change(current)` (None: leave it), as a patch
        conditional on the configuration's resourceVersion, so that a replica that read
        it before another changed it never writes the older bundle back: on a conflict it
        reads again (three tries, then the next check). Nothing without the configuration
        or the webhook in it."""
        for _ in range(3):
            try:
                mwc = self.api.get(self._configuration_path)
            except ApiError as exc:
                if exc.status == 404:
                    return
                raise
            hook = next((h for h in mwc.get("webhooks") or [] if h.get("name") == WEBHOOK_NAME), None)
            if hook is None:
                return
            value = (hook.get("clientConfig") or {}).get("caBundle")
            current = base64.b64decode(value) if value else b""
            new = change(current)
            if new is None or new == current:
                return
            body = {
                "metadata": {"resourceVersion": mwc["metadata"]["resourceVersion"]},
                "webhooks": [{"name": WEBHOOK_NAME, "clientConfig": {"caBundle": base64.b64encode(new).decode()}}],
            }
            try:
                self.api.patch(self._configuration_path, body, STRATEGIC_PATCH, {"fieldManager": "headroom"})
            except ApiError as exc:
                if exc.status == 409:
                    continue
                raise
            log.info("webhook caBundle updated", extra={"configuration": self.webhook_configuration})
            return
        log.info("webhook caBundle changed under each try; again at the next check")

    def _held_for_other_names(self, data: dict[str, bytes] | None) -> bool:
        """The Secret holds a sound certificate for other names that another writer keeps
        (a second release, or a controller run elsewhere with the same --webhook-secret):
        reissuing would make it reissue in turn, each adding a CA. Held off when

        - the certificate replaced one this manager wrote: another writer is at work, and
          this one holds off for as long as that certificate is valid and not due for
          renewal (the two would otherwise swap the Secret every FIGHT_WINDOW); or
        - it was issued within FIGHT_WINDOW, by its own notBefore. The writer chooses
          that date, so one in the future (a certificate no client accepts yet) is never a
          reason to wait.

        Said as an error once per set of names and again every hour while it lasts."""
        if not data or _issuer(data) is None:
            return False
        cert = x509.load_pem_x509_certificate(data["tls.crt"])
        names = _names_of(cert)
        now = _now()
        if set(self.names) <= names or cert.not_valid_after_utc <= now + self.renew_before:
            return False
        if self._written is not None and data["tls.crt"] != self._written:
            self._displaced = True
        issued = cert.not_valid_before_utc + SKEW
        recent = issued <= now + SKEW and now - issued < FIGHT_WINDOW
        if not (self._displaced or recent):
            return False
        said = tuple(sorted(names))
        if self._said_other != said or self._said_at is None or now - self._said_at >= datetime.timedelta(hours=1):
            log.error(
                "webhook Secret holds a certificate for other names that another writer keeps; not reissued "
                "(each writer needs a Secret of its own: --webhook-secret; delete the Secret to take it back)",
                extra={
                    "secret": f"{self.namespace}/{self.secret}",
                    "names": sorted(names),
                    "wanted": list(self.names),
                    "issuedSecondsAgo": int((now - issued).total_seconds()),
                    "replacedOurs": self._displaced,
                },
            )
            self._said_other, self._said_at = said, now
        return True

    def write_files(self, cert_dir: Path) -> bool:
        """Copy the Secret's `tls.crt` and `tls.key` into `cert_dir` when they differ from
        what is there (each file replaced whole; the key readable by the owner only); True
        when something was written. False, writing nothing, while the Secret does not exist
        or holds no usable certificate."""
        data = self._read()
        if not data or _issuer(data) is None:
            return False
        written = False
        for name, mode in (("tls.key", 0o600), ("tls.crt", 0o644)):
            path = cert_dir / name
            try:
                if path.read_bytes() == data[name]:
                    continue
            except OSError:
                pass
            # A new file of a random name, created exclusively and never through a link
            # (mkstemp: O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600), then renamed over the old
            # one: a planted file or link at any name is never written through.
            fd, tmp = tempfile.mkstemp(dir=cert_dir, prefix=f".{name}.")
            try:
                with os.fdopen(fd, "wb") as f:
                    os.fchmod(f.fileno(), mode)
                    f.write(data[name])
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            written = True
        if written:
            log.info("webhook certificate written to the certificate directory", extra={"dir": str(cert_dir)})
        return written

    def ensure(self) -> bool:
        """Make the Secret and the caBundle right; True when a new certificate was issued."""
        data = self._read()
        rotated = False
        if not self._usable(data):
            if self._held_for_other_names(data):
                return False
            ca, crt, key = issue(list(self.names), self.days)
            # Keep trusting the CA some replica may still serve: the one that signed the old
            # certificate (verified), and the newest others already in the bundle (bounded).
            signer = _issuer(data) if data else None
            bundle = _bundle(ca, signer, b"")
            self._update_bundle(lambda current: _bundle(ca, signer, current))  # trusted before anything serves it
            body: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": {"name": self.secret, "namespace": self.namespace},
                "data": {
                    "tls.crt": base64.b64encode(crt).decode(),
                    "tls.key": base64.b64encode(key).decode(),
                    "ca.crt": base64.b64encode(bundle).decode(),
                },
            }
            try:
                if data is None:
                    self.api.post(f"/api/v1/namespaces/{self.namespace}/secrets", body)
                else:
                    body["metadata"]["resourceVersion"] = data["_rv"].decode()
                    self.api.request_json("PUT", self._path, body)
            except ApiError as exc:
                # 409: another replica wrote it first (created, or changed since our read):
                # theirs is used next round. Anything else (a 422, a 403) is a failure.
                if exc.status == 409:
                    log.info("webhook certificate written by another replica", extra={"secret": self.secret})
                    return False
                raise
            log.info(
                "webhook certificate issued",
                extra={"secret": f"{self.namespace}/{self.secret}", "names": list(self.names), "days": self.days},
            )
            self._said_other, self._displaced, self._written = None, False, crt
            data, rotated = self._read(), True
        # The bundle must hold the CA of the certificate being served, and from the Secret
        # nothing else.
        signer = _issuer(data) if data else None
        if signer is not None:
            self._update_bundle(
                lambda current: None if signer in _live_cas(current, _now()) else _bundle(signer, None, current)
            )
        return rotated
