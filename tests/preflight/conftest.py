from __future__ import annotations

import fcntl
import pickle

import pytest

from gguf_serve.preflight.plan import deploy_plan
from tests.conftest import cdk_context


@pytest.fixture(scope="session")
def plan(tmp_path_factory: pytest.TempPathFactory):
    """The plan of every EC2 stack with the tests' lock (the 27B pinned, so every stack is checked): one whole-app
    synthesis per test session, made by the first xdist worker that needs it and read by the others from the folder
    they share, under a lock (as tests/whole_app.py does for the whole-app option sets)."""
    from tests.whole_app import shared_folder

    shared = shared_folder(tmp_path_factory)
    shared.mkdir(parents=True, exist_ok=True)
    made = shared / "deploy-plan.pickle"
    with open(shared / "deploy-plan.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when this worker dies
        if not made.is_file():
            partial = made.with_suffix(".partial")
            partial.write_bytes(pickle.dumps(deploy_plan(context=cdk_context())))
            partial.rename(made)
        return pickle.loads(made.read_bytes())  # noqa: S301 - written above by this session's own workers
