"""The `headroom` command (also installed as `kubectl-headroom`): its arguments, one
function per subcommand, and the printing guard every command runs behind. Long because
the command line is one interface: each subcommand's flags and what it does with them."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from .. import __version__
from ..api import crds
from ..api.validate import UnreadableFile, merge_problems, tie_warnings, validate_file
from ..cluster.snapshot import SnapshotError, load_snapshot
from ..core import keys
from ..core.capabilities import parse_version
from ..core.eligibility import namespace_managed, opt_in_near_miss
from ..core.planner import ClusterPlan
from . import output


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def _snapshot_plan(args: argparse.Namespace) -> ClusterPlan:
    version = None
    if args.kubernetes_version:
        version = parse_version(args.kubernetes_version)
        if version is None:
            raise UsageError(f"--kubernetes-version {args.kubernetes_version!r}: use a version like v1.36.3")
    if args.snapshot:
        snap = load_snapshot(Path(args.snapshot))
    else:
        from ..cluster.client import Api, ApiError, connect
        from ..cluster.discovery import discover
        from ..cluster.live import read_cluster

        try:
            api = Api(connect(args.kubeconfig, args.context))
            version = version or discover(api).version
            snap = read_cluster(api)
        except ApiError as exc:
            raise UsageError(f"cannot read the cluster: {exc}") from None
    resolution = snap.resolution()
    resolver = resolution.resolver
    for problem in resolution.problems.values():
        print(f"warning: {problem}", file=sys.stderr)
    if resolver.base.blocked is not None:
        print(f"warning: nothing would be written: {resolver.base.blocked}", file=sys.stderr)
    # Only the namespaces asked about: `plan -n a` and `explain a/pod` say nothing of the others.
    pod = getattr(args, "pod", None)
    asked = pod.split("/", 1)[0] if pod and "/" in pod else getattr(args, "namespace", None)
    for ns in sorted(snap.namespaces.values(), key=lambda n: n.name):
        if asked is not None and ns.name != asked:
            continue
        miss = None if namespace_managed(ns, resolver.base) else opt_in_near_miss(ns)
        if miss is not None:
            print(f"warning: {miss}", file=sys.stderr)
    return snap.plan(version, resolver)


def _window(args: argparse.Namespace) -> float:
    """--window in seconds; a usage error unless it is a positive duration."""
    from ..api.types import duration_seconds

    window = duration_seconds(args.window) if args.window else 0.0
    if window <= 0:
        raise UsageError(f"--window {args.window!r}: use a duration such as 10m or 1h")
    return window


def cmd_plan(args: argparse.Namespace) -> int:
    if args.prometheus and args.output != "html":
        raise UsageError(
            "--prometheus draws throttled pods on -o html; for one pod, `headroom explain NS/POD --prometheus`"
        )
    plan = output.filter_plan(
        _snapshot_plan(args),
        node=args.node,
        pool=args.pool,
        namespace=args.namespace,
        reason=args.reason,
        only_changes=args.only_changes,
    )
    if args.output == "json":
        print(json.dumps(output.plan_json(plan), indent=2))
    elif args.output == "wide":
        print(output.plan_wide(plan))
    elif args.output == "html":
        throttled = None
        if args.prometheus:
            from ..cluster.prometheus import Prometheus, PrometheusError, throttled_pods

            try:
                throttled = throttled_pods(Prometheus(args.prometheus), _window(args))
            except PrometheusError as exc:
                print(f"warning: no throttling on the page: {exc}", file=sys.stderr)
        print(output.plan_html(plan, throttled), end="")
    elif args.output == "yaml":
        from ruamel.yaml import YAML

        yaml = YAML(typ="safe", pure=True)
        yaml.default_flow_style = False
        yaml.dump(output.plan_json(plan), sys.stdout)
    else:
        print(output.plan_table(plan))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    key = args.pod if "/" in args.pod else f"{args.namespace}/{args.pod}"
    window = _window(args)
    plan = _snapshot_plan(args)
    text = output.explain(plan, key)
    if text is None:
        where = args.snapshot or "the cluster"
        raise UsageError(f"pod {key} is not in {where}; name it as NAMESPACE/NAME or use -n NAMESPACE")
    print(text)
    found = output.find(plan, key)
    if found is None:  # not bound to a node: nothing was measured
        return 0
    if not args.prometheus:
        print(output.PROMETHEUS_HINT)
        return 0
    from ..cluster.prometheus import Prometheus, PrometheusError, throttling

    namespace, name = key.split("/", 1)
    try:
        rows = throttling(Prometheus(args.prometheus), namespace, name, window)
    except PrometheusError as exc:
        print(f"  measured throttling: not available: {exc}")
        return 0
    print(output.measured(*found, rows, window, f"Prometheus {args.prometheus}"))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    status, total = 0, 0
    valid: list[tuple[str, Any]] = []
    for name in args.files:
        try:
            checked, problems = validate_file(Path(name), valid)
        except UnreadableFile as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
            continue
        total += checked
        for p in problems:
            print(p)
        if problems and status == 0:
            status = 1
    live, node_labels = None, None
    if args.live:
        from ..cluster.client import Api, ApiError, connect

        try:
            api = Api(connect(args.kubeconfig, args.context))
            live = api.get(keys.CONFIG_PATH).get("items") or []
        except ApiError as exc:
            raise UsageError(f"--live: cannot read the cluster's HeadroomConfig: {exc}") from None
        try:  # for profiles that tie on the same nodes; without it only identical selectors are caught
            nodes = api.get(keys.NODES_PATH).get("items") or []
            node_labels = [(n.get("metadata") or {}).get("labels") or {} for n in nodes]
        except ApiError as exc:
            print(
                f"note: --live: nodes not read ({exc.status} {exc.reason}): ties are checked offline", file=sys.stderr
            )
    for warning in tie_warnings(valid, node_labels):
        print(warning, file=sys.stderr)
    if live is not None and not live:
        print(
            "warning: --live: the cluster has no HeadroomConfig: the controller writes nothing until one is "
            "applied (these files were checked against the defaults)",
            file=sys.stderr,
        )
    merged = merge_problems(valid, live)
    for p in merged:
        print(p)
    if merged and status == 0:
        status = 1
    if status == 0 and total == 0:
        print(
            f"error: no HeadroomConfig or NodePoolProfile in {len(args.files)} file(s): nothing was checked "
            "(wrong files, or objects without apiVersion/kind?)",
            file=sys.stderr,
        )
        return 1
    if status == 0:
        print(f"ok: {total} HeadroomConfig/NodePoolProfile object(s) valid in {len(args.files)} file(s)")
    return status


def cmd_crds(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    if args.check:
        stale = crds.stale_files(directory)
        for name in stale:
            print(f"{directory / name}: stale or missing; run `headroom crds --write`", file=sys.stderr)
        return 1 if stale else 0
    if args.write:
        for name in crds.write(directory):
            print(f"wrote {directory / name}")
        return 0
    print("---\n".join(crds.render(obj) for obj in crds.definitions().values()), end="")
    return 0


def _own_namespace() -> str:
    """The pod's namespace in a cluster (for the lease), else `default`."""
    try:
        return Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip() or "default"
    except OSError:
        return "default"


