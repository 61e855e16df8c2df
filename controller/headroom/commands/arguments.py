"""The `headroom` command line's grammar: each subcommand's flags, their types and help,
and the shell completion generated from it. What each subcommand does is in `cli`."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from .. import __version__


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
        "--webhook-api-server-cidr",
        action="append",
        type=_cidr,
        default=[],
        metavar="CIDR",
        help="with --webhook-cert-dir: as `headroom webhook --api-server-cidr`",
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


def _completion_command(sub: Any) -> None:
    p = sub.add_parser(
        "completion",
        help="print a shell completion script: source <(headroom completion bash), or for zsh the same with zsh",
    )
    p.add_argument("shell", choices=("bash", "zsh"))


def _crds_command(sub: Any) -> None:
    p = sub.add_parser("crds", help="print, write or check the generated CRDs")
    p.add_argument("--dir", default="crds", help="directory of the CRD files (default: crds)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write the CRDs into --dir")
    mode.add_argument("--check", action="store_true", help="exit 1 when --dir is stale")


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
    p.add_argument(
        "--api-server-cidr",
        action="append",
        type=_cidr,
        default=[],
        metavar="CIDR",
        help="addresses the API server calls the webhook from, besides those of the EndpointSlice "
        "default/kubernetes (repeatable; for a managed control plane or a konnectivity proxy). Every other "
        "client shares a small fixed pool of connections, bytes and decisions",
    )


def _cidr(value: str) -> str:
    from ..webhook.peers import parse_cidrs

    try:
        parse_cidrs([value])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


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
