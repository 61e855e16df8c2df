"""The Helm chart, checked by the tools a platform team runs: helm lint and template,
kubernetes-validate --strict, promtool; and the properties the install promises (RBAC exactly as documented, the metrics and alerts)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
from ruamel.yaml import YAML

from headroom.api.validate import validate_object
from helpers.chart import CHART, PROMTOOL, ROOT, dashboard_queries, find, helm, render

FULL = ("metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true")


def test_helm_lint_strict():
    r = helm("lint", "--strict", str(CHART))
    assert r.returncode == 0, r.stdout + r.stderr


NETPOL = ("networkPolicy.enabled=true", "networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.10/32")


@pytest.mark.parametrize(
    "sets",
    [
        (),
        FULL,
        ("webhook.certManager.enabled=true",),
        ("webhook.enabled=false", "headroomConfig.create=false"),
        NETPOL,
        ("admissionPolicy.enabled=false", "webhook.certManager.enabled=true"),
    ],
)
def test_render_passes_kubernetes_validate_strict(sets):
    for doc in render(*sets):
        if doc["apiVersion"].startswith("kube-headroom.dev/"):
            assert validate_object(doc, "chart") == []
            continue
        try:
            kubernetes_validate.validate(doc, "1.37", strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            assert doc["apiVersion"].split("/")[0] in ("monitoring.coreos.com", "cert-manager.io"), doc["kind"]


def test_chart_crds_are_the_generated_ones():
    for path in (ROOT / "crds").glob("*.yaml"):
        assert (CHART / "crds" / path.name).read_text() == path.read_text(), f"copy crds/{path.name} into the chart"
    assert len(list((CHART / "crds").glob("*.yaml"))) == 2


def test_deployments_are_locked_down():
    """Two Deployments: the controller and the webhook, each with two replicas, its own
    ServiceAccount and a PodDisruptionBudget; the controller serves no admission."""
    docs = render()
    deployments = {d["metadata"]["name"]: d for d in find(docs, "Deployment")}
    assert sorted(deployments) == ["headroom", "headroom-webhook"]
    for dep in deployments.values():
        spec = dep["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        assert dep["spec"]["replicas"] == 2
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
        assert c["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        assert c["resources"]["requests"] and c["resources"]["limits"]
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    controller, webhook = (deployments[n]["spec"]["template"]["spec"] for n in ("headroom", "headroom-webhook"))
    args = controller["containers"][0]["args"]
    assert args[0] == "run" and "--leader-elect=true" in args and "--lease-namespace=kube-headroom" in args
    assert not any(a.startswith("--webhook-cert-dir") for a in args) and "volumes" not in controller
    assert {p["name"] for p in controller["containers"][0]["ports"]} == {"metrics", "health"}
    assert webhook["containers"][0]["args"][:1] == ["webhook"] and webhook["serviceAccountName"] == "headroom-webhook"
    assert webhook["volumes"][0]["secret"]["secretName"] == "headroom-webhook-tls"
    term = webhook["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/name"] == "kube-headroom-webhook"
    # The Service the webhook configuration names selects the webhook's pods, not the controller's.
    services = {s["metadata"]["name"]: s["spec"]["selector"] for s in find(docs, "Service")}
    assert services == {
        "headroom": {"app.kubernetes.io/name": "kube-headroom-webhook", "app.kubernetes.io/instance": "headroom"},
        "headroom-metrics": {"app.kubernetes.io/name": "kube-headroom", "app.kubernetes.io/instance": "headroom"},
    }
    pdbs = {p["metadata"]["name"]: p["spec"] for p in find(docs, "PodDisruptionBudget")}
    assert {n: p["minAvailable"] for n, p in pdbs.items()} == {"headroom": 1, "headroom-webhook": 1}
    assert pdbs["headroom-webhook"]["selector"]["matchLabels"] == services["headroom"]


EXPECTED_CLUSTER_RULES = [
    {
        "apiGroups": [""],
        "resources": ["pods", "nodes", "namespaces", "limitranges", "resourcequotas"],
        "verbs": ["get", "list", "watch"],
    },
    {"apiGroups": ["autoscaling.k8s.io"], "resources": ["verticalpodautoscalers"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": ["kube-headroom.dev"],
        "resources": ["headroomconfigs", "nodepoolprofiles"],
        "verbs": ["get", "list", "watch"],
    },
    {"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
    {
        "apiGroups": ["kube-headroom.dev"],
        "resources": ["headroomconfigs/status", "nodepoolprofiles/status"],
        "verbs": ["update", "patch"],
    },
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
]


WEBHOOK_RULES = [
    {
        "apiGroups": [""],
        "resources": ["nodes", "namespaces", "limitranges"],
        "verbs": ["get", "list", "watch"],
    },
    EXPECTED_CLUSTER_RULES[1],
    EXPECTED_CLUSTER_RULES[2],
    # The API server's own EndpointSlice, by name, and nothing else of that kind.
    {
        "apiGroups": ["discovery.k8s.io"],
        "resources": ["endpointslices"],
        "resourceNames": ["kubernetes"],
        "verbs": ["get"],
    },
]


def test_rbac_is_exactly_the_spec():
    docs = render()
    role, webhook = find(docs, "ClusterRole")
    # The webhook's account reads what a decision needs, writes nothing, and is bound alone.
    assert webhook["metadata"]["name"] == "headroom-webhook" and webhook["rules"] == WEBHOOK_RULES
    bindings = {b["metadata"]["name"]: b for b in find(docs, "ClusterRoleBinding")}
    assert bindings["headroom-webhook"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "headroom-webhook", "namespace": "kube-headroom"}
    ]
    own_webhook = {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["mutatingwebhookconfigurations"],
        "resourceNames": ["headroom"],
        "verbs": ["get", "patch"],
    }
    assert role["rules"] == [*EXPECTED_CLUSTER_RULES, own_webhook]
    (lease,) = find(docs, "Role")  # nothing outside the release's namespace
    assert lease["metadata"]["namespace"] == "kube-headroom"
    assert lease["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
        # its own webhook certificate, and nothing else (create cannot be narrowed by name)
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["headroom-webhook-tls"],
            "verbs": ["get", "update"],
        },
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    # With cert-manager keeping the certificate, the controller touches no Secret at all.
    cm = render("webhook.certManager.enabled=true")
    assert find(cm, "ClusterRole")[0]["rules"] == EXPECTED_CLUSTER_RULES
    assert [r["metadata"]["name"] for r in find(render("webhook.enabled=false"), "ClusterRole")] == ["headroom"]
    assert '"secrets"' not in json.dumps(find(cm, "Role"))


def test_the_kubelet_scrape_rbac_is_opt_in_grants_only_nodes_metrics_and_binds_only_the_named_account():
    """Not the controller's RBAC: a Prometheus's, for the kubelets' cAdvisor counters. The
    real-node tests' Prometheus scrapes with exactly these objects (realnode_helpers)."""
    assert [d["metadata"]["name"] for d in find(render(), "ClusterRole")] == ["headroom", "headroom-webhook"]
    docs = render(
        "metrics.kubeletScrape.serviceAccount.name=prometheus",
        "metrics.kubeletScrape.serviceAccount.namespace=monitoring",
    )
    role, binding = (
        next(d for d in find(docs, k) if d["metadata"]["name"].endswith("-kubelet-metrics-reader"))
        for k in ("ClusterRole", "ClusterRoleBinding")
    )
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}]
    r = helm("template", "headroom", str(CHART), "--set", "metrics.kubeletScrape.serviceAccount.name=prometheus")
    assert r.returncode != 0 and "metrics.kubeletScrape.serviceAccount.namespace: set it" in r.stderr, r.stderr


