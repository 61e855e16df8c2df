"""The controller's container image, built with no container engine and no registry.

The same image the Dockerfile describes (Python 3.11 on Debian bookworm, the package and
its dependencies installed, user 65532, entrypoint `headroom`, command `run`), made from:

- a root filesystem of Debian's `python3.11-minimal`, `libpython3.11-stdlib` and `libstdc++6` and their
  dependencies, unpacked by `mmdebstrap --variant=extract` (no package scripts run, no
  shell, no package manager, no compiler in the image);
- the project's wheel (built from its sdist) and its dependencies' binary wheels for CPython 3.11 on manylinux,
  installed by pip into `/usr/local/lib/python3.11/dist-packages` (on Debian's sys.path);
- one gzip-compressed layer written by `images.write_image`: fixed times, owners and
  order, so the same inputs (the Debian packages and wheels of the day) give the same
  digest.

Left out to keep it small (each is something headroom never reads): Debian's docs,
manuals and translations; the package manager, tar and their state; `kubernetes.aio`, the Kubernetes
client's asyncio copy (the controller imports `kubernetes.client` and `kubernetes.config`);
no `.pyc` files (the root filesystem is read-only; the byte code is compiled in memory at
start).

`python -m testbed.controller_image OUT.tar` builds it and prints the digest, the
sizes and what takes the space; `make image` does that into `.cache/image/`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .images import Entry, write_image

SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3.11-minimal", "libpython3.11-stdlib", "libstdc++6")  # libstdc++: google-re2 (CEL)
PYTHON = "/usr/bin/python3.11"
SITE = "usr/local/lib/python3.11/dist-packages"
UID = 65532
# Binary wheels only (nothing is compiled): the manylinux tags bookworm's glibc 2.36 runs.
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in (36, 34, 31, 28, 24, 17, 12, 5)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
LEFT_OUT = (
    "dev/",  # the runtime makes /dev
    # Dependencies of the Debian packages that the image never runs: the package manager
    # (dpkg, update-alternatives), tar, and their configuration.
    "bin/",
    "sbin/",
    "usr/sbin/",
    "usr/bin/dpkg",
    "usr/bin/update-alternatives",
    "usr/lib/dpkg/",
    "usr/share/dpkg/",
    "etc/alternatives/",
    "etc/cron.daily/",
    "etc/dpkg/",
    "etc/logrotate.d/",
    "etc/apt/",
    "etc/fstab",
    "etc/hostname",  # the runtime mounts these three
    "etc/resolv.conf",
    "etc/hosts",
    "tmp/",
    "usr/share/doc/",
    "usr/share/info/",
    "usr/share/lintian/",
    "usr/share/locale/",
    "usr/share/man/",
    "var/cache/",
    "var/lib/apt/",
    "var/lib/dpkg/",
    "var/log/",
    f"{SITE}/bin/",  # pip's scripts name the build machine's Python; ours are below
    f"{SITE}/kubernetes/aio/",
)
SCRIPT = f"""#!{PYTHON}
import sys
from headroom.commands.cli import main
if __name__ == "__main__":
    sys.exit(main())
