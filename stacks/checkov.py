"""checkov's CloudFormation findings we accept, each with its reason, written onto the resource it concerns.

checkov reads `Metadata.checkov.skip` on a resource. Rather than scattering the same reason over every log group or
handler, each accepted finding is stated once here, with the resources it applies to; anything else checkov finds
fails the test tier (tests/stacks/test_policy_scanners.py).
"""

from __future__ import annotations

from collections.abc import Callable

import jsii
from aws_cdk import CfnResource, IAspect
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from constructs import IConstruct

_LAMBDA_REASONS = {
    "CKV_AWS_115": "Deploy-time custom-resource handler, invoked a few times per deploy; reserved concurrency "
    "would only take capacity from the account.",
    "CKV_AWS_116": "Invoked synchronously by CloudFormation or the provider framework; a dead-letter queue applies "
    "to asynchronous invocations only, and failures surface as the stack event.",
    "CKV_AWS_117": "Calls only AWS APIs (CodeBuild, EC2, CloudFormation) and reaches no VPC resource; running it "
    "in the VPC would add ENIs and endpoints for nothing.",
    "CKV_AWS_173": "The environment holds function ARNs and names set by CDK, no secrets.",
}


_WAKE_DOOR_REASONS = {
    "CKV_AWS_115": "The wake door answers requests only while the group is at zero; reserved concurrency would take "
    "capacity from the account's other functions for a function that is idle while the fleet serves.",
    "CKV_AWS_116": "The load balancer invokes it synchronously; EventBridge retries its events twice, and a lost one "
    "is put right by the five-minute schedule and by the next request, so nothing waits in a dead-letter queue.",
    "CKV_AWS_117": "Calls only the EC2 Auto Scaling and Elastic Load Balancing APIs and reaches no VPC resource; "
    "running it in the VPC would add ENIs and endpoints for nothing.",
    "CKV_AWS_173": "The environment holds the group's name, the listener's and target group's ARNs and a number.",
}


_EKS_HANDLER_REASONS = {
    "CKV_AWS_115": "Deploy-time handler of the EKS stack (kubectl, a node group's target attachment, CDK's utilities), "
    "invoked a few times per deploy; reserved concurrency would only take capacity from the account.",
    "CKV_AWS_116": "Invoked synchronously by CloudFormation or the provider framework; a dead-letter queue applies "
    "to asynchronous invocations only, and failures surface as the stack event.",
    "CKV_AWS_117": "Calls only AWS APIs (EKS, EC2 Auto Scaling) and reaches no VPC resource; the kubectl handler, "
    "which reaches the private API endpoint, runs in the VPC.",
    "CKV_AWS_173": "The environment holds function ARNs and names set by CDK, no secrets.",
}


def _is_eks_deploy_handler(node: CfnResource) -> bool:
    """The EKS stack's deploy-time functions: CDK's kubectl provider and utilities, the node-group attachment."""
    path = node.node.path
    return path.startswith("EksServingStack/") and any(
        part in path for part in ("/KubectlProvider/", "/Targets/", "/AWSCDKCfnUtilsProvider")
    )


def _is_wake_door(node: CfnResource) -> bool:
    return "/WakeDoor/" in node.node.path


def _is_deploy_time_handler(node: CfnResource) -> bool:
    """CDK's own providers (Custom::...), the image-build trigger and the SageMaker model staging's."""
    path = node.node.path
    return "/Custom::" in path or "/Image/" in path or "/Staging/" in path


def _is_http_listener(node: CfnResource) -> bool:
    return isinstance(node, elbv2.CfnListener) and node.protocol == "HTTP"


def _is_sagemaker_execution_role(node: CfnResource) -> bool:
    return "/Serving/ExecutionRole/" in node.node.path


_SAGEMAKER_ROLE_REASONS = {
    "CKV_AWS_111": "The EC2 network-interface calls SageMaker makes for the model's VpcConfig, as the CreateModel "
    "execution role is documented ('SageMaker AI roles', docs.amazonaws.cn): Resource *; a narrower condition "
    "cannot be verified without an account, and a wrong one would fail the endpoint.",
    "CKV_AWS_109": "ec2:CreateNetworkInterfacePermission and its delete, for the endpoint's network interfaces in "
    "this stack's isolated subnets (the documented CreateModel role's VpcConfig actions): SageMaker attaches them.",
}


_Rule = tuple[str, Callable[[CfnResource], bool], dict[str, str]]
ACCEPTED: tuple[_Rule, ...] = (
    ("AWS::Lambda::Function", _is_deploy_time_handler, _LAMBDA_REASONS),
    ("AWS::Lambda::Function", _is_wake_door, _WAKE_DOOR_REASONS),
    ("AWS::IAM::Policy", _is_sagemaker_execution_role, _SAGEMAKER_ROLE_REASONS),
    ("AWS::Lambda::Function", _is_eks_deploy_handler, _EKS_HANDLER_REASONS),
    (
        "AWS::Logs::LogGroup",
        lambda _: True,
        {
            "CKV_AWS_158": "CloudWatch Logs encrypts every log group at rest with service keys; a customer key needs "
            "a key policy for each partition's logs principal, and these logs carry no secret (the API key never "
            "reaches a log line)."
        },
    ),
    (
        "AWS::S3::Bucket",
        lambda _: True,
        {
            "CKV_AWS_21": "The model cache holds sha256-verified copies of public GGUF files that ModelScope can "
            "serve again; the log bucket holds append-only log objects. Versioning would double the cost of a "
            "rewritten 22 GB object and protect nothing."
        },
    ),
    (
        "AWS::S3::Bucket",
        lambda node: "/AccessLogs/" in node.node.path,
        {
            "CKV_AWS_18": "This is the access-log bucket itself; S3 cannot log a bucket into itself, and logging "
            "it elsewhere only moves the question."
        },
    ),
    (
        "AWS::ECR::Repository",
        lambda _: True,
        {
            "CKV_AWS_136": "Images are encrypted at rest with ECR's AES-256 default; they hold llama.cpp builds "
            "and no secret, and a customer key would add a KMS call to every layer pull at scale-out."
        },
    ),
    (
        "AWS::SecretsManager::Secret",
        lambda _: True,
        {
            "CKV_AWS_149": "Encrypted with the account's aws/secretsmanager key; only this stack's instance role "
            "may read it, and a customer key would add cost without narrowing who can decrypt."
        },
    ),
    (
        "AWS::ElasticLoadBalancingV2::Listener",
        _is_http_listener,
        {
            "CKV_AWS_2": "Internal load balancer without a certificate: HTTP inside the VPC from allowedCidrs only; "
            "set certificateArn in deploy.toml for an HTTPS listener (ACM issues no public certificates in China).",
            "CKV_AWS_103": "Plain HTTP listener (no TLS to configure) on an internal load balancer; the HTTPS "
            "listener uses ELB's recommended TLS 1.2+ policy.",
        },
    ),
)


@jsii.implements(IAspect)
class CheckovAcknowledgements:
    def visit(self, node: IConstruct) -> None:
        if not isinstance(node, CfnResource):
            return
        skips = []
        for kind, applies, reasons in ACCEPTED:
            if node.cfn_resource_type == kind and applies(node):
                skips += [{"id": check, "comment": reason} for check, reason in reasons.items()]
        if skips:
            existing = (node.get_metadata("checkov") or {}).get("skip", [])
            node.add_metadata("checkov", {"skip": [*existing, *skips]})
