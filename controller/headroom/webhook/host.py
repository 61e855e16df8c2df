"""Serving the webhook once its certificate files exist (`WebhookHost`, in `headroom
webhook` and in `headroom run --webhook-cert-dir`), and keeping its certificate right
(`CertificateKeeper`, the controller leader's job: the Secret and the configuration's
caBundle, and, off a cluster, a directory of the controller's own)."""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..cluster.client import Api
from ..cluster.inputs import Inputs
from ..cluster.loop import every
from ..cluster.writer import NotLeader
from .certs import CertManager
from .peers import ApiServerPeers
from .server import Sources, WebhookServer

log = logging.getLogger("headroom.webhook")


class UnsafeCertDir(ValueError):
    """A certificate directory the controller would write its private key into (or the
    webhook read it from), but that someone else owns or may write to."""


def _no_foreign_links(path: Path, uid: int) -> None:
    """Raise UnsafeCertDir when the path, as given, goes through a symbolic link someone
    else could re-point: one in a directory others may write (not sticky), or one owned by
    another user (in a sticky directory such as /tmp, its owner may still replace it)."""
    current = Path(path.anchor) if path.is_absolute() else Path.cwd()
    for part in path.parts[1:] if path.is_absolute() else path.parts:
        current = current / part
        try:
            st = current.lstat()
        except OSError:
            return  # not there yet: made below, by this user
        if not stat.S_ISLNK(st.st_mode):
            continue
        pst = current.parent.stat()
        if st.st_uid not in (0, uid) or (pst.st_mode & 0o022 and not pst.st_mode & 0o1000):
            raise UnsafeCertDir(
                f"--webhook-cert-dir {path}: {current} is a link (owned by uid {st.st_uid}) in {current.parent} "
                f"(mode {pst.st_mode & 0o7777:04o}) that someone else could point elsewhere: give the real path"
            )
        current = current.resolve()


def own_cert_dir(cert_dir: Path) -> Path | None:
    """`cert_dir` when the controller keeps its files itself: a writable directory that is
    not a Secret volume (the kubelet's volumes hold `..data`; the chart mounts them
    read-only). Created (mode 0700) when missing and its parent is writable. None otherwise.

    Raises UnsafeCertDir for a writable directory that is not the running user's own, or
    that its group or others may write: someone else could plant files or links there and
    read or redirect the private key."""
    uid = os.geteuid()
    _no_foreign_links(cert_dir, uid)
    try:
        cert_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    if (cert_dir / "..data").exists():
        return None  # a Secret volume: the kubelet keeps it
    st = cert_dir.stat()
    if not os.access(cert_dir, os.W_OK):
        if st.st_uid not in (0, uid):
            raise UnsafeCertDir(
                f"--webhook-cert-dir {cert_dir}: owned by uid {st.st_uid} and not a Secret volume (no ..data): "
                "the certificate and key there are whoever owns it's to choose; mount the webhook Secret there, "
                "or use a directory of your own"
            )
        return None
    if st.st_uid != uid:
        raise UnsafeCertDir(
            f"--webhook-cert-dir {cert_dir}: owned by uid {st.st_uid}, not by this user (uid {uid}); "
            f"the private key is written there: use a directory of your own (chown {uid} {cert_dir}, "
            f"or point --webhook-cert-dir at a new path)"
        )
    if st.st_mode & 0o022:
        raise UnsafeCertDir(
            f"--webhook-cert-dir {cert_dir}: mode {st.st_mode & 0o777:04o} lets its group or others write "
            f"there, next to the private key: chmod go-w {cert_dir} (0700 is best)"
        )
    # Every directory above it too: whoever may rename an ancestor can put a directory of
    # their own in its place. A sticky one (/tmp) lets no one rename what is not theirs.
    for parent in cert_dir.resolve().parents:
        pst = parent.stat()
        if pst.st_uid not in (0, uid) or (pst.st_mode & 0o022 and not pst.st_mode & 0o1000):
            raise UnsafeCertDir(
                f"--webhook-cert-dir {cert_dir}: {parent} (owned by uid {pst.st_uid}, mode "
                f"{pst.st_mode & 0o7777:04o}) lets someone else replace the directory that holds the private key: "
                "use a directory under one only you and root may write"
            )
    return cert_dir


@dataclass(frozen=True)
class Certificate:
    """The webhook certificate the leader keeps: this Secret, valid for these names, with
    its CA in this MutatingWebhookConfiguration's caBundle, checked every `check_every`
    seconds."""

    namespace: str
    secret: str
    names: tuple[str, ...]
    configuration: str
    check_every: float = 10.0


