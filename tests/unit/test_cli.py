"""The command line as a user meets it: real subprocesses of the installed entry point."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "examples" / "cluster-snapshot.yaml"


def headroom(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "headroom", *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )


@pytest.fixture(scope="module")
def plan():
    r = headroom("plan", "--snapshot", str(SNAPSHOT), "-o", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


NODE_KEYS = [
    "name",
    "pool",
    "allocatableMilli",
    "bookedMilli",
    "slackMilli",
    "managedRequestsMilli",
    "managedPods",
    "factor",
    "dryRun",
]
POD_KEYS = ["namespace", "name", "node", "managed", "reason", "requestMilli", "targetLimitMilli", "apply", "containers"]
CONTAINER_KEYS = ["name", "requestMilli", "currentLimitMilli", "targetLimitMilli", "apply"]


def test_plan_json_has_exactly_the_spec_shape(plan):
    assert list(plan) == ["nodes", "pods"]
    for n in plan["nodes"]:
        assert list(n) == NODE_KEYS
        assert isinstance(n["factor"], float) and isinstance(n["dryRun"], bool)
    for p in plan["pods"]:
        assert list(p) == POD_KEYS
        for c in p["containers"]:
            assert list(c) == CONTAINER_KEYS
        if not p["managed"]:
            assert p["targetLimitMilli"] is None and p["apply"] is False


def test_every_pod_of_the_snapshot_appears_once(plan):
    names = [(p["namespace"], p["name"]) for p in plan["pods"]]
    assert len(names) == len(set(names)) == SNAPSHOT.read_text().count("\nkind: Pod\n")


def test_plan_of_the_example_cluster(plan):
    pods = {p["name"]: p for p in plan["pods"]}
    # the design's worked example on batch-1
    assert [pods[n]["targetLimitMilli"] for n in ("build-a", "build-b", "build-c")] == [1500, 3000, 12000]
    batch = next(n for n in plan["nodes"] if n["name"] == "batch-1")
    assert (batch["pool"], batch["factor"], batch["slackMilli"]) == ("batch", 2.0, 8000)
    reasons = {p["reason"] for p in plan["pods"]}
    assert {
        "Managed",
        "NamespaceExcluded",
        "NamespaceNotManaged",
        "NotBurstable",
        "PodOptedOut",
        "RestartOnResize",
        "Terminal",
        "NotBound",
        "OwnerKindExcluded",
        "WindowsNode",
    } <= reasons
    # istio-proxy is excluded by name: it keeps its limit and gets no target
    web = {c["name"]: c for c in pods["web-7f9c-a"]["containers"]}
    assert web["istio-proxy"]["targetLimitMilli"] is None and web["istio-proxy"]["currentLimitMilli"] == 200
    # the lat-1 node declares in-place pod-level resize, so the pod-level pod is managed
    assert pods["etl-pod-level"]["managed"] is True


def test_plan_table_is_readable():
    r = headroom("plan", "--snapshot", str(SNAPSHOT))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == [
        "NODE",
        "POOL",
        "ALLOCATABLE",
        "BOOKED",
        "SLACK",
        "MANAGED",
        "FACTOR",
        "MODE",
    ]
    assert "build-c" in r.stdout and "12" in r.stdout


def test_plan_reads_a_kubectl_json_list(tmp_path):
    from ruamel.yaml import YAML

    docs = list(YAML(typ="safe").load_all(SNAPSHOT.read_text()))
    path = tmp_path / "list.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    r = headroom("plan", "--snapshot", str(path), "-o", "json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["pods"]) == SNAPSHOT.read_text().count("\nkind: Pod\n")


def test_explain_shows_the_arithmetic():
    r = headroom("explain", "ci/build-a", "--snapshot", str(SNAPSHOT))
    assert r.returncode == 0, r.stderr
    assert "slack S = 8" in r.stdout and "target 1500m (decided by: minBurstFloor" in r.stdout
    r = headroom("explain", "nope", "-n", "ci", "--snapshot", str(SNAPSHOT))
    assert r.returncode == 2 and "ci/nope is not in" in r.stderr


@pytest.mark.parametrize(
    "content,expected",
    [
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\nspec:\n  nodeName: n\n  containers:\n"
            "  - name: c\n    resources: {requests: {cpu: lots}}\n",
            "Pod/a/p: spec.containers[0].resources.requests.cpu: 'lots' is not a quantity",
        ),
        ("key: [unclosed\n", "not valid YAML"),
        ('{"kind": "List", "items": [\n', "not valid JSON"),
        ("apiVersion: v1\nkind: Node\nmetadata: {}\n", "Node/?: metadata.name is required"),
        ("- just\n- a list\n", "not a Kubernetes object"),
        (
            "apiVersion: kube-headroom.dev/v1alpha1\nkind: HeadroomConfig\nmetadata: {name: cluster}\nspec: {maxMultiplier: 0.5}\n",
            "HeadroomConfig/cluster: spec.maxMultiplier: 0.5 is not allowed",
        ),
    ],
)
def test_bad_snapshot_is_one_line_exit_2(tmp_path, content, expected):
    path = tmp_path / "snap.yaml"
    path.write_text(content)
    r = headroom("plan", "--snapshot", str(path))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert str(path) in r.stderr and expected in r.stderr, r.stderr


def test_missing_snapshot_file():
    r = headroom("plan", "--snapshot", "/nonexistent/snap.yaml")
    assert r.returncode == 2 and "/nonexistent/snap.yaml: cannot read" in r.stderr


def test_validate_exit_codes_and_message_format(tmp_path):
    good = headroom("validate", "examples/headroomconfig.yaml", "examples/nodepoolprofiles.yaml")
    assert good.returncode == 0 and "3 HeadroomConfig/NodePoolProfile object(s) valid" in good.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: kube-headroom.dev/v1alpha1\nkind: NodePoolProfile\nmetadata:\n  name: batch\n"
        "spec:\n  nodeSelector:\n    matchLabels: {pool: batch}\n  deadband:\n    grow: 0.05\n    shrink: 0.1\n"
        "  priorty: 3\n"
    )
    r = headroom("validate", str(bad))
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    # Like the API server with strict field validation: an unknown field is reported alone ...
    assert len(lines) == 1 and lines[0].startswith(
        f"{bad}:11:3: NodePoolProfile/batch: spec.priorty: unknown field 'priorty' (did you mean 'priority'?); allowed here:"
    )
    # ... and once it is fixed, the rules run.
    bad.write_text(bad.read_text().replace("  priorty: 3\n", ""))
    r = headroom("validate", str(bad))
    assert r.stdout.splitlines() == [
        f"{bad}:8:3: NodePoolProfile/batch: spec.deadband: shrink must be less than or equal to grow"
    ]
    notyaml = tmp_path / "x.yaml"
    notyaml.write_text("a: [\n")
    r = headroom("validate", str(notyaml))
    assert r.returncode == 2 and "not valid YAML" in r.stderr and "Traceback" not in r.stderr


def test_crds_check_detects_a_stale_directory(tmp_path):
    assert headroom("crds", "--check").returncode == 0
    r = headroom("crds", "--write", "--dir", str(tmp_path))
    assert r.returncode == 0
    target = tmp_path / "kube-headroom.dev_nodepoolprofiles.yaml"
    target.write_text(target.read_text().replace("npp", "np"))
    r = headroom("crds", "--check", "--dir", str(tmp_path))
    assert r.returncode == 1 and "kube-headroom.dev_nodepoolprofiles.yaml: stale" in r.stderr


def test_kubectl_plugin_name_is_installed():
    import shutil

    bin_dir = Path(sys.executable).parent  # the environment the package is installed in
    assert shutil.which("kubectl-headroom", path=str(bin_dir)) and shutil.which("headroom", path=str(bin_dir))


def test_validate_checks_profiles_merged_with_the_config_in_the_same_run(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "apiVersion: kube-headroom.dev/v1alpha1\nkind: HeadroomConfig\nmetadata: {name: cluster}\n"
        "spec:\n  deadband: {grow: 0.4, shrink: 0.1}\n"
    )
    prof = tmp_path / "profile.yaml"
    prof.write_text(
        "apiVersion: kube-headroom.dev/v1alpha1\nkind: NodePoolProfile\nmetadata: {name: batch}\n"
        "spec:\n  nodeSelector: {matchLabels: {pool: batch}}\n  deadband:\n    shrink: 0.30\n"
    )
    # Against the defaults (grow 0.10) the shrink of 0.30 is inverted once merged ...
    r = headroom("validate", str(prof))
    assert r.returncode == 1
    assert f"{prof}:6:3: NodePoolProfile/batch: spec.deadband: merged with HeadroomConfig" in r.stdout
    # ... and against the config given with it (grow 0.4) it is fine.
    assert headroom("validate", str(cfg), str(prof)).returncode == 0


@pytest.mark.parametrize(
    "flags,expected",
    [
        ([], True),
        (["--leader-elect"], True),
        (["--leader-elect=true"], True),
        (["--leader-elect=false"], False),
        (["--leader-elect", "false"], False),
        (["--no-leader-elect"], False),
    ],
)
def test_boolean_flags_take_the_forms_kubernetes_components_take(flags, expected):
    from headroom.commands.arguments import parser

    assert parser().parse_args(["run", *flags]).leader_elect is expected


def test_a_boolean_flag_with_a_wrong_value_says_what_to_write():
    r = headroom("run", "--leader-elect=maybe")
    assert r.returncode == 2 and "'maybe' is not a boolean; use true or false" in r.stderr


def test_every_subcommand_the_parser_takes_has_what_it_does():
    """The grammar (arguments) and the actions (cli) are two modules: a subcommand added to
    one and not the other is caught here, not by a user's KeyError."""
    from headroom.commands.arguments import parser
    from headroom.commands.cli import COMMANDS

    assert set(parser()._subparsers._group_actions[0].choices) == set(COMMANDS)  # type: ignore[union-attr]


