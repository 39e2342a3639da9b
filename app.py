#!/usr/bin/env python3
"""`npx cdk synth|deploy <Stack>`: GravitonMoeStack, IntelMoeStack, GpuMtpStack."""

from aws_cdk import Validations
from cdk_nag import AwsSolutionsChecks

from stacks.app import build_app

app = build_app()
Validations.of(app).add_plugins(AwsSolutionsChecks(app))
app.synth()
