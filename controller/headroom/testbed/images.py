"""Container images written locally as OCI image archives, for a node with no registry.

`ctr images import` reads an OCI image layout in a tar file (oci-layout, index.json,
blobs/sha256/...). Each image here is one uncompressed layer made from files on this
machine: a static pause binary, or Debian's static busybox with its applet links. The
archive is reproducible: the same files give the same digest (fixed times, owners and
order).

Written by hand rather than with a library: no maintained Python package writes OCI
layouts, and the format is four JSON documents around a tar (the image-spec v1.1 layout).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"


@dataclass(frozen=True, slots=True)
class Entry:
    """One file of the layer: a regular file from `source`, or a symlink to `link`."""

    path: str  # inside the image, without the leading slash
    source: Path | None = None
    link: str | None = None
    mode: int = 0o755


def _layer(entries: Iterable[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for e in sorted(entries, key=lambda e: e.path):
            parts = e.path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                    tar.addfile(info)
            info = tarfile.TarInfo(e.path)
            info.mtime, info.mode, info.uid, info.gid = 0, e.mode, 0, 0
            if e.link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, e.link
                tar.addfile(info)
            else:
                assert e.source is not None
                data = e.source.read_bytes()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest[7:]}")
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    tar.addfile(info, io.BytesIO(data))
    return digest


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def write_image(out: Path, name: str, entries: Iterable[Entry], entrypoint: list[str] | None = None) -> str:
    """Write the image `name` (e.g. `headroom.local/pause:1`) as an OCI archive at `out`;
    its manifest digest."""
    layer = _layer(entries)
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = _json(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint} if entrypoint else {},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }
    )
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        config_digest = _blob(tar, config)
        _blob(tar, layer)
        manifest = _json(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": {"mediaType": CONFIG, "digest": config_digest, "size": len(config)},
                "layers": [{"mediaType": LAYER, "digest": layer_digest, "size": len(layer)}],
            }
        )
        manifest_digest = _blob(tar, manifest)
        index = _json(
            {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": MANIFEST,
                        "digest": manifest_digest,
                        "size": len(manifest),
                        "annotations": {
                            "io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                        },
                    }
                ],
            }
        )
        for path, data in (("oci-layout", _json({"imageLayoutVersion": "1.0.0"})), ("index.json", index)):
            info = tarfile.TarInfo(path)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return manifest_digest


def busybox_entries(busybox: Path, applets: Iterable[str]) -> list[Entry]:
    """Debian's static busybox at /bin/busybox, with a link per applet in /bin."""
    entries = [Entry("bin/busybox", source=busybox)]
    entries += [Entry(f"bin/{a}", link="busybox") for a in sorted(set(applets)) if a != "busybox"]
    return entries
