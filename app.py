#!/usr/bin/env python3
"""`npx cdk synth|deploy <Stack>`: GravitonMoeStack, IntelMoeStack, GpuMtpStack. Options: deploy.toml, or -c."""

import sys

from gguf_serve.catalog import ProfileError
from stacks.app import build_app

try:
    app = build_app()
except ProfileError as bad:  # a bad profile or deploy option: say what to change, no traceback
    sys.exit(f"error: {bad}")
app.synth()