def test_two_renders_are_byte_identical():
    """No generated certificate in the chart: GitOps tools see no drift between renders."""
    first, second = helm("template", "t", str(CHART)), helm("template", "t", str(CHART))
    assert first.returncode == 0 and first.stdout == second.stdout
    assert "BEGIN CERTIFICATE" not in first.stdout and "tls.key" not in first.stdout


def test_webhook_configuration():
    docs = render()
    (mwc,) = find(docs, "MutatingWebhookConfiguration")
    (hook,) = mwc["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] <= 2 and hook["sideEffects"] == "None"
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["namespaceSelector"] == {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kube-headroom"]}
        ]
    }
    assert hook["objectSelector"] == {
        "matchExpressions": [{"key": "kube-headroom.dev/mode", "operator": "NotIn", "values": ["unmanaged"]}]
    }
    assert not find(docs, "Secret") and "caBundle" not in hook["clientConfig"]  # the controller keeps both
    dep = next(d for d in find(docs, "Deployment") if d["metadata"]["name"] == "headroom")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--webhook-secret=headroom-webhook-tls" in args and "--webhook-configuration=headroom" in args
    assert "--webhook-names=headroom.kube-headroom.svc,headroom.kube-headroom.svc.cluster.local" in args
    cm = render("webhook.certManager.enabled=true")
    (mwc,) = find(cm, "MutatingWebhookConfiguration")
    assert "cert-manager.io/inject-ca-from" in mwc["metadata"]["annotations"] and not find(cm, "Secret")
    assert find(cm, "Certificate") and find(cm, "Issuer")


