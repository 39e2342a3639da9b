"""Internal Application Load Balancer in front of the llama-server fleet, with its target group and health check."""

from __future__ import annotations

import ipaddress

from aws_cdk import Duration, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_s3 as s3
from constructs import Construct

from gguf_serve.catalog.fleet import LoadBalancerSettings
from gguf_serve.container.hop.models import MODEL_HEADER_NAME
from stacks.errors import PropsError

MAX_IDLE_TIMEOUT_S = 4000  # ALB idle_timeout: 1-4000 seconds (ELBv2 API Reference, LoadBalancerAttribute)
MAX_DEREGISTRATION_DELAY_S = 3600  # target group deregistration_delay: 0-3600 seconds


MODEL_HEADER = MODEL_HEADER_NAME  # the hop forwards with it (gguf_serve/container/hop/models.py); the rules match it
ROUTE_PORT = 8000  # the shared load balancer's listener for the hops' forwards (inside the VPC, nodes only)
MODEL_NAMES_PER_RULE = 5  # ELB: condition values per rule (ELB User Guide for ALBs, "Quotas", docs.amazonaws.cn)


MAX_RULE_PRIORITY = 50000  # a listener rule's priority: 1-50000 (ELBv2 API Reference, CreateRule)


def _no_fleet() -> elbv2.ListenerAction:
    """A request no rule takes (a model no fleet here serves, or the default fleet's stack not deployed yet), in
    OpenAI's error shape, as the hop answers a model it does not serve."""
    return elbv2.ListenerAction.fixed_response(
        404, content_type="application/json",
        message_body='{"error":{"code":"model_not_found","message":"no fleet serves that model here"}}',
    )  # fmt: skip


def model_conditions(names: list[str]) -> list[elbv2.ListenerCondition]:
    """The X-Gateway-Model-Name conditions that match `names`: at most MODEL_NAMES_PER_RULE values each, one rule
    per condition."""
    return [elbv2.ListenerCondition.http_header(MODEL_HEADER, names[i : i + MODEL_NAMES_PER_RULE])
            for i in range(0, len(names), MODEL_NAMES_PER_RULE)]  # fmt: skip


def forward_to(groups: list[elbv2.IApplicationTargetGroup]) -> elbv2.ListenerAction:
    """To one fleet's target group, or, for a model several fleets serve, to each of theirs with equal weight."""
    if len(groups) == 1:
        return elbv2.ListenerAction.forward(groups)
    return elbv2.ListenerAction.weighted_forward([elbv2.WeightedTargetGroup(target_group=g, weight=1) for g in groups])


def serving_group(settings: LoadBalancerSettings) -> dict:
    """A fleet's target group: HTTP (stated: CDK infers it for 80/443/8080 only, not a NodePort), the profile's
    deregistration delay, and /health (503 while the model loads, no API key needed; only 200 is healthy)."""
    return {
        "protocol": elbv2.ApplicationProtocol.HTTP,
        "deregistration_delay": Duration.seconds(settings.deregistration_delay_s),
        "health_check": elbv2.HealthCheck(
            path="/health", healthy_http_codes="200", interval=Duration.seconds(15), timeout=Duration.seconds(5),
            healthy_threshold_count=2, unhealthy_threshold_count=3,
        ),
    }  # fmt: skip


