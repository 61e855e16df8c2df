"""`headroom validate` against the API server's own verdict, on a generated corpus.

Each file goes through kubectl as a user sends it (create and server-side apply, both
`--dry-run=server --validate=strict`) against the test kube-apiserver, and through
`headroom validate`. They must agree on accept/reject, and a rejection must name the
same field. Every server-accepted object must also load into the controller's
configuration resolver and the planner without raising.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from headroom.api.resolve import resolve
from headroom.api.validate import UnreadableFile, load_documents, objects, validate_file
from headroom.core.records import namespace_from_dict, node_from_dict, pod_from_dict
from helpers.chart import TOOLS
from helpers.factories import container, namespace, node, pod
from helpers.parity_corpus import generate

KUBECTL = TOOLS / "bin" / "kubectl"
NODE = node_from_dict(node("n1", labels={"pool": "batch"}))
PODS = [pod_from_dict(pod(f"p{i}", namespace="team", containers=[container(cpu="250m")])) for i in range(3)]
NAMESPACES = {"team": namespace_from_dict(namespace("team"))}
COUNT = 520

# Disagreements that are deliberate, each with its reason: (substring of the case name, reason).
EXCEPTIONS: list[tuple[str, str]] = []


def _kubectl(kubeconfig: Path, *args: str) -> tuple[bool, str]:
    r = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True, timeout=60
    )
    return r.returncode == 0, (r.stderr + r.stdout).strip()


def _names(path: str, message: str) -> bool:
    """Whether the server's message names the field (or, for maps of labels and the like,
    its parent: the server reports `metadata.labels` where we name the key)."""
    if path in ("apiVersion", "kind"):
        return "no matches for kind" in message or path in message
    parts = path.split(".")
    return any(".".join(parts[:n]) in message for n in range(len(parts), 1, -1)) or path in message


def test_validate_gives_the_api_servers_verdict_on_a_generated_corpus(control_plane, crds_installed, tmp_path):
    kubeconfig = control_plane.kubeconfig()
    cases = generate(COUNT)
    files = []
    for i, case in enumerate(cases):
        f = tmp_path / f"case-{i:04d}.yaml"
        f.write_text(case.text)
        files.append(f)

    def server(f: Path) -> tuple[bool, str, bool, str]:
        created = _kubectl(kubeconfig, "create", "--dry-run=server", "--validate=strict", "-f", str(f))
        applied = _kubectl(
            kubeconfig,
            "apply",
            "--server-side",
            "--dry-run=server",
            "--validate=strict",
            "--field-manager=parity",
            "-f",
            str(f),
        )
        return (*created, *applied)

    with ThreadPoolExecutor(max_workers=8) as pool:
        verdicts = list(pool.map(server, files))

    disagreements: list[str] = []
    crashes: list[str] = []
    families: dict[str, int] = {}
    for case, f, (c_ok, c_msg, a_ok, a_msg) in zip(cases, files, verdicts, strict=True):
        try:
            _, problems = validate_file(f)
        except UnreadableFile as exc:
            problems = [exc]  # type: ignore[list-item]
        except Exception as exc:
            crashes.append(f"{case.name}: {type(exc).__name__}: {exc}")
            continue
        server_ok = c_ok and a_ok
        ours_ok = not problems
        family = case.name.split(" ")[0].split(".")[0]
        if server_ok != ours_ok:
            if any(s in case.name for s, _ in EXCEPTIONS):
                continue
            families[family] = families.get(family, 0) + 1
            disagreements.append(
                f"{case.name}: server {'accepts' if server_ok else 'refuses'} (create {c_ok}, apply {a_ok}: "
                f"{(c_msg if not c_ok else a_msg)[:300]}); validate {'accepts' if ours_ok else 'refuses'} "
                f"({'; '.join(str(p) for p in problems)[:300]})"
            )
        elif not ours_ok and problems and hasattr(problems[0], "path"):
            msg = c_msg if not c_ok else a_msg
            if not any(_names(p.path, msg) for p in problems):
                disagreements.append(f"{case.name}: field differs: server {msg[:300]!r}; validate {problems[0]}")
        if server_ok:  # what the cluster stores, the controller must load without raising
            try:
                docs = list(objects(load_documents(f)))
                res = resolve(
                    [d for d in docs if d.get("kind") == "HeadroomConfig"],
                    [d for d in docs if d.get("kind") == "NodePoolProfile"],
                )
                res.resolver.settings_for({"pool": "batch"})
            except Exception as exc:
                crashes.append(f"{case.name}: the loader raised {type(exc).__name__}: {exc}")
    accepted = sum(1 for v in verdicts if v[0] and v[2])
    print(
        f"\nparity: {len(cases)} files, the server accepts {accepted}; {len(disagreements)} disagreements "
        f"{families}, {len(crashes)} crashes"
    )
    assert not crashes, "\n".join(crashes[:20])
    assert not disagreements, f"{len(disagreements)} disagreements:\n" + "\n".join(disagreements[:40])