def test_gitops_owns_the_policy_unless_the_chart_is_told_otherwise():
    assert not find(render(), "HeadroomConfig")  # by default the policy comes from GitOps
    assert find(render("headroomConfig.create=true"), "HeadroomConfig")[0]["spec"] == {"dryRun": True}


def _yaml_docs(path: Path) -> list[dict]:
    return [d for d in YAML(typ="safe").load_all(path.read_text()) if d]


def test_every_gitops_example_points_at_paths_that_exist():
    """Flux Kustomization paths, HelmRelease chart paths and Argo CD Application source
    paths, resolved in this repository as the tools resolve them in the Git source."""
    seen = []
    for path in sorted((ROOT / "examples" / "gitops").rglob("*.yaml")):
        for doc in _yaml_docs(path):
            kind, spec = doc.get("kind"), doc.get("spec") or {}
            if kind == "Kustomization" and "path" in spec:
                target = ROOT / spec["path"]
                assert target.is_dir() and any(target.glob("*.yaml")), f"{path}: {spec['path']} has no manifests"
            elif kind == "HelmRelease":
                target = ROOT / spec["chart"]["spec"]["chart"]
                assert (target / "Chart.yaml").is_file(), f"{path}: {target} is not a chart"
            elif kind == "Application":
                target = ROOT / spec["source"]["path"]
                assert target.is_dir(), f"{path}: {spec['source']['path']} does not exist"
            else:
                continue
            seen.append((kind, str(target.relative_to(ROOT))))
    assert {k for k, _ in seen} == {"Kustomization", "HelmRelease", "Application"}, seen


def test_every_example_configuration_starts_in_dry_run():
    # (the Argo CD testdata are captured objects for the health check, not configuration)
    for path in [
        ROOT / "examples" / "headroomconfig.yaml",
        *sorted((ROOT / "examples" / "gitops" / "config").glob("*.yaml")),
    ]:
        for doc in _yaml_docs(path):
            if doc.get("kind") == "HeadroomConfig":
                assert doc["spec"]["dryRun"] is True, path


def test_values_schema_rejects_mistakes():
    for bad in ("replicaCount=0", "webhook.timeoutSeconds=5", "logFormat=xml", "typo=1"):
        r = helm("template", "t", str(CHART), "--set", bad)
        assert r.returncode != 0 and "values don't meet the specifications of the schema" in r.stderr, bad


def test_alert_rules_pass_promtool_check_and_unit_tests():
    assert PROMTOOL.exists(), "promtool is unpacked by `make tools` (part of `make test`)"
    check = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(CHART / "files" / "alerts.yaml")], capture_output=True, text=True
    )
    assert check.returncode == 0 and "SUCCESS: 6 rules found" in check.stdout, check.stdout + check.stderr
    test = subprocess.run(
        [str(PROMTOOL), "test", "rules", "alerts_test.yaml"],
        capture_output=True,
        text=True,
        cwd=ROOT / "tests" / "alerts",
    )
    assert test.returncode == 0, test.stdout + test.stderr
    (rule,) = find(render(*FULL), "PrometheusRule")
    assert [r["alert"] for r in rule["spec"]["groups"][0]["rules"]] == [
        "HeadroomConfigInvalid",
        "HeadroomResizesFailing",
        "HeadroomResizesPendingTooLong",
        "HeadroomResizesDeferred",
        "HeadroomResizeLagging",
        "HeadroomControllerStale",
    ]


def test_dashboard_uses_the_controllers_metrics_and_no_per_pod_series_of_its_own():
    exprs = " ".join(dashboard_queries())
    # headroom_pod_limit_cores is off by default (headroom run --pod-metrics): each pod's
    # limit comes from the kubelet's cAdvisor series, as it is applied.
    assert "headroom_pod_limit_cores" not in exprs
    for metric in (
        "container_spec_cpu_quota",
        "container_cpu_cfs_throttled_periods_total",
        "headroom_node_factor",
        "headroom_node_slack_cores",
        "headroom_resizes_total",
    ):
        assert metric in exprs


