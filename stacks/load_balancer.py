"""Internal Application Load Balancer in front of the llama-server fleet."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_s3 as s3
from constructs import Construct


class InferenceLoadBalancer(Construct):
    """Internal only (a public ALB in China needs an ICP filing); HTTPS when a certificate is given."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        vpc_cidr: str,
        access_logs: s3.IBucket,
        idle_timeout: Duration,
        allowed_cidrs: tuple[str, ...],
        certificate_arn: str | None = None,
    ) -> None:
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
            idle_timeout=idle_timeout,
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

    @property
    def url(self) -> str:
        return f"{self.protocol}://{self.alb.load_balancer_dns_name}"
