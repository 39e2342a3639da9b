"""cdk-nag acknowledgements: every one names its rule, the exact findings, and why they do not apply."""

from __future__ import annotations

from aws_cdk import Acknowledgment, CfnElement, Stack, Token, Validations
from constructs import IConstruct


def acknowledge(scope: IConstruct, rule: str, reason: str, findings: list[str] | tuple[str, ...] = ()) -> None:
    """Acknowledge `rule` (or only its listed findings, e.g. 'Resource::*') on scope and its children."""
    ids = [f"{rule}[{f}]" for f in findings] or [rule]
    Validations.of(scope).acknowledge(*(Acknowledgment(id=i, reason=reason) for i in ids))


def arn_of(construct: IConstruct) -> str:
    """How cdk-nag prints a GetAtt Arn of the construct's CloudFormation resource in a finding."""
    element = construct.node.default_child or construct
    assert isinstance(element, CfnElement)
    return f"<{Stack.of(construct).get_logical_id(element)}.Arn>"


def account_in_finding(scope: IConstruct) -> str:
    """The account as cdk-nag prints it in an ARN of a finding: the stack's own when the deploy names one
    (-c account), else the pseudo parameter."""
    account = Stack.of(scope).account
    return "<AWS::AccountId>" if Token.is_unresolved(account) else account