def test_every_run_flag_is_documented_in_operations():
    """docs/operations.md lists every flag of `headroom run` (the parser is the source)."""
    from headroom.commands.arguments import parser

    run = next(a for a in parser()._subparsers._group_actions[0].choices.items() if a[0] == "run")[1]  # type: ignore[union-attr]
    flags = {o for action in run._actions for o in action.option_strings if o.startswith("--") and o != "--help"}
    doc = (ROOT / "docs" / "operations.md").read_text()
    missing = sorted(f for f in flags if f"`{f}" not in doc and f != "--no-leader-elect")
    assert missing == [], f"flags missing from docs/operations.md: {missing}"


def test_plan_says_dry_run_where_a_write_would_happen_in_dry_run(tmp_path):
    from ruamel.yaml import YAML

    docs = list(YAML(typ="safe").load_all((ROOT / "examples" / "cluster-snapshot.yaml").read_text()))
    for doc in docs:
        for obj in doc.get("items", [doc]) if isinstance(doc, dict) else []:
            if obj.get("kind") == "HeadroomConfig":
                obj.setdefault("spec", {})["dryRun"] = True
    snap = tmp_path / "snap.yaml"
    with snap.open("w") as f:
        YAML(typ="safe").dump_all(docs, f)

    def writes(path):
        r = headroom("plan", "--snapshot", str(path))
        assert r.returncode == 0, r.stderr
        rows = [line.split() for line in r.stdout.splitlines()]
        return {row[-1] for row in rows if len(row) == 8 and row[0] != "NAMESPACE"}

    assert "yes" in writes(ROOT / "examples" / "cluster-snapshot.yaml")  # active: some pods would be written
    dry = writes(snap)
    assert "dry-run" in dry and "yes" not in dry