def _run_until_stopped(process: Any) -> int:
    """Run a long-lived process (`run`, `webhook`) until SIGTERM or SIGINT sets its `stop`."""
    import signal

    from ..cluster.client import ApiError
    from ..webhook.host import UnsafeCertDir

    def stop(signum: int, _frame: object) -> None:
        process.stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        process.run()
    except ApiError as exc:
        raise UsageError(f"cannot reach the API server: {exc}") from None
    except UnsafeCertDir as exc:
        raise UsageError(str(exc)) from None
    return 0


def cmd_run(args: argparse.Namespace) -> int:

    from .. import logs
    from ..cluster.client import Api, ApiError, connect
    from ..engine.controller import Controller, Options

    logs.setup(args.log_format, args.log_level)
    options = Options(
        workers=args.workers,
        status_annotation=args.status_annotation,
        pod_metrics=args.pod_metrics,
        resize_lag_seconds=args.resize_lag_seconds,
        identity=args.identity or "",
        leader_elect=args.leader_elect,
        lease_namespace=args.lease_namespace or _own_namespace(),
        lease_name=args.lease_name,
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        metrics_port=args.metrics_port or None,
        health_port=args.health_port or None,
        webhook_port=args.webhook_port,
        webhook_cert_dir=args.webhook_cert_dir,
        webhook_cert_reload=args.webhook_cert_reload,
        webhook_secret=args.webhook_secret,
        webhook_names=tuple(n.strip() for n in (args.webhook_names or "").split(",") if n.strip()),
        webhook_configuration=args.webhook_configuration,
        webhook_cert_check=args.webhook_cert_check,
    )
    if options.webhook_secret and not (options.webhook_names and options.webhook_configuration):
        raise UsageError("--webhook-secret needs --webhook-names and --webhook-configuration")

    if not options.retry_period < options.renew_deadline < options.lease_duration:
        raise UsageError("leader election needs --retry-period < --renew-deadline < --lease-duration")
    try:
        api = Api(connect(args.kubeconfig, args.context))
        controller = Controller(api, options)
    except ApiError as exc:
        raise UsageError(str(exc)) from None

    return _run_until_stopped(controller)


