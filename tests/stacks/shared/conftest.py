"""What SharedEndpointStack's synthesis is made of (its fixtures, `shared_assembly` and `shared_templates`, are in
tests/stacks/conftest.py): three EC2 stacks behind it. The Graviton and Intel ones serve the same 35B-A3B names
(balanced over both), the GPU one the 27B; the callers limited and HTTPS, as a team's endpoint would be."""

from __future__ import annotations

from tests.whole_app import CERT

MEMBERS = ("GravitonMoeStack", "GpuMtpStack", "IntelMoeStack")
CONTEXT = {"sharedEndpoint": ",".join(MEMBERS), "allowedCidrs": "10.8.0.0/16", "certificateArn": CERT}
