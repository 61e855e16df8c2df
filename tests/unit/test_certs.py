"""The webhook certificate manager trusts nothing in its Secret it cannot verify (pure
logic over an in-memory stand-in for the two objects it reads and writes; the real API
server path is tests/integration/test_webhook_live.py)."""

from __future__ import annotations

import base64
import datetime
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.hashes import SHA256

from headroom.cluster.client import ApiError
from headroom.webhook.certs import MAX_BUNDLE, WEBHOOK_NAME, CertManager, issue

SECRET = "/api/v1/namespaces/ns/secrets/tls"
MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/headroom"


class Objects:
    """The Secret and the MutatingWebhookConfiguration, as a dict of paths."""

    def __init__(self) -> None:
        self.store: dict[str, Any] = {
            MWC: {
                "metadata": {"name": "headroom", "resourceVersion": "0"},
                "webhooks": [{"name": WEBHOOK_NAME, "clientConfig": {}}],
            }
        }
        self.rv = 0
        self.before_patch: Any = None  # runs between a read and the patch it leads to
        self.secret_status: int | None = None  # the status the next Secret write fails with

    def get(self, path: str) -> Any:
        if path not in self.store:
            raise ApiError(404, "NotFound", path)
        return self.store[path]

    def post(self, path: str, body: Any) -> Any:
        return self.request_json("PUT", SECRET, body)

    def request_json(self, method: str, path: str, body: Any) -> Any:
        if self.secret_status is not None:
            raise ApiError(self.secret_status, "Invalid", "Secret too large")
        self.rv += 1
        body["metadata"]["resourceVersion"] = str(self.rv)
        self.store[path] = body
        return body

    def patch(self, path: str, body: Any, *_: Any) -> Any:
        if self.before_patch is not None:
            hook, self.before_patch = self.before_patch, None
            hook()
        stored = self.store[path]
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != stored["metadata"]["resourceVersion"]:  # as the API server does
            raise ApiError(409, "Conflict", "the object has been modified")
        self.set_bundle(body["webhooks"][0]["clientConfig"]["caBundle"])
        return stored

    def set_bundle(self, value: str) -> None:
        stored = self.store[MWC]
        stored["webhooks"][0]["clientConfig"]["caBundle"] = value
        self.rv += 1
        stored["metadata"]["resourceVersion"] = str(self.rv)

    def secret(self, **data: bytes) -> None:
        self.request_json(
            "PUT",
            SECRET,
            {
                "metadata": {"name": "tls"},
                "data": {k.replace("_", "."): base64.b64encode(v).decode() for k, v in data.items()},
            },
        )

    def bundle(self) -> list[x509.Certificate]:
        raw = self.store[MWC]["webhooks"][0]["clientConfig"].get("caBundle", "")
        return x509.load_pem_x509_certificates(base64.b64decode(raw)) if raw else []

    def served(self) -> bytes:
        return base64.b64decode(self.store[SECRET]["data"]["tls.crt"])


