"""`python3 -m gguf_serve.container.kube api-key|serve|scale|lb-join|lb-leave` (see the package's docstring)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from gguf_serve.container.kube.apikey import ApiKeyError, read_api_key, serve_with_key, write_api_key
from gguf_serve.container.kube.targets import HOST_IP_ENV, SETTLE_S


def _api_key(args: argparse.Namespace) -> int:
    try:
        write_api_key(args.secret_id, args.out, region=args.region)
    except ApiKeyError as e:
        print(f"gguf-serve-kube: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"gguf-serve-kube: API key written to {args.out}", flush=True)
    return 0


def _serve(args: argparse.Namespace) -> int:
    return serve_with_key(args.key_file, args.launch_args)


def _lb(args: argparse.Namespace) -> int:
    """postStart (`lb-join`) and preStop (`lb-leave`, then the command after --): never fails the hook itself."""
    import os

    from gguf_serve.container.kube.targets import clients_for, move, settle

    logging.basicConfig(level=logging.INFO, format="%(asctime)s gguf-serve-kube %(levelname)s %(message)s")
    host_ip = args.host_ip or os.environ.get(HOST_IP_ENV, "")
    action = "join" if args.command == "lb-join" else "leave"
    left = False
    if host_ip:
        left = move(action, target_group=args.target_group, port=args.port, host_ip=host_ip,
                    clients=clients_for(args.region)) is not None  # fmt: skip
    else:
        logging.getLogger("gguf-serve-kube").warning("%s: no host IP (%s unset): nothing to do", action, HOST_IP_ENV)
    then = args.then[1:] if args.then[:1] == ["--"] else args.then
    if action == "leave" and then:
        if left:
            settle(args.settle)
        sys.stdout.flush()
        os.execvp(then[0], then)  # noqa: S606 - the hop's own preStop (its drain), in this process, argv as given
    return 0


def _scale(args: argparse.Namespace) -> int:
    from gguf_serve.container.kube.api import KubeApi, KubeError
    from gguf_serve.container.kube.scaler import NodeGroup, ScalePolicy, Scaler

    logging.basicConfig(level=logging.INFO, format="%(asctime)s gguf-serve-scaler %(levelname)s %(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)
    try:
        policy = ScalePolicy(
            min_replicas=args.min, max_replicas=args.max, slots=args.slots, target_busy_ratio=args.target_busy_ratio,
            deferred_step=args.deferred_step, scale_in_after_s=args.scale_in_after,
        )  # fmt: skip
        api = KubeApi(args.api_server, token_file=None, ca_file=None) if args.api_server else KubeApi.in_cluster()
    except (ValueError, KubeError) as e:
        print(f"gguf-serve-scaler: {e}", file=sys.stderr, flush=True)
        return 2
    nodes = None
    if args.nodegroup:
        import boto3

        clients = {}

        def client(service: str):
            return clients.setdefault(service, boto3.client(service, region_name=args.region))

        nodes = NodeGroup(args.cluster, args.nodegroup, client)
    usage = None
    if args.usage_profile and not args.profile_nodes:
        print("gguf-serve-scaler: --usage-profile needs --profile-nodes (the nodes it counts)", file=sys.stderr)
        return 2
    if args.usage_profile:
        import boto3

        from gguf_serve.container.kube.usage import FleetUsage

        cloudwatch = boto3.client("cloudwatch", region_name=args.region)
        usage = FleetUsage(cloudwatch.put_metric_data, args.usage_profile, args.slots, interval_s=args.usage_interval)
    key_file: Path | None = args.key_file
    scaler = Scaler(
        api=api, namespace=args.namespace, deployment=args.deployment, selector=args.selector, policy=policy,
        api_key=lambda: read_api_key(key_file) if key_file else None, port=args.port, nodes=nodes,
        node_selector=f"eks.amazonaws.com/nodegroup={args.nodegroup}", fixed_nodes=args.fixed_nodes,
        profile_nodes=args.profile_nodes, usage=usage,
    )  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log = logging.getLogger("gguf-serve-scaler")
    log.info(
        "scaling %s/%s on %s, every %ss: %s", args.namespace, args.deployment, args.selector, args.interval, policy
    )
    while not stop.is_set():
        try:
            scaler.step()
        except Exception as e:  # noqa: BLE001 - a failed step is one line; the next one tries again
            log.warning("step failed: %s: %s", type(e).__name__, e)
        stop.wait(args.interval)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gguf-serve-kube", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    k = sub.add_parser("api-key", help="write the API key from Secrets Manager to a file (an init container)")
    k.add_argument("--secret-id", required=True, help="the secret's ARN or name")
    k.add_argument("--out", type=Path, required=True, help="where to write it (a memory-backed volume)")
    k.add_argument("--region", help="default: the SDK's (AWS_REGION)")
    k.set_defaults(func=_api_key)
    s = sub.add_parser("serve", help="the launcher's serve with LLAMA_API_KEY from --key-file")
    s.add_argument("--key-file", type=Path, required=True)
    s.add_argument("launch_args", nargs=argparse.REMAINDER, help="after --: the launcher's serve arguments")
    s.set_defaults(func=_serve)
    c = sub.add_parser("scale", help="set a Deployment's replicas from llama.cpp's load signals")
    c.add_argument("--namespace", required=True)
    c.add_argument("--deployment", required=True)
    c.add_argument("--selector", required=True, help="label selector of the serving pods")
    c.add_argument("--port", type=int, required=True, help="the hop's port in the pods")
    c.add_argument("--slots", type=int, required=True, help="llama-server slots per pod")
    c.add_argument("--min", type=int, required=True)
    c.add_argument("--max", type=int, required=True)
    c.add_argument("--target-busy-ratio", type=float, default=0.7)
    c.add_argument("--deferred-step", type=int, default=1)
    c.add_argument("--scale-in-after", type=float, default=300.0, help="seconds of agreement before scale-in")
    c.add_argument("--interval", type=float, default=15.0)
    c.add_argument("--key-file", type=Path, help="the API key file (the pods' /metrics need the key)")
    c.add_argument("--cluster", help="EKS cluster name (with --nodegroup)")
    c.add_argument("--nodegroup", help="managed node group whose nodes follow the pods (none: pods only)")
    c.add_argument(
        "--profile-nodes", default="",
        help="label selector of every node of the profile: a pod on a cordoned one is replaced before it goes",
    )  # fmt: skip
    c.add_argument(
        "--fixed-nodes", type=int, default=0,
        help="the profile's nodes outside --nodegroup, always there (an On-Demand floor beside a Spot group)",
    )  # fmt: skip
    c.add_argument(
        "--usage-profile", metavar="STACK/PROFILE",
        help="publish the profile's nodes, output tokens and busy slots to CloudWatch under this EksProfile (with "
        "--profile-nodes): what its tokens cost, live",
    )  # fmt: skip
    c.add_argument("--usage-interval", type=float, default=60.0, help="seconds between publications (default 60)")
    c.add_argument("--region")
    c.add_argument("--api-server", help="API server URL without TLS or token (tests); default: in-cluster")
    c.set_defaults(func=_scale)
    for name, what in (
        ("lb-join", "register this pod's node in its target group (postStart)"),
        ("lb-leave", "deregister it, wait --settle s, then run the command after -- (preStop)"),
    ):
        t = sub.add_parser(name, help=what)
        t.add_argument("--target-group", required=True, help="the profile's target group ARN")
        t.add_argument("--port", type=int, required=True, help="the Service's NodePort")
        t.add_argument("--host-ip", help=f"the node's private IP (default: ${HOST_IP_ENV})")
        t.add_argument("--region", help="default: the SDK's (AWS_REGION)")
        t.add_argument("--settle", type=float, default=SETTLE_S, help="s between the deregistration and the command")
        t.add_argument("then", nargs=argparse.REMAINDER, help="after --: what runs next (the hop's preStop)")
        t.set_defaults(func=_lb)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "launch_args", None) and args.launch_args[0] == "--":
        args.launch_args = args.launch_args[1:]
    return args.func(args)
