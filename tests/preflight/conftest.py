from __future__ import annotations

import pytest

from gguf_serve.preflight.plan import deploy_plan
from tests.conftest import cdk_context


@pytest.fixture(scope="session")
def plan():
    return deploy_plan(context=cdk_context())  # the tests' lock: the 27B pinned, so every stack is checked
