#!/usr/bin/env python3
"""`npx cdk synth|deploy <Stack>`: GravitonMoeStack, IntelMoeStack, GpuMtpStack. Options: deploy.toml, or -c."""

import sys

from stacks.app import main

sys.exit(main())
