"""Container images written locally as OCI image archives, for a node with no registry.

`ctr images import` reads an OCI image layout in a tar file (oci-layout, index.json,
blobs/sha256/...). Each image here is one uncompressed layer made from files on this
machine: a static pause binary, Debian's static busybox with its applet links, or the
controller's image (`controller_image`). The archive is reproducible: the same files give the same digest (fixed times, owners and
order).

Written by hand rather than with a library: no maintained Python package writes OCI
layouts, and the format is four JSON documents around a tar (the image-spec v1.1 layout).
"""

from __future__ import annotations

import gzip
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
    """One file of the layer: a regular file from `source` (or `data`), a symlink to
    `link`, or a directory (`directory`)."""

    path: str  # inside the image, without the leading slash
    source: Path | None = None
    link: str | None = None
    mode: int = 0o755
    data: bytes | None = None
    directory: bool = False


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
            if e.directory and e.path in dirs:
                continue
            info = tarfile.TarInfo(e.path)
            info.mtime, info.mode, info.uid, info.gid = 0, e.mode, 0, 0
            if e.directory:
                dirs.add(e.path)
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif e.link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, e.link
                tar.addfile(info)
            else:
                data = e.data if e.data is not None else e.source.read_bytes()  # type: ignore[union-attr]
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


def write_image(
    out: Path,
    name: str,
    entries: Iterable[Entry],
    entrypoint: list[str] | None = None,
    config: dict[str, object] | None = None,
    gzip_layer: bool = False,
) -> str:
    """Write the image `name` (e.g. `headroom.local/pause:1`) as an OCI archive at `out`;
    its manifest digest. `config` is the image config's `config` (User, Env, Cmd …);
    `gzip_layer` stores the layer compressed (a gzip header without a time: reproducible)."""
    layer = _layer(entries)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    image_config = dict(config or {})
    if entrypoint:
        image_config["Entrypoint"] = entrypoint
    config_blob = _json(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": image_config,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    )
    media = LAYER
    if gzip_layer:
        layer, media = gzip.compress(layer, compresslevel=9, mtime=0), LAYER + "+gzip"
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        config_digest = _blob(tar, config_blob)
        layer_digest = _blob(tar, layer)
        manifest = _json(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": {"mediaType": CONFIG, "digest": config_digest, "size": len(config_blob)},
                "layers": [{"mediaType": media, "digest": layer_digest, "size": len(layer)}],
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