def _signed(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except Exception:
        return False
    return True


def manager(objs: Objects) -> CertManager:
    return CertManager(objs, "ns", "tls", ["127.0.0.1"], "headroom")  # type: ignore[arg-type]


def test_a_certificate_no_bundled_ca_signed_or_a_key_that_is_not_its_own_is_issued_anew():
    objs = Objects()
    ca, crt, key = issue(["127.0.0.1"], 365)
    _, other_crt, other_key = issue(["127.0.0.1"], 365)
    objs.secret(tls_crt=crt, tls_key=key, ca_crt=ca)
    assert manager(objs).ensure() is False  # a consistent Secret is used as it is
    assert objs.served() == crt

    objs.secret(tls_crt=crt, tls_key=other_key, ca_crt=ca)  # the key does not match
    assert manager(objs).ensure() is True
    assert objs.served() != crt

    objs.secret(tls_crt=other_crt, tls_key=other_key, ca_crt=ca)  # signed by a CA not in ca.crt
    assert manager(objs).ensure() is True
    assert objs.served() != other_crt
    # the bundle trusts the CA that signs what is served now
    served = x509.load_pem_x509_certificate(objs.served())
    assert any(_signed(served, c) for c in objs.bundle())


def test_a_ca_appended_to_the_secret_never_reaches_the_cluster_scoped_bundle():
    objs = Objects()
    ca, crt, key = issue(["127.0.0.1"], 365)
    planted, _, _ = issue(["attacker.example"], 365)
    objs.secret(tls_crt=crt, tls_key=key, ca_crt=ca + planted)
    manager(objs).ensure()
    trusted = {c.fingerprint(SHA256()) for c in objs.bundle()}
    assert x509.load_pem_x509_certificate(ca).fingerprint(SHA256()) in trusted
    assert x509.load_pem_x509_certificate(planted).fingerprint(SHA256()) not in trusted
    # and after a rotation (the Secret deleted) the planted CA is still not carried over
    del objs.store[SECRET]
    objs.secret(tls_crt=b"", tls_key=b"", ca_crt=planted)
    assert manager(objs).ensure() is True
    assert x509.load_pem_x509_certificate(planted).fingerprint(SHA256()) not in {
        c.fingerprint(SHA256()) for c in objs.bundle()
    }


def test_the_certificate_files_are_written_only_into_a_directory_of_the_controllers_own(tmp_path):
    from headroom.webhook.host import own_cert_dir

    objs = Objects()
    m = manager(objs)
    mine = own_cert_dir(tmp_path / "certs")  # created when missing
    assert mine == tmp_path / "certs"
    assert m.write_files(mine) is False and not (mine / "tls.crt").exists()  # no Secret yet: nothing
    m.ensure()
    assert m.write_files(mine) is True and m.write_files(mine) is False  # once, then only on a change
    assert (mine / "tls.crt").read_bytes() == objs.served() and (mine / "tls.key").stat().st_mode & 0o777 == 0o600
    # A Secret volume (the kubelet's `..data`) is the kubelet's to keep.
    volume = tmp_path / "volume"
    (volume / "..data").mkdir(parents=True)
    assert own_cert_dir(volume) is None


def test_a_certificate_directory_someone_else_can_write_is_refused_with_the_fix(tmp_path):
    """Before: any writable directory was taken (another user's, mode 0777)."""
    import os

    import pytest

    from headroom.webhook.host import UnsafeCertDir, own_cert_dir

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafeCertDir, match=r"mode 0777 lets its group or others write .*chmod go-w"):
        own_cert_dir(shared)
    if os.geteuid() == 0:  # root can hand a directory to another user, and still write to it
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(UnsafeCertDir, match=r"owned by uid 65534, not by this user \(uid 0\).*chown 0"):
            own_cert_dir(theirs)
    shared.chmod(0o700)
    assert own_cert_dir(shared) == shared
    # An ancestor others may write (not sticky) lets them swap the whole directory: refused,
    # at start and before each later write.
    above = tmp_path / "above"
    (above / "certs").mkdir(parents=True, mode=0o700)
    above.chmod(0o777)
    with pytest.raises(UnsafeCertDir, match=r"above \(owned by uid \d+, mode 0777\) lets someone else replace"):
        own_cert_dir(above / "certs")
    above.chmod(0o1777)  # sticky, as /tmp is: no one renames what is not theirs
    assert own_cert_dir(above / "certs") == above / "certs"


def test_links_others_can_repoint_and_other_users_read_only_directories_are_refused(tmp_path, monkeypatch):
    """Before: a path through a link in a world-writable directory was accepted (only the
    resolved path's ancestors were checked), and a directory of another user's that this
    one may not write was taken for a Secret volume, its certificate and key served."""
    import os

    from headroom.webhook import host
    from headroom.webhook.host import UnsafeCertDir, own_cert_dir

    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    public = tmp_path / "public"
    public.mkdir()
    public.chmod(0o777)
    (public / "certs").symlink_to(mine)
    with pytest.raises(UnsafeCertDir, match=r"public/certs is a link .* someone else could point elsewhere"):
        own_cert_dir(public / "certs")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "certs").symlink_to(mine)
    assert own_cert_dir(private / "certs") == private / "certs"  # a link only this user controls
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, 65534, 65534)
        monkeypatch.setattr(host.os, "access", lambda path, mode: False)  # as a user who may not write there
        with pytest.raises(UnsafeCertDir, match=r"owned by uid 65534 and not a Secret volume"):
            own_cert_dir(theirs)
        (theirs / "..data").mkdir()
        assert own_cert_dir(theirs) is None  # the kubelet's Secret volume: served as it is