def test_explain_names_where_it_looked_for_a_missing_pod():
    r = headroom("explain", "nope/none", "--snapshot", "examples/cluster-snapshot.yaml")
    assert r.returncode != 0 and "pod nope/none is not in examples/cluster-snapshot.yaml" in r.stderr


def test_validate_suggests_the_field_meant_and_refuses_a_file_with_nothing_to_check(tmp_path):
    typo = tmp_path / "typo.yaml"
    typo.write_text(
        "apiVersion: kube-headroom.dev/v1alpha1\nkind: HeadroomConfig\nmetadata: {name: cluster}\n"
        "spec:\n  maxMultipler: 3\n  rateLimits: {client_qps: 5}\n"
    )
    r = headroom("validate", str(typo))
    assert r.returncode == 1
    assert "unknown field 'maxMultipler' (did you mean 'maxMultiplier'?)" in r.stdout
    assert "unknown field 'client_qps' (did you mean 'clientQPS'?)" in r.stdout
    empty = tmp_path / "other.yaml"
    empty.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    r = headroom("validate", str(empty))
    assert r.returncode == 1 and "no HeadroomConfig or NodePoolProfile" in r.stderr


def test_plan_filters_and_yaml_answer_the_question_asked():
    full = json.loads(headroom("plan", "--snapshot", "examples/cluster-snapshot.yaml", "-o", "json").stdout)
    batch = json.loads(
        headroom("plan", "--snapshot", "examples/cluster-snapshot.yaml", "-o", "json", "--pool", "batch").stdout
    )
    assert batch["nodes"] and {n["pool"] for n in batch["nodes"]} == {"batch"}
    assert {p["node"] for p in batch["pods"]} <= {n["name"] for n in batch["nodes"]}
    changes = json.loads(
        headroom("plan", "--snapshot", "examples/cluster-snapshot.yaml", "-o", "json", "--only-changes").stdout
    )
    assert changes["pods"] and all(p["apply"] for p in changes["pods"])
    assert len(changes["pods"]) < len(full["pods"])
    ns = json.loads(headroom("plan", "--snapshot", "examples/cluster-snapshot.yaml", "-o", "json", "-n", "shop").stdout)
    assert ns["pods"] and {p["namespace"] for p in ns["pods"]} == {"shop"}
    reason = json.loads(
        headroom("plan", "--snapshot", "examples/cluster-snapshot.yaml", "-o", "json", "--reason", "Managed").stdout
    )
    assert reason["pods"] and {p["reason"] for p in reason["pods"]} == {"Managed"}
    from ruamel.yaml import YAML

    as_yaml = YAML(typ="safe").load(
        headroom("plan", "--snapshot", "examples/cluster-snapshot.yaml", "-o", "yaml").stdout
    )
    assert as_yaml == full