class InferenceLoadBalancer(Construct):
    """Internal only (a public ALB in China needs an ICP filing); HTTPS when a certificate is given.

    Exposes `alb`, `listener`, `target_group`, `security_group` and `url`.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        vpc_cidr: str,
        access_logs: s3.IBucket,
        targets: list[elbv2.IApplicationLoadBalancerTarget] | None,
        target_port: int | None = None,
        settings: LoadBalancerSettings | None = None,
        allowed_cidrs: tuple[str, ...] = (),
        certificate_arn: str | None = None,
    ) -> None:
        """
        vpc: where the ALB goes (private subnets with egress).
        vpc_cidr: who may call it when `allowed_cidrs` is empty.
        access_logs: the bucket the ALB writes its access logs to (prefix `alb`).
        targets: what serves behind it (the fleet's Auto Scaling group); registered on `target_port` (HTTP). None:
            no fleet of its own (SharedEndpointStack; no `target_port` then): `target_group` is None and a request
            no fleet's rule takes is answered 404 `model_not_found`.
        settings: the idle timeout and the deregistration delay (a profile's [fleet]); default LoadBalancerSettings().
        allowed_cidrs: CIDRs that may call the ALB (-c allowedCidrs); default () means the VPC only.
        certificate_arn: an ACM or IAM server certificate ARN (-c certificateArn) for HTTPS on 443; default HTTP on 80.
        """
        settings = settings or LoadBalancerSettings()
        _check_props(targets, target_port, settings, allowed_cidrs, certificate_arn)
        super().__init__(scope, construct_id)
        self.port = 443 if certificate_arn else 80
        self.protocol = "https" if certificate_arn else "http"
        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc, allow_all_outbound=False, description="Inference ALB: callers in"
        )
        for cidr in allowed_cidrs or (vpc_cidr,):
            self.security_group.add_ingress_rule(ec2.Peer.ipv4(cidr), ec2.Port.tcp(self.port), "API callers")
        self.alb = elbv2.ApplicationLoadBalancer(
            self,
            "Alb",
            vpc=vpc,
            internet_facing=False,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            security_group=self.security_group,
            idle_timeout=Duration.seconds(settings.alb_idle_timeout_s),
            drop_invalid_header_fields=True,
        )
        self.alb.log_access_logs(access_logs, prefix="alb")
        if certificate_arn:
            self.listener = self.alb.add_listener(
                "Https",
                port=443,
                protocol=elbv2.ApplicationProtocol.HTTPS,
                certificates=[elbv2.ListenerCertificate.from_arn(certificate_arn)],
                ssl_policy=elbv2.SslPolicy.RECOMMENDED_TLS,
                open=False,
            )
        else:
            self.listener = self.alb.add_listener("Http", port=80, protocol=elbv2.ApplicationProtocol.HTTP, open=False)
        self.settings, self.vpc = settings, vpc
        self.target_group: elbv2.ApplicationTargetGroup | None = None
        if targets is None or target_port is None:
            self.listener.add_action("NoFleet", action=_no_fleet())
        else:
            self.target_group = self.listener.add_targets("Servers", port=target_port, targets=targets,
                                                          **serving_group(settings))  # fmt: skip
        self.routes: elbv2.ApplicationListener | None = None

    def share(self, forwarders: ec2.IConnectable | None) -> None:
        """Make this load balancer the endpoint of several fleets; `target_group` (this one's first, if any) stays
        the default, where a client that names its model in the body only lands and its hop forwards what another
        fleet serves. The hops forward on `routes` (HTTP, ROUTE_PORT), open to `forwarders` only (the nodes; None:
        each fleet's stack opens it to its own instances): the same header rules as the main listener
        (route_models), and 404 for a name no fleet serves."""
        self.routes = self.alb.add_listener(
            "Routes", port=ROUTE_PORT, protocol=elbv2.ApplicationProtocol.HTTP, open=False, default_action=_no_fleet()
        )
        if forwarders is not None:
            self.security_group.connections.allow_from(forwarders, ec2.Port.tcp(ROUTE_PORT), "hops' forwards")

    def add_fleet(self, scope: Construct, construct_id: str, *, port: int) -> elbv2.ApplicationTargetGroup:
        """Another fleet behind this shared load balancer: its own target group on `port` (instance targets, the
        same health check and deregistration delay); route_models says which names reach it."""
        if self.routes is None:
            raise PropsError("load balancer: share() it before adding another fleet")
        return elbv2.ApplicationTargetGroup(
            scope, construct_id, vpc=self.vpc, port=port, target_type=elbv2.TargetType.INSTANCE,
            **serving_group(self.settings),
        )  # fmt: skip

    def route_models(self, fleets: dict[str, list[elbv2.IApplicationTargetGroup]]) -> None:
        """Model name -> the fleets that serve it: one rule per set of fleets on both listeners, matching the
        X-Gateway-Model-Name header, forwarding to that fleet (or, for a model several fleets serve, to each with
        equal weight). ELB: at most 5 condition values per rule (ELB User Guide for ALBs, "Quotas"), so a set's names
        go in rules of at most that many."""
        if self.routes is None:
            raise PropsError("load balancer: share() it before routing models")
        by_fleets: dict[tuple[int, ...], tuple[list[str], list[elbv2.IApplicationTargetGroup]]] = {}
        for name, groups in fleets.items():
            key = tuple(id(g) for g in groups)
            by_fleets.setdefault(key, ([], groups))[0].append(name)
        priority = 10
        for index, (names, groups) in enumerate(by_fleets.values()):
            action = forward_to(groups)
            for n, condition in enumerate(model_conditions(names)):
                i = n * MODEL_NAMES_PER_RULE  # the rule's first name (its construct id, as deployed)
                for listener, tag in ((self.listener, "Named"), (self.routes, "Routed")):
                    listener.add_action(f"{tag}{index}x{i}", priority=priority, conditions=[condition], action=action)
                priority += 1

    @property
    def route_url(self) -> str:
        """Where the hops forward a request for another fleet's model (HTTP inside the VPC)."""
        return f"http://{self.alb.load_balancer_dns_name}:{ROUTE_PORT}"

    @property
    def url(self) -> str:
        return f"{self.protocol}://{self.alb.load_balancer_dns_name}"


def _check_props(
    targets: list | None, target_port: int | None, settings: LoadBalancerSettings, allowed_cidrs: tuple[str, ...],
    certificate_arn: str | None,
) -> None:  # fmt: skip
    idle_timeout_s, deregistration_delay_s = settings.alb_idle_timeout_s, settings.deregistration_delay_s
    if (targets is None) != (target_port is None):
        raise PropsError("load balancer: targets and target_port go together (none for a shared endpoint's)")
    if target_port is not None and not 1 <= target_port <= 65535:
        raise PropsError(f"load balancer: target_port {target_port} must be 1-65535 (the fleet's serving port)")
    if not 1 <= idle_timeout_s <= MAX_IDLE_TIMEOUT_S:
        raise PropsError(
            f"load balancer: idle_timeout_s {idle_timeout_s} must be 1-{MAX_IDLE_TIMEOUT_S}; set "
            "fleet.alb_idle_timeout_s longer than the longest generation"
        )
    if not 0 <= deregistration_delay_s <= MAX_DEREGISTRATION_DELAY_S:
        raise PropsError(
            f"load balancer: deregistration_delay_s {deregistration_delay_s} must be 0-{MAX_DEREGISTRATION_DELAY_S}; "
            "set fleet.deregistration_delay_s"
        )
    for cidr in allowed_cidrs:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise PropsError(f"load balancer: allowed CIDR {cidr!r} is not a network; write e.g. 10.8.0.0/16") from None
    if certificate_arn and not Token.is_unresolved(certificate_arn) and not certificate_arn.startswith("arn:"):
        raise PropsError(
            f"load balancer: certificate {certificate_arn!r} is not an ARN; pass the ACM or IAM server certificate's "
            "ARN (-c certificateArn=arn:aws-cn:acm:...)"
        )
