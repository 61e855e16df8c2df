"""Something to install: the wheel and sdist `python -m build` makes, installed into a
fresh virtual environment the way a user installs it, run as `headroom` and as the
`kubectl headroom` plugin."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=600)


def test_the_wheel_installs_into_a_fresh_venv_and_runs(tmp_path):
    dist = tmp_path / "dist"
    # no flags: the sdist first, then the wheel from it (never from a stale build/ in the checkout)
    r = run(sys.executable, "-m", "build", "--outdir", dist, ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (wheel,) = dist.glob("kube_headroom-*.whl")
    assert list(dist.glob("kube_headroom-*.tar.gz")), "no sdist"
    import zipfile

    shipped = zipfile.ZipFile(wheel).namelist()
    infrastructure = [f for f in shipped if any(w in f for w in ("testbed", "/sim/", "sim_kubelet", "demo.py"))]
    assert not infrastructure, f"test infrastructure in the wheel: {infrastructure}"
    venv = tmp_path / "venv"
    r = run(getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv)
    assert r.returncode == 0, r.stderr
    r = run(venv / "bin" / "pip", "install", "--quiet", wheel)
    assert r.returncode == 0, r.stderr[-2000:]
    bin_ = venv / "bin"
    version = run(bin_ / "headroom", "--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("headroom "), version
    plan = run(bin_ / "headroom", "plan", "--snapshot", ROOT / "examples" / "cluster-snapshot.yaml", cwd=tmp_path)
    assert plan.returncode == 0 and "NODE" in plan.stdout.upper(), plan.stdout + plan.stderr
    plugin = run(bin_ / "kubectl-headroom", "--help", cwd=tmp_path)
    assert plugin.returncode == 0 and plugin.stdout.startswith("usage: kubectl headroom"), plugin.stdout
    # It runs from the installed package, not from this checkout.
    where = run(bin_ / "python", "-c", "import headroom; print(headroom.__file__)", cwd=tmp_path)
    assert str(venv) in where.stdout, where.stdout


def test_nothing_in_the_product_imports_the_test_infrastructure():
    """The product package (controller/headroom) holds only the product: no module of it
    imports tests/testbed (the local cluster, the simulated kubelet, the demo) or tests/."""
    import ast

    offending = []
    for path in sorted((ROOT / "controller" / "headroom").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in ("testbed", "tests", "cluster_helpers", "factories") or name.startswith(
                    ("headroom.testbed", "headroom.sim", "headroom.demo")
                ):
                    offending.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not offending, offending
    assert not (ROOT / "controller" / "headroom" / "testbed").exists()