@pytest.mark.parametrize(
    "words,cword,expected",
    [
        (["headroom", "pl"], 1, ["plan"]),
        (["headroom", "plan", "--only"], 2, ["--only-changes"]),
        (["headroom", "run", "--leader"], 2, ["--leader-elect"]),
        (["kubectl-headroom", "val"], 1, ["validate"]),
    ],
)
def test_bash_completion_completes_commands_and_flags_from_the_parser(words, cword, expected, tmp_path):
    script = tmp_path / "completion.bash"
    r = headroom("completion", "bash")
    assert r.returncode == 0
    script.write_text(r.stdout)
    words_text = " ".join(f"'{w}'" for w in words)
    probe = (
        f'source {script}; COMP_WORDS=({words_text}); COMP_CWORD={cword}; _headroom; printf "%s\\n" "${{COMPREPLY[@]}}"'
    )
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == expected


def test_plan_wide_shows_each_container_and_which_are_written():
    r = headroom("plan", "--snapshot", "examples/cluster-snapshot.yaml", "-o", "wide")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.split("\n\n")[-1].splitlines()]
    assert rows[0] == ["NAMESPACE", "POD", "CONTAINER", "REQUEST", "LIMIT", "APPLIED", "TARGET", "WRITE"]
    by = {(row[1], row[2]): row[3:] for row in rows[1:]}
    assert by[("web-7f9c-a", "istio-proxy")] == ["100m", "200m", "200m", "-", "-"]  # excluded by name: keeps its limit
    assert by[("build-a", "build")] == ["500m", "none", "none", "1500m", "yes"]  # no limit, in both columns


