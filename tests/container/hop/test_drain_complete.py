"""The drain's CompleteLifecycleAction when EC2 Auto Scaling throttles it (botocore's own Stubber: the real client,
its parameter validation, an error answer as the service gives it): tried again at the next poll until it goes
through; a ValidationError (no action waits for this instance) is not retried."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import boto3
from botocore.stub import Stubber

from gguf_serve.container.hop.drain import Drainer, DrainSettings, DrainState
from gguf_serve.container.names import DRAIN_HOOK

GROUP, INSTANCE = "Stack-ServingGroup-ABC", "i-0123456789abcdef0"
CALL = {"AutoScalingGroupName": GROUP, "LifecycleHookName": DRAIN_HOOK, "InstanceId": INSTANCE,
        "LifecycleActionResult": "CONTINUE"}  # fmt: skip


def _drainer(client) -> tuple[Drainer, SimpleNamespace]:
    drainer = Drainer(DrainSettings(hook=DRAIN_HOOK, poll_s=5.0), aws=lambda service: client)
    drainer.identity, drainer.lifecycle_state = (GROUP, INSTANCE), "Terminating:Wait"
    done = DrainState("lifecycle Terminating:Wait", deadline=0.0, cut=0, ended=1.0)  # streams done: complete now
    return drainer, SimpleNamespace(drain=done, in_flight=0)


def _client():
    credentials = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}  # a stubbed client's
    return boto3.client("autoscaling", region_name="cn-northwest-1", **credentials)


def test_a_throttled_complete_is_tried_again_at_the_next_poll() -> None:
    client = _client()
    drainer, server = _drainer(client)
    with Stubber(client) as stub:
        stub.add_client_error("complete_lifecycle_action", "Throttling", "Rate exceeded", 400, expected_params=CALL)
        stub.add_response("complete_lifecycle_action", {}, CALL)
        asyncio.run(drainer._poll(server))
        assert not drainer.completed_hook  # throttled: the hook still waits for this instance
        asyncio.run(drainer._poll(server))
        assert drainer.completed_hook
        stub.assert_no_pending_responses()


def test_no_action_waiting_is_not_retried() -> None:
    client = _client()
    drainer, server = _drainer(client)
    with Stubber(client) as stub:
        stub.add_client_error("complete_lifecycle_action", "ValidationError", "No active Lifecycle Action found",
                              400, expected_params=CALL)  # fmt: skip
        asyncio.run(drainer._poll(server))
        asyncio.run(drainer._poll(server))  # no second call: the Stubber would refuse it
        assert drainer.completed_hook and drainer.complete_tries == 1