def test_planted_files_and_links_in_the_certificate_directory_are_never_written_through(tmp_path):
    """Before: the key went through the fixed name `.tls.key.tmp`, opened without O_EXCL or
    O_NOFOLLOW: a planted link there made the controller write its private key over the
    link's target (a kubeconfig), and a planted file kept its owner and mode."""
    import os

    objs = Objects()
    m = manager(objs)
    m.ensure()
    certs = tmp_path / "certs"
    certs.mkdir(mode=0o700)
    victim = tmp_path / "kubeconfig"
    victim.write_text("apiVersion: v1\n")
    for name in ("tls.key", "tls.crt"):
        (certs / f".{name}.tmp").symlink_to(victim)
    (certs / "tls.key").symlink_to(victim)  # even the final name as a link
    assert m.write_files(certs) is True
    assert victim.read_text() == "apiVersion: v1\n"
    key = certs / "tls.key"
    assert not key.is_symlink() and key.stat().st_mode & 0o777 == 0o600 and key.stat().st_uid == os.geteuid()
    assert key.read_bytes() == base64.b64decode(objs.store[SECRET]["data"]["tls.key"])
    assert not [p for p in certs.iterdir() if p.name.startswith(".") and not p.is_symlink()]  # no temporary left


def test_two_writers_wanting_other_names_for_one_secret_neither_rotate_in_turn_nor_grow_the_bundle():
    """A second release (or an off-cluster controller) given the same Secret name: before,
    each check reissued for its own names and kept every CA, 2 more every 10 s."""
    objs = Objects()
    one = CertManager(objs, "ns", "tls", ["a.ns.svc"], "headroom")  # type: ignore[arg-type]
    two = CertManager(objs, "ns", "tls", ["b.ns.svc"], "headroom")  # type: ignore[arg-type]
    assert one.ensure() is True
    issued = objs.served()
    for _ in range(50):
        assert two.ensure() is False  # the other writer's fresh certificate is left alone
        assert one.ensure() is False
    assert objs.served() == issued
    assert len(objs.bundle()) == 1


def _later(monkeypatch: pytest.MonkeyPatch, by: datetime.timedelta) -> None:
    import headroom.webhook.certs as certs

    real = datetime.datetime.now(datetime.UTC)
    monkeypatch.setattr(certs, "_now", lambda: real + by)


def test_two_writers_of_one_secret_do_not_swap_it_every_ten_minutes(monkeypatch):
    """Once another writer has replaced the certificate one wrote, it holds off for as long
    as that certificate is sound: over 30 simulated days of checks the Secret changes hands
    once. Before: each writer reissued as soon as the other's certificate was ten minutes
    old, and the Secret swapped every ten minutes."""
    objs = Objects()
    one = CertManager(objs, "ns", "tls", ["a.ns.svc"], "headroom")  # type: ignore[arg-type]
    two = CertManager(objs, "ns", "tls", ["b.ns.svc"], "headroom")  # type: ignore[arg-type]
    assert one.ensure() is True
    _later(monkeypatch, datetime.timedelta(minutes=11))
    assert two.ensure() is True  # the first one's certificate is no longer fresh: two takes it
    issued = objs.served()
    rotations = 0
    for minutes in range(12, 30 * 24 * 60, 10):
        _later(monkeypatch, datetime.timedelta(minutes=minutes))
        rotations += one.ensure() + two.ensure()
    assert rotations == 0 and objs.served() == issued


