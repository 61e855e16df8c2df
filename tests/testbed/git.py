"""A Git repository served on loopback over Git's smart HTTP protocol (`git http-backend`
behind a small HTTP server), read-only and without auth, with a working copy to commit and
push from as a user does: what the GitOps tools (Flux, Argo CD) sync from in the tests."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .controlplane import ControlPlaneError


class _GitHandler(BaseHTTPRequestHandler):
    """Git's smart HTTP protocol: each request handed to `git http-backend` as CGI."""

    root: Path

    def do_GET(self) -> None:
        self._cgi()

    def do_POST(self) -> None:
        self._cgi()

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _cgi(self) -> None:
        path, _, query = self.path.partition("?")
        body = self._body()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(self.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": self.client_address[0],
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
        }
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        sep = b"\r\n\r\n" if b"\r\n\r\n" in out else b"\n\n"
        head, _, payload = out.partition(sep)
        status, headers = 200, []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class GitServer:
    """A bare repository, `<name>.git`, served read-only over plain HTTP on loopback, and a
    working copy to commit to and push from, as a user would."""

    workdir: Path
    name: str = "kube-headroom"
    port: int = 0
    _server: ThreadingHTTPServer | None = None

    @property
    def bare(self) -> Path:
        return self.workdir / "served" / f"{self.name}.git"

    @property
    def checkout(self) -> Path:
        return self.workdir / "checkout"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.name}.git"

    def git(self, *args: str) -> str:
        r = subprocess.run(["git", "-C", str(self.checkout), *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise ControlPlaneError(f"git {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout.strip()

    def start(self, tree: dict[str, bytes]) -> GitServer:
        """Serve a repository whose first commit on `main` holds `tree` (path → content)."""
        self.bare.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(self.bare)], check=True)
        self.checkout.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "-b", "main")
        self.git("config", "user.name", "Platform Team")
        self.git("config", "user.email", "platform@example.com")
        self.git("remote", "add", "origin", str(self.bare))
        self.commit("Headroom's configuration", tree)
        handler = type("Handler", (_GitHandler,), {"root": self.bare.parent})
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True, name="git-http").start()
        return self

    def commit(self, message: str, files: Mapping[str, bytes | None]) -> str:
        """Write (or, with None, delete) files, commit and push to `main`; the commit's SHA."""
        for path, content in files.items():
            target = self.checkout / path
            if content is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        self.git("push", "-q", "origin", "main")
        return self.git("rev-parse", "HEAD")

    def read(self, path: str) -> str:
        return (self.checkout / path).read_text()

    def edit(self, path: str, old: str, new: str) -> bytes:
        """The file at `path` with `old` (which must be there) replaced by `new`."""
        text = self.read(path)
        if old not in text:
            raise ControlPlaneError(f"{path}: {old!r} not found")
        return text.replace(old, new).encode()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def source_tree(root: Path, prefixes: tuple[str, ...] = ("crds/", "charts/", "examples/")) -> dict[str, bytes]:
    """The files git tracks under `prefixes` in the checkout at `root`: what a user's
    repository holds of this project."""
    files = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", *prefixes], capture_output=True, check=True
    ).stdout.split(b"\0")
    return {f.decode(): (root / f.decode()).read_bytes() for f in files if f and (root / f.decode()).is_file()}
