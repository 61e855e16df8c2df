"""The controller image, built here with no container engine (`make image`), run by the real
node's containerd the way the chart runs it."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headroom.cluster.client import Api, pod_path
from helpers.chart import find, render
from testbed.controller_image import PYTHON, SITE, BuiltImage, build
from testbed.node import RealNode

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> BuiltImage:
    return build(tmp_path_factory.mktemp("image") / "kube-headroom.tar", ROOT)


def _archive(path: Path) -> tuple[dict[str, Any], set[str]]:
    """The image config and the paths in its layer."""
    with tarfile.open(path) as tar:

        def blob(digest: str) -> bytes:
            f = tar.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert f is not None
            return f.read()

        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        manifest = json.loads(blob(index["manifests"][0]["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        (layer,) = manifest["layers"]
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(layer["digest"])))) as files:
            return config, set(files.getnames())


def test_the_image_is_reproducible_and_small(image: BuiltImage, tmp_path: Path) -> None:
    # Again through `make image`'s entry point, which prints the name and digest first.
    again = subprocess.run(
        [sys.executable, "-m", "testbed.controller_image", str(tmp_path / "again.tar"), "--repo", str(ROOT)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "tests")},
    )
    assert again.returncode == 0, again.stderr
    print(
        f"\nimage {image.name} {image.digest}: archive {image.archive_bytes / 1e6:.1f} MB, "
        f"unpacked {image.unpacked_bytes / 1e6:.1f} MB; largest: "
        + ", ".join(f"/{p} {b / 1e6:.1f} MB" for p, b in image.space[:5])
    )
    assert again.stdout.split("\n")[0] == f"{image.name} {image.digest}"  # the same inputs, the same digest
    assert image.archive_bytes < 60e6 and image.unpacked_bytes < 200e6
    _, paths = _archive(image.path)
    # No package manager, shell, compiler or pip inside: what runs is Python and the package.
    for tool in ("usr/bin/apt", "usr/bin/dpkg", "bin/tar", "bin/sh", "bin/bash", "usr/bin/gcc", f"{PYTHON[1:]}-config"):
        assert tool not in paths
    assert {p for p in paths if p.startswith(("bin/", "usr/bin/", "usr/sbin/", "sbin/"))} <= {
        PYTHON[1:],
        "usr/local/bin/headroom",
        "usr/local/bin/kubectl-headroom",
    }
    assert not [p for p in paths if p.endswith("/pip") or "/__pycache__/" in p]
    # The package is the checkout's sources, nothing more: no module renamed or removed since
    # lingers from the git-ignored build/ directory of an earlier build.
    tracked = subprocess.run(["git", "ls-files", "headroom"], cwd=ROOT / "controller", capture_output=True, text=True)
    assert tracked.returncode == 0, tracked.stderr
    assert {p for p in paths if p.startswith(f"{SITE}/headroom/") and p.endswith(".py")} == {
        f"{SITE}/{path}" for path in tracked.stdout.split()
    }


def test_the_image_and_the_dockerfile_describe_the_same_container(image: BuiltImage) -> None:
    config, paths = _archive(image.path)
    final = (ROOT / "Dockerfile").read_text().split("\nFROM ")[-1]
    base = re.match(r"python:(\d+\.\d+)-slim-(\w+)", final)
    user = re.search(r"^USER (\S+)", final, re.M)
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])", final, re.M)
    cmd = re.search(r"^CMD (\[.*\])", final, re.M)
    env = dict(kv.split("=", 1) for kv in re.search(r"^ENV (.*)", final, re.M)[1].split())  # type: ignore[index]
    assert base and user and entrypoint and cmd
    assert config["config"]["User"] == user[1]
    assert config["config"]["Entrypoint"] == json.loads(entrypoint[1])
    assert config["config"]["Cmd"] == json.loads(cmd[1])
    assert {k: v for k, v in (e.split("=", 1) for e in config["config"]["Env"]) if k in env} == env
    assert f"/usr/bin/python{base[1]}" == PYTHON and PYTHON[1:] in paths
    assert config["config"]["Labels"]["org.opencontainers.image.base.name"].startswith(f"debian:{base[2]} ")
    exposed = set(re.search(r"^EXPOSE (.*)", final, re.M)[1].split())  # type: ignore[index]
    assert {p.split("/")[0] for p in config["config"]["ExposedPorts"]} == exposed


@pytest.fixture
def imported(image: BuiltImage, real_node: RealNode) -> Iterator[str]:
    real_node.import_image(image.path)
    yield image.name


def _chart_pod(name: str, image: str, node: str, args: list[str], config_map: str) -> dict[str, Any]:
    """A pod with the controller container as the chart renders it (securityContext, probes
    left out: this runs one command), the rendered args replaced by `args`."""
    (deployment,) = (
        d
        for d in find(render(), "Deployment")
        if d["spec"]["template"]["spec"]["containers"][0]["name"] == "controller"
    )
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "securityContext": spec["securityContext"],
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "controller",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "args": args,
                    "resources": container["resources"],
                    "securityContext": container["securityContext"],
                    "volumeMounts": [{"name": "input", "mountPath": "/input", "readOnly": True}],
                }
            ],
            "volumes": [{"name": "input", "configMap": {"name": config_map}}],
        },
    }


def _finished(api: Api, node: RealNode, ns: str, name: str, timeout: float = 90) -> tuple[dict[str, Any], str]:
    deadline = time.monotonic() + timeout
    while True:
        pod = api.get(pod_path(ns, name))
        if pod["status"].get("phase") in ("Succeeded", "Failed"):
            return pod, node.container_log(pod, "controller")
        assert time.monotonic() < deadline, f"{ns}/{name} did not finish: {pod['status']}"
        time.sleep(0.5)


def test_the_image_runs_on_the_real_node_under_the_charts_security_context(
    api: Api, namespace: str, real_node: RealNode, imported: str
) -> None:
    """Non-root 65532, read-only root filesystem, no capabilities, RuntimeDefault seccomp:
    `headroom plan` on the example snapshot prints in the pod exactly what it prints here,
    and `headroom validate` finds the same mistake in a bad HeadroomConfig."""
    snapshot = (ROOT / "examples" / "cluster-snapshot.yaml").read_text()
    bad = "apiVersion: kube-headroom.dev/v1alpha1\nkind: HeadroomConfig\nmetadata: {name: cluster}\nspec: {maxMultiplier: 0.5}\n"
    api.post(
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"metadata": {"name": "input"}, "data": {"snapshot.yaml": snapshot, "bad.yaml": bad}},
    )
    api.post(
        f"/api/v1/namespaces/{namespace}/pods",
        _chart_pod("plan", imported, real_node.name, ["plan", "--snapshot", "/input/snapshot.yaml"], "input"),
    )
    api.post(
        f"/api/v1/namespaces/{namespace}/pods",
        _chart_pod("validate", imported, real_node.name, ["validate", "/input/bad.yaml"], "input"),
    )
    here = subprocess.run(
        [sys.executable, "-m", "headroom", "plan", "--snapshot", str(ROOT / "examples" / "cluster-snapshot.yaml")],
        capture_output=True,
        text=True,
    )
    pod, logs = _finished(api, real_node, namespace, "plan")
    assert pod["status"]["phase"] == "Succeeded", logs
    assert logs == here.stdout and here.returncode == 0
    bad_path = Path(real_node.workdir) / "bad.yaml"
    bad_path.write_text(bad)
    here = subprocess.run([sys.executable, "-m", "headroom", "validate", str(bad_path)], capture_output=True, text=True)
    pod, logs = _finished(api, real_node, namespace, "validate")
    assert pod["status"]["phase"] == "Failed" and here.returncode != 0
    (state,) = [s["state"]["terminated"] for s in pod["status"]["containerStatuses"]]
    assert state["exitCode"] == here.returncode
    assert logs.replace("/input/bad.yaml", "BAD") == (here.stdout + here.stderr).replace(str(bad_path), "BAD")