def cmd_webhook(args: argparse.Namespace) -> int:

    from .. import logs
    from ..cluster.client import Api, ApiError, connect
    from ..webhook.process import WebhookOptions, WebhookProcess

    logs.setup(args.log_format, args.log_level)
    options = WebhookOptions(
        cert_dir=args.cert_dir,
        port=args.port,
        cert_reload=args.cert_reload,
        metrics_port=args.metrics_port or None,
        health_port=args.health_port or None,
    )
    try:
        process = WebhookProcess(Api(connect(args.kubeconfig, args.context)), options)
    except ApiError as exc:
        raise UsageError(str(exc)) from None

    return _run_until_stopped(process)


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..cluster.client import Api, ApiError, connect
    from .doctor import FAIL, checks

    try:
        api = Api(connect(args.kubeconfig, args.context))
        findings = []
        for finding in checks(api, args.lease_namespace, args.webhook_configuration, args.lease_name, _own_namespace()):
            print(finding)
            findings.append(finding)
    except ApiError as exc:
        raise UsageError(f"cannot read the cluster: {exc}") from None
    return 1 if any(f.level == FAIL for f in findings) else 0


def completion_script(shell: str) -> str:
    """A completion script generated from this parser, so it never falls behind it."""
    ap = parser()
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    cases = []
    for name, p in sorted(sub.choices.items()):
        opts = sorted(o for a in p._actions for o in a.option_strings if a.help != argparse.SUPPRESS)
        extra = " bash zsh" if name == "completion" else ""
        cases.append(f'    {name}) opts="{" ".join(opts)}{extra}" ;;')
    body = "\n".join(cases)
    script = f"""_headroom() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" opts=""
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=( $(compgen -W "{" ".join(sorted(sub.choices))} --help --version" -- "$cur") )
    return
  fi
  case "${{COMP_WORDS[1]}}" in
{body}
  esac
  if [[ "$cur" == -* || "${{COMP_WORDS[1]}}" == completion ]]; then
    COMPREPLY=( $(compgen -W "$opts" -- "$cur") )
  else
    COMPREPLY=( $(compgen -f -- "$cur") )
  fi
}}
complete -o filenames -F _headroom headroom kubectl-headroom
"""
    if shell == "zsh":
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    return script


def cmd_completion(args: argparse.Namespace) -> int:
    print(completion_script(args.shell), end="")
    return 0


def _flag_bool(text: str) -> bool:
    """A boolean flag's value as Kubernetes components spell it (`--flag=true|false`)."""
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean; use true or false")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0, e.g. 60")
    return value


def _bool_flag(p: argparse.ArgumentParser, name: str, default: bool, help: str) -> None:
    """A boolean flag as Kubernetes components take it: `--flag`, `--flag=true|false`."""
    p.add_argument(name, nargs="?", const=True, default=default, type=_flag_bool, metavar="true|false", help=help)


def _kube_args(p: argparse.ArgumentParser, prefix: str = "") -> None:
    p.add_argument("--kubeconfig", help=f"{prefix}kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--context", help=f"{prefix}kubeconfig context")


def _prometheus_args(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--prometheus", metavar="URL", help=help)
    p.add_argument("--window", default="1h", help="how far back --prometheus looks (default 1h)")


def _snapshot_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--snapshot",
        metavar="FILE",
        help="read a `kubectl get -o yaml|json` List or multi-document YAML of Nodes, Pods, "
        "Namespaces and the Headroom objects instead of a live cluster",
    )
    _kube_args(p, "live cluster: ")
    p.add_argument(
        "--kubernetes-version",
        metavar="V",
        help="server version to assume (decides pod-level resize when nodes declare no features)",
    )