"""
# What the Dockerfile's final stage says too (tests/integration/realcluster/test_image.py
# checks that the two agree).
CONFIG: dict[str, object] = {
    "User": f"{UID}:{UID}",
    "Cmd": ["run"],
    "Env": [
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE=1",
        "PYTHONUNBUFFERED=1",
    ],
    "ExposedPorts": {"8080/tcp": {}, "8081/tcp": {}, "9443/tcp": {}},
    "WorkingDir": "/",
}
ENTRYPOINT = ["headroom"]


class ImageBuildError(RuntimeError):
    pass


@dataclass
class BuiltImage:
    path: Path
    name: str
    digest: str  # the manifest's: what `ctr images ls` shows
    archive_bytes: int
    unpacked_bytes: int
    space: list[tuple[str, int]] = field(default_factory=list)  # (directory, bytes), largest first


def _run(argv: list[str], what: str) -> None:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise ImageBuildError(f"{what} failed ({' '.join(argv[:3])} …): {(r.stderr or r.stdout).strip()[-2000:]}")


def _left_out(path: str) -> bool:
    return any(path == p.rstrip("/") or path.startswith(p) for p in LEFT_OUT) or "/__pycache__" in f"/{path}"


def _tree(root: Path, prefix: str = "") -> list[Entry]:
    """The files under `root` as layer entries at `prefix` (directories, regular files with
    their permission bits, symlinks), minus what is left out."""
    entries: list[Entry] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not _left_out(f"{prefix}{Path(dirpath, d).relative_to(root)}")]
        for name in sorted(dirnames) + sorted(filenames):
            full = Path(dirpath, name)
            rel = f"{prefix}{full.relative_to(root)}"
            if _left_out(rel):
                continue
            st = full.lstat()
            if stat.S_ISLNK(st.st_mode):
                entries.append(Entry(rel, link=os.readlink(full)))
            elif stat.S_ISDIR(st.st_mode):
                entries.append(Entry(rel, directory=True, mode=stat.S_IMODE(st.st_mode)))
            elif stat.S_ISREG(st.st_mode):
                entries.append(Entry(rel, source=full, mode=stat.S_IMODE(st.st_mode)))
    return entries


def build(out: Path, repo: Path) -> BuiltImage:
    """Build the image from the checkout at `repo` into the OCI archive `out`."""
    if shutil.which("mmdebstrap") is None:
        raise ImageBuildError("mmdebstrap is not installed (Debian package mmdebstrap; `make image` installs it)")
    work = Path(tempfile.mkdtemp(prefix="headroom-image-"))
    try:
        rootfs, wheels, site = work / "rootfs", work / "wheel", work / "site"
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
        # The sdist first, then the wheel from it, as a release is built: never from the
        # git-ignored build/ of the checkout, where modules renamed or removed linger.
        _run([sys.executable, "-m", "build", "--outdir", str(wheels), str(repo)], "building the wheel")
        wheel = next(wheels.glob("*.whl"))
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        target = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--target", str(site)]
        _run([*pip, "install", "--no-compile", "--only-binary=:all:", *platforms, *target, str(wheel)], "installing")
        # Not inputs, so not in the image: `direct_url.json` names the build directory, and
        # pip's scripts in bin/ (left out) name the Python that ran pip. RECORD lists neither.
        for direct_url in site.glob("*.dist-info/direct_url.json"):
            direct_url.unlink()
        for record in site.glob("*.dist-info/RECORD"):
            lines = record.read_text().splitlines(keepends=True)
            kept = [line for line in lines if not line.startswith("../../bin/") and "/direct_url.json," not in line]
            record.write_text("".join(kept))
        include = f"--include={','.join(DEBIAN_PACKAGES)}"
        _run(["mmdebstrap", "--quiet", "--variant=extract", "--mode=root", include, SUITE, str(rootfs)], "mmdebstrap")
        if not (rootfs / PYTHON.lstrip("/")).exists():
            raise ImageBuildError(f"the root filesystem has no {PYTHON}")
        entries = _tree(rootfs) + _tree(site, f"{SITE}/")
        entries += [
            Entry(f"usr/local/bin/{name}", data=SCRIPT.encode(), mode=0o755)
            for name in ("headroom", "kubectl-headroom")
        ]
        entries += [
            Entry(
                "etc/passwd",
                data=f"root:x:0:0:root:/root:/usr/sbin/nologin\nheadroom:x:{UID}:{UID}::/:/usr/sbin/nologin\n".encode(),
                mode=0o644,
            ),
            Entry("etc/group", data=f"root:x:0:\nheadroom:x:{UID}:\n".encode(), mode=0o644),
            Entry("tmp", directory=True, mode=0o1777),
        ]
        unique = list({e.path: e for e in entries}.values())  # ours last: they win
        version = wheel.name.split("-")[1]  # kube_headroom-<version>-py3-none-any.whl
        name = f"headroom.local/kube-headroom:{version}"
        config = {
            **CONFIG,
            "Labels": {
                "org.opencontainers.image.title": "kube-headroom",
                "org.opencontainers.image.version": version,
                "org.opencontainers.image.base.name": f"debian:{SUITE} ({' '.join(DEBIAN_PACKAGES)})",
            },
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        digest = write_image(out, name, unique, ENTRYPOINT, config=config, gzip_layer=True)
        space: Counter[str] = Counter()
        total = 0
        for e in unique:
            size = len(e.data) if e.data is not None else (e.source.stat().st_size if e.source is not None else 0)
            total += size
            parts = e.path.split("/")
            space["/".join(parts[:6] if e.path.startswith(SITE) else parts[:-1][:3])] += size
        return BuiltImage(out, name, digest, out.stat().st_size, total, space.most_common(8))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the controller image as an OCI archive, with no daemon.")
    parser.add_argument("out", type=Path, help="the archive to write, e.g. .cache/image/kube-headroom.tar")
    parser.add_argument("--repo", type=Path, default=Path.cwd(), help="the checkout to build (default: here)")
    args = parser.parse_args(argv)
    try:
        image = build(args.out, args.repo)
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{image.name} {image.digest}")
    print(f"archive {image.archive_bytes / 1e6:.1f} MB (one gzip layer), unpacked {image.unpacked_bytes / 1e6:.1f} MB")
    for path, size in image.space:
        print(f"  {size / 1e6:6.1f} MB  /{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