def test_every_dashboard_query_parses_as_promql(tmp_path):
    """promtool parses each panel query and each variable's selector, wrapped as recording rules
    (Grafana's $variables replaced by a value, as Grafana does before sending them)."""
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": e.replace("$__rate_interval", "5m").replace("$", "")}
                    for i, e in enumerate(dashboard_queries())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(json.dumps(rules))
    r = subprocess.run([str(PROMTOOL), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_validating_admission_policies_limit_the_controllers_pod_writes_by_default():
    """Three policies, each for the controller's ServiceAccount alone: pod updates
    (annotations only), pods/resize (CPU limits only) and Secret writes (its webhook
    certificate only; none with cert-manager). tests/integration/test_rbac_webhook.py holds
    what each refuses on the real API server."""
    docs = render()
    policies = {
        p["spec"]["matchConstraints"]["resourceRules"][0]["resources"][0]: p
        for p in find(docs, "ValidatingAdmissionPolicy")
    }
    assert sorted(policies) == ["pods", "pods/resize", "secrets"]
    bindings = find(docs, "ValidatingAdmissionPolicyBinding")
    assert sorted(b["spec"]["policyName"] for b in bindings) == sorted(p["metadata"]["name"] for p in policies.values())
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    (sa,) = (a for a in find(docs, "ServiceAccount") if a["metadata"]["name"] == "headroom")
    for policy in policies.values():
        (cond,) = policy["spec"]["matchConditions"]
        assert f'"system:serviceaccount:kube-headroom:{sa["metadata"]["name"]}"' in cond["expression"]
    assert not find(
        render("admissionPolicy.enabled=false", "webhook.certManager.enabled=true"), "ValidatingAdmissionPolicy"
    )
    # Without the policies, the Secret `create` RBAC cannot narrow would be open: refused.
    r = helm("template", "t", str(CHART), "--set", "admissionPolicy.enabled=false")
    assert r.returncode != 0 and "admissionPolicy.enabled=false with the certificate the controller keeps" in r.stderr
    with_cert_manager = find(render("webhook.certManager.enabled=true"), "ValidatingAdmissionPolicy")
    assert len(with_cert_manager) == 2


def test_the_network_policy_is_a_switch_that_needs_the_api_servers_peers():
    assert not find(render(), "NetworkPolicy")
    controller, webhook = find(
        render(*NETPOL, "networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus"), "NetworkPolicy"
    )
    prometheus = [{"podSelector": {"matchLabels": {"app": "prometheus"}}}]
    rules = {r["ports"][0]["port"]: r.get("from") for r in controller["spec"]["ingress"]}
    assert controller["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "kube-headroom"
    assert rules == {8080: prometheus, 8081: None}  # 8081: the kubelet's probes, from the node
    rules = {r["ports"][0]["port"]: r.get("from") for r in webhook["spec"]["ingress"]}
    assert webhook["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "kube-headroom-webhook"
    assert rules == {9443: [{"ipBlock": {"cidr": "10.0.0.10/32"}}], 8080: prometheus, 8081: None}
    r = helm("template", "t", str(CHART), "--set", "networkPolicy.enabled=true")
    assert r.returncode != 0 and "networkPolicy.webhookFrom is empty" in r.stderr


def test_the_api_servers_cidrs_reach_the_webhook_and_are_checked():
    """webhook.apiServerCIDRs become the webhook's --api-server-cidr flags."""
    docs = render("webhook.apiServerCIDRs={10.0.0.0/24,192.168.1.5/32}")
    (hook,) = [d for d in find(docs, "Deployment") if d["metadata"]["name"] == "headroom-webhook"]
    args = hook["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--api-server-cidr")] == [
        "--api-server-cidr=10.0.0.0/24",
        "--api-server-cidr=192.168.1.5/32",
    ]
    # The rendered arguments, as `headroom` parses them: the webhook takes both.
    from headroom.commands.arguments import parser

    assert parser().parse_args(args).api_server_cidr == ["10.0.0.0/24", "192.168.1.5/32"]
    # A CIDR the process would refuse is refused at its start, naming it.
    with pytest.raises(SystemExit):
        parser().parse_args([*args, "--api-server-cidr=10.0.0.300/8"])


def test_one_replica_gets_no_disruption_budget_and_a_priority_class_can_be_named():
    """A budget of one available pod over a single replica blocks every node drain: with
    one replica the chart renders none (before: it did, for both Deployments). A
    PriorityClass can be named for each, so higher-priority tenant pods cannot preempt
    every replica."""
    single = render("replicaCount=1", "webhook.replicaCount=1")
    assert find(single, "PodDisruptionBudget") == []
    assert [p["metadata"]["name"] for p in find(render("replicaCount=1"), "PodDisruptionBudget")] == [
        "headroom-webhook"
    ]
    docs = render("priorityClassName=platform-critical", "webhook.priorityClassName=admission-critical")
    classes = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"].get("priorityClassName") for d in find(docs, "Deployment")
    }
    assert classes == {"headroom": "platform-critical", "headroom-webhook": "admission-critical"}
    assert all("priorityClassName" not in d["spec"]["template"]["spec"] for d in find(render(), "Deployment"))
