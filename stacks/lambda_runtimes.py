"""The Lambda runtimes in the stacks' templates: ours, and the one CDK gives its own handlers; each listed by
China's Lambda Developer Guide."""

from __future__ import annotations

from aws_cdk import aws_lambda as lambda_

# The image build's trigger and the wake door.
PYTHON = lambda_.Runtime.PYTHON_3_13
# What docs.amazonaws.cn lists: Node.js nodejs24.x, nodejs22.x, nodejs20.x (lambda/latest/dg/lambda-nodejs.html) and
# Python python3.14 to python3.10 (lambda/latest/dg/lambda-python.html). The pinned aws-cdk-lib (2.275.0) gives its
# provider framework (the image build's waiter) and the VPC's default-security-group handler its region fact
# LATEST_NODE_RUNTIME: nodejs24.x for cn-northwest-1 and cn-north-1 (region-info built-ins). Not verifiable here:
# "future runtime release dates do not apply to the China Regions" (Getting Started with AWS in China, Lambda), and
# no read-only API lists a region's runtimes; a runtime the region lacked would fail its function's creation in the
# deploy's first minutes, before any image build starts (the build's custom resources need those functions first).
CHINA_DOCUMENTED = frozenset(
    {"nodejs24.x", "nodejs22.x", "nodejs20.x", "python3.14", "python3.13", "python3.12", "python3.11", "python3.10"}
)
