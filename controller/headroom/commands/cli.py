"""The `headroom` command (also installed as `kubectl-headroom`): one function per
subcommand, and the printing guard every command runs behind. The flags each takes are
in `arguments`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..api import crds
from ..api.validate import UnreadableFile, merge_problems, tie_warnings, validate_file
from ..cluster.snapshot import SnapshotError, load_snapshot
from ..core import keys
from ..core.capabilities import parse_version
from ..core.eligibility import namespace_managed, opt_in_near_miss
from ..core.planner import ClusterPlan
from . import output
from .arguments import completion_script, parser

if TYPE_CHECKING:  # imported where used: each subcommand loads only what it runs
    from ..cluster.client import Api
    from ..engine.controller import Controller


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
        process.start()
        try:
            while not process.stop.wait(1.0):
                pass
        finally:
            process.shutdown()
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
    )
    names = tuple(n.strip() for n in (args.webhook_names or "").split(",") if n.strip())
    if args.webhook_secret and not (names and args.webhook_configuration):
        raise UsageError("--webhook-secret needs --webhook-names and --webhook-configuration")

    if not options.retry_period < options.renew_deadline < options.lease_duration:
        raise UsageError("leader election needs --retry-period < --renew-deadline < --lease-duration")
    try:
        api = Api(connect(args.kubeconfig, args.context))
        controller = Controller(api, options)
    except ApiError as exc:
        raise UsageError(str(exc)) from None
    _development_webhook(args, api, controller, names)
    return _run_until_stopped(controller)


def _development_webhook(args: argparse.Namespace, api: Api, controller: Controller, names: tuple[str, ...]) -> None:
    """`run --webhook-cert-dir`: the webhook served in the controller's process too, from
    its inputs (off-cluster development; the chart runs `headroom webhook` apart).
    `--webhook-secret`: the leader keeps the webhook's certificate and caBundle."""
    from ..webhook.host import Certificate, CertificateKeeper, Replica, Serving, WebhookHost

    if args.webhook_cert_dir:
        serving = Serving(
            args.webhook_cert_dir,
            args.webhook_port,
            controller.options.metrics_host,
            args.webhook_cert_reload,
            tuple(args.webhook_api_server_cidr),
        )
        host = WebhookHost(
            api, controller.stop, controller.count_error, controller.inputs, controller.metrics.observe_webhook, serving
        )
        controller.add_service(host)
    if args.webhook_secret:
        certificate = Certificate(
            controller.options.lease_namespace,
            args.webhook_secret,
            names,
            str(args.webhook_configuration),
            args.webhook_cert_check,
        )
        replica = Replica(controller.stop, controller.leading, controller.writer.fence, controller.count_error)
        keeper = CertificateKeeper(api, replica, certificate, args.webhook_cert_dir)
        controller.add_task("webhook-certificate", keeper.run)


def cmd_webhook(args: argparse.Namespace) -> int:

    from .. import logs
    from ..cluster.client import Api, ApiError, connect
    from ..webhook.host import Serving
    from ..webhook.process import WebhookOptions, WebhookProcess

    logs.setup(args.log_format, args.log_level)
    serving = Serving(
        args.cert_dir, args.port, cert_reload=args.cert_reload, api_server_cidrs=tuple(args.api_server_cidr)
    )
    options = WebhookOptions(serving, metrics_port=args.metrics_port or None, health_port=args.health_port or None)
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


def cmd_completion(args: argparse.Namespace) -> int:
    print(completion_script(args.shell), end="")
    return 0


# What each subcommand does; `arguments` holds what each takes.
COMMANDS = {
    "run": cmd_run,
    "webhook": cmd_webhook,
    "plan": cmd_plan,
    "explain": cmd_explain,
    "doctor": cmd_doctor,
    "validate": cmd_validate,
    "completion": cmd_completion,
    "crds": cmd_crds,
}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (
        output.Printable(stdout),
        output.Printable(stderr),
    )  # no text from elsewhere acts on the terminal
    try:
        code: int = COMMANDS[args.command](args)
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