def _run_command(sub: Any) -> None:
    p = sub.add_parser("run", help="run the controller")
    _kube_args(p)
    p.add_argument("--workers", type=int, default=4, help="nodes reconciled in parallel (default 4)")
    p.add_argument("--identity", help="this replica's name in events and leases (default: hostname)")
    _bool_flag(
        p,
        "--status-annotation",
        True,
        "write the kube-headroom.dev/status annotation on managed pods (default true; false halves the "
        "writes per changed pod on very large clusters)",
    )
    p.add_argument("--log-format", choices=("json", "text"), default="json")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    p.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics (0: off; default 8080)")
    _bool_flag(
        p,
        "--pod-metrics",
        False,
        "export headroom_pod_limit_cores and headroom_pod_applied_limit_cores, each one series per "
        "computed container of every managed pod (default false: four series per pod of two containers, "
        "600,000 at 150,000 pods; the kubelet's container_spec_cpu_quota already shows each container's "
        "applied limit)",
    )
    p.add_argument(
        "--resize-lag-seconds",
        type=_positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="headroom_resize_lag_pods counts managed pods whose kubelet has reported another CPU limit "
        "applied than the spec's for longer than this (default 60)",
    )
    p.add_argument("--health-port", type=int, default=8081, help="/healthz and /readyz (0: off; default 8081)")
    _bool_flag(
        p,
        "--leader-elect",
        True,
        "only the holder of the Lease writes (default true; --leader-elect=false or --no-leader-elect turns it off)",
    )
    p.add_argument("--no-leader-elect", dest="leader_elect", action="store_false", help=argparse.SUPPRESS)
    p.add_argument("--lease-namespace", help="namespace of the Lease (default: the pod's own, else default)")
    p.add_argument("--lease-name", default="kube-headroom")
    p.add_argument("--webhook-port", type=int, default=9443, help="admission webhook HTTPS port (default 9443)")
    p.add_argument(
        "--webhook-cert-dir",
        help="directory with tls.crt and tls.key: serve the webhook in this process too (off-cluster "
        "development; the chart runs it apart, as `headroom webhook`)",
    )
    p.add_argument(
        "--webhook-cert-reload",
        type=float,
        default=10.0,
        help="seconds between checks of the certificate files (default 10)",
    )
    p.add_argument(
        "--webhook-secret",
        help="keep the webhook certificate in this Secret (in the lease namespace) and its CA in the caBundle "
        "of --webhook-configuration; the leader issues and rotates it",
    )
    p.add_argument(
        "--webhook-names",
        help="comma-separated DNS names (or IPs) the certificate is for, e.g. SERVICE.NAMESPACE.svc",
    )
    p.add_argument("--webhook-configuration", help="the MutatingWebhookConfiguration whose caBundle to keep")
    p.add_argument(
        "--webhook-cert-check",
        type=float,
        default=10.0,
        help="seconds between the leader's checks of the webhook Secret and caBundle (default 10)",
    )

    p.add_argument("--lease-duration", type=float, default=15.0, help="seconds (default 15)")
    p.add_argument("--renew-deadline", type=float, default=10.0, help="seconds (default 10)")
    p.add_argument("--retry-period", type=float, default=2.0, help="seconds (default 2)")
    p.set_defaults(func=cmd_run)


def _plan_command(sub: Any) -> None:
    p = sub.add_parser("plan", help="what the controller would do, read-only")
    _snapshot_args(p)
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "wide", "json", "yaml", "html"),
        default="table",
        help="wide: a row per container too; html: one self-contained page with a bar per node "
        "(redirect it to a file and open it)",
    )
    p.add_argument("--node", help="only this node")
    p.add_argument("--pool", help="only the nodes of this NodePoolProfile ((default): nodes no profile selects)")
    p.add_argument("-n", "--namespace", help="only pods in this namespace")
    p.add_argument("--reason", help="only pods with this reason (Managed, PoolPaused, BackingOff, ...)")
    p.add_argument("--only-changes", action="store_true", help="only pods the controller would write")
    _prometheus_args(
        p, "with -o html: mark the pods a Prometheus scraping the kubelets' /metrics/cadvisor saw throttled"
    )
    p.set_defaults(func=cmd_plan)


