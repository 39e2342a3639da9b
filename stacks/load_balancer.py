"""Internal Application Load Balancer in front of the llama-server fleet, with its target group and health check."""

from __future__ import annotations

import ipaddress

from aws_cdk import Duration, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_s3 as s3
from constructs import Construct

from gguf_serve.catalog.fleet import LoadBalancerSettings
from stacks.errors import PropsError

MAX_IDLE_TIMEOUT_S = 4000  # ALB idle_timeout: 1-4000 seconds (ELBv2 API Reference, LoadBalancerAttribute)
MAX_DEREGISTRATION_DELAY_S = 3600  # target group deregistration_delay: 0-3600 seconds


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
        targets: list[elbv2.IApplicationLoadBalancerTarget],
        target_port: int,
        settings: LoadBalancerSettings | None = None,
        allowed_cidrs: tuple[str, ...] = (),
        certificate_arn: str | None = None,
    ) -> None:
        """
        vpc: where the ALB goes (private subnets with egress).
        vpc_cidr: who may call it when `allowed_cidrs` is empty.
        access_logs: the bucket the ALB writes its access logs to (prefix `alb`).
        targets: what serves behind it (the fleet's Auto Scaling group); registered on `target_port` (HTTP).
        settings: the idle timeout and the deregistration delay (a profile's [fleet]); default LoadBalancerSettings().
        allowed_cidrs: CIDRs that may call the ALB (-c allowedCidrs); default () means the VPC only.
        certificate_arn: an ACM or IAM server certificate ARN (-c certificateArn) for HTTPS on 443; default HTTP on 80.
        """
        settings = settings or LoadBalancerSettings()
        _check_props(target_port, settings, allowed_cidrs, certificate_arn)
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
        self.target_group = self.listener.add_targets(
            "Servers",
            port=target_port,
            protocol=elbv2.ApplicationProtocol.HTTP,  # stated: CDK infers it for 80/443/8080 only (a NodePort)
            targets=targets,
            deregistration_delay=Duration.seconds(settings.deregistration_delay_s),
            # /health answers 503 while the model loads and needs no API key; only 200 is healthy.
            health_check=elbv2.HealthCheck(
                path="/health",
                healthy_http_codes="200",
                interval=Duration.seconds(15),
                timeout=Duration.seconds(5),
                healthy_threshold_count=2,
                unhealthy_threshold_count=3,
            ),
        )

    @property
    def url(self) -> str:
        return f"{self.protocol}://{self.alb.load_balancer_dns_name}"


def _check_props(
    target_port: int, settings: LoadBalancerSettings, allowed_cidrs: tuple[str, ...], certificate_arn: str | None
) -> None:
    idle_timeout_s, deregistration_delay_s = settings.alb_idle_timeout_s, settings.deregistration_delay_s
    if not 1 <= target_port <= 65535:
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
