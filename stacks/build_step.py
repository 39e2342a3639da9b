"""A CodeBuild run as one CloudFormation step, the way the image build's layers and the SageMaker model's staging
run: a start handler (the caller's: it starts the build unless the build's output is already there) and one
completion handler the provider framework polls until the build has succeeded, or fails the step with the build's
status and where its log says why. CloudFormation waits at most CUSTOM_RESOURCE_MAX_WAIT_S for a custom resource;
the provider gives up a few polls earlier, so that the failure carries a reason."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Duration
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import custom_resources as cr
from constructs import Construct

from gguf_serve.catalog.images import BUILD_POLL_INTERVAL_S, CUSTOM_RESOURCE_MAX_WAIT_S
from stacks import lambda_runtimes
from stacks.nag import acknowledge, arn_of

HANDLERS = Path(__file__).resolve().parent / "handlers"


def build_step_provider(
    scope: Construct, *, project: codebuild.Project, start: str, what: str, look: str
) -> tuple[lambda_.Function, cr.Provider]:
    """The provider of one build step in `scope`, and its start handler (for the caller's own grants).

    start: the start handler's file in stacks/handlers; what: the build in a failure ("image build"); look: where
    its log says why ("read its CodeBuild log group")."""
    handlers: dict[str, lambda_.Function] = {}
    for name, source in (("start", start), ("is_complete", "build_is_complete.py")):
        fn = lambda_.Function(
            scope,
            f"{name.title().replace('_', '')}Handler",
            runtime=lambda_runtimes.PYTHON,
            handler="index.handler",
            code=lambda_.Code.from_inline((HANDLERS / source).read_text()),
            timeout=Duration.seconds(30),
            environment={"BUILD_WHAT": what, "BUILD_LOOK": look} if name == "is_complete" else None,
        )
        fn.add_to_role_policy(
            iam.PolicyStatement(
                actions=["codebuild:StartBuild", "codebuild:BatchGetBuilds"], resources=[project.project_arn]
            )
        )
        acknowledge(fn, "AwsSolutions-L1", "Python 3.13 is offered in the China regions; 3.14 is not verified.")
        handlers[name] = fn
    provider = cr.Provider(
        scope,
        "Provider",
        on_event_handler=handlers["start"],
        is_complete_handler=handlers["is_complete"],
        query_interval=Duration.seconds(BUILD_POLL_INTERVAL_S),
        # Report a failure before CloudFormation's own limit does (it would leave no reason).
        total_timeout=Duration.seconds(CUSTOM_RESOURCE_MAX_WAIT_S - 5 * BUILD_POLL_INTERVAL_S),
    )
    framework = [c for c in provider.node.find_all() if isinstance(c, lambda_.Function) and "framework-" in c.node.id]
    acknowledge(
        scope,
        "AwsSolutions-IAM4",
        f"Lambda basic execution role (CloudWatch Logs) for the {what}'s trigger.",
        findings=["Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"],
    )
    acknowledge(
        provider,
        "AwsSolutions-IAM5",
        "The provider framework invokes any version of its own handlers.",
        findings=[f"Resource::{arn_of(fn)}:*" for fn in (*handlers.values(), *framework)],
    )
    acknowledge(provider, "AwsSolutions-L1", "The provider framework pins its own Node.js runtime.")
    acknowledge(provider, "AwsSolutions-SF1", "The provider's waiter only polls the build; CodeBuild logs it.")
    acknowledge(provider, "AwsSolutions-SF2", "The provider's waiter only polls the build; no X-Ray traces to follow.")
    return handlers["start"], provider