def test_a_certificate_dated_in_the_future_neither_holds_reissue_off_nor_counts_as_usable(monkeypatch):
    """The hold on another writer's fresh certificate reads its age from its notBefore,
    which the writer chooses: a certificate for other names dated a year ahead held reissue
    off for 30 simulated days, and one for our own names dated ahead counted as usable,
    though no client accepts it yet. Now both are issued anew at once."""
    import headroom.webhook.certs as certs

    ahead = datetime.timedelta(days=365)
    real_now = certs._now
    for names in (["other.ns.svc"], ["127.0.0.1"]):
        objs = Objects()
        monkeypatch.setattr(certs, "_now", lambda: real_now() + ahead)
        ca, crt, key = issue(names, 730)  # notBefore a year from now
        monkeypatch.setattr(certs, "_now", real_now)
        objs.secret(tls_crt=crt, tls_key=key, ca_crt=ca)
        assert manager(objs).ensure() is True, names
        assert x509.load_pem_x509_certificate(objs.served()).not_valid_before_utc <= real_now()


def test_however_often_it_rotates_the_bundle_keeps_at_most_three_cas():
    objs = Objects()
    m = manager(objs)
    m.renew_before = datetime.timedelta(days=400)  # every certificate is due: each check rotates
    for _ in range(10):
        assert m.ensure() is True
    assert len(objs.bundle()) == MAX_BUNDLE
    served = x509.load_pem_x509_certificate(objs.served())
    assert _signed(served, objs.bundle()[0])


def test_a_refused_secret_write_is_a_failure_not_another_replicas_write():
    objs = Objects()
    objs.secret_status = 422  # e.g. over the Secret size limit
    with pytest.raises(ApiError) as raised:
        manager(objs).ensure()
    assert raised.value.status == 422


def test_a_bundle_changed_between_its_read_and_the_patch_is_read_again_not_overwritten():
    """A new leader adds its CA while the old one is still patching from what it read: the
    patch carries the resourceVersion read, so the older bundle is never written back."""
    objs = Objects()
    ca, crt, key = issue(["127.0.0.1"], 365)
    objs.secret(tls_crt=crt, tls_key=key, ca_crt=ca)
    other, _, _ = issue(["127.0.0.1"], 365)
    objs.before_patch = lambda: objs.set_bundle(base64.b64encode(other).decode())
    manager(objs).ensure()
    trusted = {c.fingerprint(SHA256()) for c in objs.bundle()}
    assert {x509.load_pem_x509_certificate(pem).fingerprint(SHA256()) for pem in (ca, other)} <= trusted


def test_a_refused_reload_keeps_serving_the_pair_that_works_and_expiry_is_seen(tmp_path):
    """A rotation that leaves a certificate beside a key that is not its own (a half-done
    write, another writer's key) is refused and the working pair stays served: new
    handshakes still succeed with it. Before: the certificate was loaded into the live
    context before the key check failed, so every later handshake failed. The server says
    when the certificate it serves has expired (the webhook process is then not Ready)."""
    import os
    import socket
    import ssl

    from cryptography.hazmat.primitives import serialization

    from headroom.webhook.server import Sources, WebhookServer
    from testbed.pki import CA

    ca = CA()
    ca.issue(tmp_path, "tls", ["127.0.0.1"])
    server = WebhookServer(0, tmp_path, Sources(lambda name: None, lambda: None), "127.0.0.1").start()  # type: ignore[arg-type]
    try:

        def served() -> bytes:
            ctx = ssl.create_default_context(cadata=ca.cert.public_bytes(serialization.Encoding.PEM).decode())
            ctx.check_hostname = False
            with socket.create_connection(("127.0.0.1", server.port), 10) as raw, ctx.wrap_socket(raw) as tls:
                return tls.getpeercert(binary_form=True) or b""

        first = served()
        other = tmp_path / "other"
        other.mkdir()
        ca.issue(other, "tls", ["127.0.0.1"])
        os.replace(other / "tls.crt", tmp_path / "tls.crt")  # a new certificate, the old key
        assert server.reload_if_changed() is False
        assert served() == first  # still the working pair
        assert not server.expired()
        server.not_after = 0.0
        assert server.expired()
    finally:
        server.shutdown()