def _explain_command(sub: Any) -> None:
    p = sub.add_parser("explain", help="the arithmetic behind one pod's limit")
    p.add_argument("pod", help="NAMESPACE/NAME, or NAME with -n")
    p.add_argument("-n", "--namespace", default="default")
    _snapshot_args(p)
    _prometheus_args(
        p,
        "a Prometheus that scrapes the kubelets' /metrics/cadvisor: adds the pod's measured throttling, "
        "who books its node and what other requests would give",
    )
    p.set_defaults(func=cmd_explain)


def _doctor_command(sub: Any) -> None:
    p = sub.add_parser("doctor", help="preflight: what in this cluster would stop Headroom or surprise its users")
    _kube_args(p)
    p.add_argument(
        "--lease-namespace",
        help="where the controller's Lease lives (default: found from the chart's Deployment in any namespace, "
        "else the pod's own, else default)",
    )
    p.add_argument(
        "--lease-name",
        help="the controller's Lease (default: the chart's Deployment's --lease-name, then kube-headroom)",
    )
    p.add_argument(
        "--webhook-configuration",
        help="the MutatingWebhookConfiguration to check end to end (default: the one labelled with the chart's "
        "release, else headroom; '' skips it)",
    )
    p.set_defaults(func=cmd_doctor)


def _validate_command(sub: Any) -> None:
    p = sub.add_parser(
        "validate",
        help="check HeadroomConfig/NodePoolProfile YAML offline (for GitOps CI), each object and "
        "the profiles merged with the HeadroomConfig",
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument(
        "--live",
        action="store_true",
        help="check the profiles against the cluster's HeadroomConfig when the files hold none",
    )
    _kube_args(p, "with --live: ")
    p.set_defaults(func=cmd_validate)


def _completion_command(sub: Any) -> None:
    p = sub.add_parser(
        "completion",
        help="print a shell completion script: source <(headroom completion bash), or for zsh the same with zsh",
    )
    p.add_argument("shell", choices=("bash", "zsh"))
    p.set_defaults(func=cmd_completion)


def _crds_command(sub: Any) -> None:
    p = sub.add_parser("crds", help="print, write or check the generated CRDs")
    p.add_argument("--dir", default="crds", help="directory of the CRD files (default: crds)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write the CRDs into --dir")
    mode.add_argument("--check", action="store_true", help="exit 1 when --dir is stale")
    p.set_defaults(func=cmd_crds)


def _webhook_command(sub: Any) -> None:
    p = sub.add_parser(
        "webhook",
        help="serve the admission webhook alone (the chart's webhook Deployment); writes nothing to the cluster",
    )
    _kube_args(p)
    p.add_argument("--log-format", choices=("json", "text"), default="json")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    p.add_argument("--port", type=int, default=9443, help="HTTPS port of the admission webhook (default 9443)")
    p.add_argument(
        "--cert-dir",
        required=True,
        help="directory with tls.crt and tls.key (the Secret the controller's leader keeps, mounted); served "
        "once they exist, reloaded when they change",
    )
    p.add_argument(
        "--cert-reload", type=float, default=10.0, help="seconds between checks of the certificate files (default 10)"
    )
    p.add_argument("--metrics-port", type=int, default=8080, help="Prometheus /metrics (0: off; default 8080)")
    p.add_argument("--health-port", type=int, default=8081, help="/healthz and /readyz (0: off; default 8081)")
    p.set_defaults(func=cmd_webhook)


def parser() -> argparse.ArgumentParser:
    # Invoked as the kubectl plugin, usage and errors say what the user typed.
    prog = "kubectl headroom" if Path(sys.argv[0]).name.startswith("kubectl-headroom") else "headroom"
    ap = argparse.ArgumentParser(prog=prog, description="CPU limits that follow each node's unbooked CPU.")
    ap.add_argument("--version", action="version", version=f"headroom {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    _run_command(sub)
    _webhook_command(sub)
    _plan_command(sub)
    _explain_command(sub)
    _doctor_command(sub)
    _validate_command(sub)
    _completion_command(sub)
    _crds_command(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (
        output.Printable(stdout),
        output.Printable(stderr),
    )  # no text from elsewhere acts on the terminal
    try:
        code: int = args.func(args)
    except (SnapshotError, UsageError, UnreadableFile) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    finally:
        sys.stdout.flush()
        sys.stdout, sys.stderr = stdout, stderr
    return code


if __name__ == "__main__":
    sys.exit(main())