def test_plan_and_explain_read_vpas_limit_ranges_and_quotas_from_a_snapshot(tmp_path):
    """Offline, the snapshot's neighbours decide as they do live: a VPA that sets limits,
    a LimitRange cap, a quota with no room left."""
    from ruamel.yaml import YAML

    docs = list(YAML(typ="safe").load_all(SNAPSHOT.read_text()))
    managed = {
        (p["namespace"], p["name"])
        for p in json.loads(headroom("plan", "--snapshot", str(SNAPSHOT), "-o", "json").stdout)["pods"]
        if p["reason"] == "Managed"
    }
    pods = [o for d in docs for o in (d.get("items", [d]) if isinstance(d, dict) else []) if o.get("kind") == "Pod"]
    a, b = [p for p in pods if (p["metadata"]["namespace"], p["metadata"]["name"]) in managed][:2]
    ns_a, ns_b = a["metadata"]["namespace"], b["metadata"]["namespace"]
    a["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f", "uid": "u", "controller": True}
    ]
    a["metadata"].setdefault("labels", {})["pod-template-hash"] = "5d8f"
    docs += [
        {
            "apiVersion": "autoscaling.k8s.io/v1",
            "kind": "VerticalPodAutoscaler",
            "metadata": {"name": "web", "namespace": ns_a},
            "spec": {"targetRef": {"kind": "Deployment", "name": "web"}},
        },
        {
            "apiVersion": "v1",
            "kind": "LimitRange",
            "metadata": {"name": "caps", "namespace": ns_b},
            "spec": {"limits": [{"type": "Container", "max": {"cpu": "700m"}}]},
        },
    ]
    snap = tmp_path / "snap.yaml"
    with snap.open("w") as f:
        YAML(typ="safe").dump_all(docs, f)
    r = headroom("plan", "--snapshot", str(snap), "-o", "json")
    assert r.returncode == 0, r.stderr
    by_key = {f"{p['namespace']}/{p['name']}": p for p in json.loads(r.stdout)["pods"]}
    assert by_key[f"{ns_a}/{a['metadata']['name']}"]["reason"] == "VPAControlsLimits"
    key_b = f"{ns_b}/{b['metadata']['name']}"
    r = headroom("explain", key_b, "--snapshot", str(snap))
    assert r.returncode == 0, r.stderr
    assert by_key[key_b]["reason"] == "Managed"
    assert f"decided by: LimitRange {ns_b}/caps" in r.stdout, r.stdout
    r = headroom("explain", f"{ns_a}/{a['metadata']['name']}", "--snapshot", str(snap))
    assert f"VerticalPodAutoscaler {ns_a}/web sets this pod's CPU limits" in r.stdout, r.stdout


def test_plan_says_blocked_not_active_where_nothing_may_be_written(tmp_path):
    """Without a HeadroomConfig nothing is written: every node's MODE reads Blocked."""
    from ruamel.yaml import YAML

    docs = list(YAML(typ="safe").load_all((ROOT / "examples" / "cluster-snapshot.yaml").read_text()))
    kept = [
        {**doc, "items": [o for o in doc["items"] if o.get("kind") != "HeadroomConfig"]}
        if isinstance(doc, dict) and "items" in doc
        else doc
        for doc in docs
        if not (isinstance(doc, dict) and doc.get("kind") == "HeadroomConfig")
    ]
    snap = tmp_path / "snap.yaml"
    with snap.open("w") as f:
        YAML(typ="safe").dump_all(kept, f)
    r = headroom("plan", "--snapshot", str(snap))
    assert r.returncode == 0, r.stderr
    header, *rows = [line.split() for line in r.stdout.split("\n\n")[0].splitlines()]
    assert header[-1] == "MODE" and rows and {row[-1] for row in rows} == {"Blocked"}
    assert "no HeadroomConfig" in r.stderr