@dataclass(frozen=True)
class Serving:
    """Where and how a process serves the webhook."""

    cert_dir: str  # tls.crt and tls.key
    port: int = 9443
    host: str = "0.0.0.0"
    cert_reload: float = 10.0  # seconds between checks of the certificate files
    api_server_cidrs: tuple[str, ...] = ()  # besides the EndpointSlice default/kubernetes


@dataclass
class Replica:
    """What the certificate keeper needs of the controller replica it runs in."""

    stop: threading.Event
    leading: Callable[[], bool]
    fence: Callable[[], None]  # raises NotLeader when this replica may no longer write
    on_error: Callable[[str], None]  # counts an error of a component


class WebhookHost:
    """Serves the webhook from a certificate directory, once its files are there, with
    what a process's inputs (cluster/inputs.py) know."""

    def __init__(
        self,
        api: Api,
        stop: threading.Event,
        on_error: Callable[[str], None],
        inputs: Inputs,
        observe: Callable[[str, float], None],
        serving: Serving,
    ) -> None:
        self.api, self.stop, self.on_error, self.observe = api, stop, on_error, observe
        self.sources = Sources.of(inputs)
        self.peers = ApiServerPeers(serving.api_server_cidrs, on_error=on_error)
        self.cert_dir = Path(serving.cert_dir)
        self.port, self.host, self.reload_every = serving.port, serving.host, serving.cert_reload
        self.server: WebhookServer | None = None

    def start(self) -> None:
        """Check the certificate directory (an unsafe one raises UnsafeCertDir here, said
        once) and serve once its files exist, from a thread that ends when the server runs."""
        own_cert_dir(self.cert_dir)
        threading.Thread(
            target=self.peers.follow, args=(self.api, self.stop), name="api-server-peers", daemon=True
        ).start()
        threading.Thread(target=self._serve_when_ready, name="webhook-start", daemon=True).start()

    def alive(self) -> bool:
        return self.server is None or self.server.alive()

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.shutdown()

    def _serve_when_ready(self) -> None:
        """A managed Secret appears in the mounted directory only after the leader created
        it and the kubelet synced it."""
        cert_dir = self.cert_dir
        said = False

        def start() -> bool:
            nonlocal said
            if not ((cert_dir / "tls.crt").is_file() and (cert_dir / "tls.key").is_file()):
                if not said:
                    log.info("waiting for the webhook certificate files", extra={"dir": str(cert_dir)})
                    said = True
                return False
            self.server = WebhookServer(
                self.port, cert_dir, self.sources, self.host, self.observe, self.reload_every, peers=self.peers
            ).start()
            log.info("webhook serving", extra={"port": self.port})
            return True

        every(1.0, self.stop, start, "webhook server start", "webhook", self.on_error, first=0.0)


class CertificateKeeper:
    """The leader keeps the webhook certificate and the caBundle right (webhook/certs.py);
    every replica writes them into a directory of its own off a cluster (`cert_dir`, when
    it is not a Secret volume)."""

    def __init__(self, api: Api, replica: Replica, certificate: Certificate, cert_dir: str | None) -> None:
        self.api, self.replica, self.certificate = api, replica, certificate
        self.cert_dir = Path(cert_dir) if cert_dir else None

    def run(self) -> None:
        """A check reads the Secret and the webhook configuration (two GETs) and fixes what
        differs, whatever the order the user made them in: every `check_every` seconds, at
        once when this replica starts or stops leading, and every second while its own
        directory has no certificate yet."""
        c, replica = self.certificate, self.replica
        manager = CertManager(self.api, c.namespace, c.secret, list(c.names), c.configuration)
        try:
            files = own_cert_dir(self.cert_dir) if self.cert_dir is not None else None
        except UnsafeCertDir as exc:
            log.error("webhook certificate not written", extra={"error": str(exc)})
            replica.on_error("certificate")
            files = None
        due, was_leading = 0.0, None

        def check() -> None:
            nonlocal due, was_leading
            leading = replica.leading()
            if leading == was_leading and time.monotonic() < due:
                return
            was_leading, due = leading, time.monotonic() + c.check_every
            try:
                if leading:
                    replica.fence()
                    manager.ensure()
                if files is not None:
                    # A directory of the controller's own (off-cluster): no kubelet puts the
                    # Secret there. Checked again before each write: it may have changed.
                    own_cert_dir(files)
                    manager.write_files(files)
                    if not (files / "tls.crt").is_file():
                        due = time.monotonic() + 1.0
            except NotLeader:
                due = 0.0
            except UnsafeCertDir as exc:
                log.error("webhook certificate not written", extra={"error": str(exc)})
                replica.on_error("certificate")

        every(1.0, replica.stop, check, "webhook certificate check", "certificate", replica.on_error, first=0.0)