def test_plan_warns_about_a_namespace_label_that_nearly_opts_in(tmp_path):
    snap = tmp_path / "snap.yaml"
    snap.write_text(
        "apiVersion: kube-headroom.dev/v1alpha1\nkind: HeadroomConfig\nmetadata: {name: cluster}\n---\n"
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: typo-value, labels: {kube-headroom.dev/mode: manged}}\n---\n"
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: typo-key, labels: {kube-headrom.dev/mode: managed}}\n---\n"
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: fine, labels: {kube-headroom.dev/mode: managed}}\n"
    )
    r = headroom("plan", "--snapshot", str(snap))
    assert r.returncode == 0, r.stderr
    assert (
        "warning: namespace typo-value has the label kube-headroom.dev/mode=manged, which is not the opt-in" in r.stderr
    )
    assert "kubectl label namespace typo-key kube-headrom.dev/mode- kube-headroom.dev/mode=managed" in r.stderr
    assert "namespace fine" not in r.stderr
    # Asked about one namespace, it speaks of that one only (before: every run repeated all).
    r = headroom("plan", "--snapshot", str(snap), "-n", "typo-key")
    assert "namespace typo-key" in r.stderr and "typo-value" not in r.stderr, r.stderr
    r = headroom("explain", "fine/web", "--snapshot", str(snap))
    assert "typo" not in r.stderr, r.stderr


def test_explain_says_a_limit_within_the_deadband_is_not_written_for_that_reason(tmp_path):
    """Before: `limit 3800m -> 4 (within deadband)` and then `write: no, already at target`."""
    snap = tmp_path / "snap.yaml"
    snap.write_text(
        "apiVersion: kube-headroom.dev/v1alpha1\nkind: HeadroomConfig\nmetadata: {name: cluster}\n---\n"
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team, labels: {kube-headroom.dev/mode: managed}}\n---\n"
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n"
        "status: {allocatable: {cpu: '4'}, conditions: [{type: Ready, status: 'True'}]}\n---\n"
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: team}\n"
        "spec: {nodeName: n1, containers: [{name: app, resources: {requests: {cpu: '1'}, limits: {cpu: 3800m}}}]}\n"
        "status: {phase: Running}\n"
    )
    r = headroom("explain", "team/web", "--snapshot", str(snap))
    assert r.returncode == 0, r.stderr
    assert "limit 3800m -> 4 (within deadband)" in r.stdout, r.stdout
    assert "write: no, within the deadband of the target" in r.stdout, r.stdout


def test_plan_counts_a_paused_pools_pods_as_managed_as_the_status_does(tmp_path):
    """A paused pool's pods are managed with their limits held: the status's MANAGED says
    2, and so does plan's node table (before, 0 beside every pod's PoolPaused)."""
    snap = tmp_path / "snap.yaml"
    pods = "".join(
        f"---\napiVersion: v1\nkind: Pod\nmetadata: {{name: web-{i}, namespace: team}}\n"
        "spec: {nodeName: n1, containers: [{name: app, resources: {requests: {cpu: '1'}}}]}\n"
        "status: {phase: Running}\n"
        for i in range(2)
    )
    snap.write_text(
        "apiVersion: kube-headroom.dev/v1alpha1\nkind: HeadroomConfig\nmetadata: {name: cluster}\n---\n"
        "apiVersion: kube-headroom.dev/v1alpha1\nkind: NodePoolProfile\nmetadata: {name: batch}\n"
        "spec: {nodeSelector: {matchLabels: {pool: batch}}, paused: true}\n---\n"
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team, labels: {kube-headroom.dev/mode: managed}}\n---\n"
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {pool: batch}}\n"
        "status: {allocatable: {cpu: '4'}, conditions: [{type: Ready, status: 'True'}]}\n" + pods
    )
    r = headroom("plan", "--snapshot", str(snap))
    assert r.returncode == 0, r.stderr
    header, row = [line.split() for line in r.stdout.split("\n\n")[0].splitlines()]
    assert dict(zip(header, row, strict=True))["MANAGED"] == "2" and row[-1] == "Paused", r.stdout
    assert r.stdout.count("PoolPaused") == 2
