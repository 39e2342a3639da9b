"""The wake door against callers without the key and an AWS that throttles (moto's Auto Scaling, ELBv2 and Secrets
Manager): only a request with llama-server's key wakes a sleeping group, after every scale-in too; a throttled or
failed call is a 503 with Retry-After, never the load balancer's bare 502; a hand-edited tag cannot crash it."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ClientError

from stacks.wake_door import WOKEN_TAG
from tests.stacks.test_wake_door_handler import GROUP, KEY, WAKE_S, alb_request, group, world  # noqa: F401

UNAUTHORIZED = {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}


def _request(w, headers: dict, *, path: str = "/v1/chat/completions", method: str = "POST") -> dict:
    event = alb_request(w.door_tg)
    event.update(path=path, httpMethod=method, headers={"content-type": "application/json", **headers})
    return w.door.handler(event, None)


def _asleep(w) -> None:
    w.door.handler({"source": "aws.events"}, None)  # routes requests to the door: no instance in service


@pytest.mark.parametrize(
    ("headers", "wakes"),
    [
        ({"authorization": "Bearer wrong", "x-api-key": KEY}, False),  # Authorization wins when it is set
        ({"x-api-key": KEY}, True),  # the rest of llama-server's reading: tests/container/hop/test_keyless.py
    ],
    ids=["wrong-bearer-right-x", "x-api-key"],
)
def test_only_a_request_with_the_key_wakes_the_group(world, headers, wakes):  # noqa: F811
    _asleep(world)
    answer = _request(world, headers)
    if wakes:
        assert answer["statusCode"] == 503 and group(world)["DesiredCapacity"] == 1
    else:
        assert answer["statusCode"] == 401 and json.loads(answer["body"]) == UNAUTHORIZED
        g = group(world)
        assert g["DesiredCapacity"] == 0 and WOKEN_TAG not in {t["Key"] for t in g["Tags"]}


def test_health_checks_and_preflights_wake_nothing(world):  # noqa: F811
    _asleep(world)
    for path, method in (("/health", "GET"), ("/v1/chat/completions", "OPTIONS")):
        answer = _request(world, {}, path=path, method=method)
        assert answer["statusCode"] == 503 and answer["headers"]["Retry-After"]
    assert group(world)["DesiredCapacity"] == 0


def test_after_a_scale_in_a_keyless_caller_still_wakes_nothing(world):  # noqa: F811
    _asleep(world)
    _request(world, {"authorization": f"Bearer {KEY}"})  # woken
    world.autoscaling.set_desired_capacity(AutoScalingGroupName=GROUP, DesiredCapacity=0)  # scaled in again
    _asleep(world)
    assert _request(world, {})["statusCode"] == 401
    assert group(world)["DesiredCapacity"] == 0


def test_a_rotated_key_is_read_again(world, monkeypatch):  # noqa: F811
    _asleep(world)
    assert _request(world, {"authorization": "Bearer sk-rotated"})["statusCode"] == 401
    world.door.secrets.put_secret_value(SecretId=world.door.API_KEY_SECRET, SecretString="sk-rotated")
    now = world.door.time.monotonic()
    monkeypatch.setattr(world.door.time, "monotonic", lambda: now + world.door.KEY_RECHECK_S + 1)
    assert _request(world, {"authorization": "Bearer sk-rotated"})["statusCode"] == 503
    assert group(world)["DesiredCapacity"] == 1


def _throttled(*args, **kwargs):
    raise ClientError({"Error": {"Code": "Throttling", "Message": "Rate exceeded"}}, "SetDesiredCapacity")


@pytest.mark.parametrize("client", ["autoscaling", "secrets"])
def test_a_throttled_call_is_a_503_with_retry_after(world, monkeypatch, client):  # noqa: F811
    _asleep(world)
    world.door._keys.update(keys=(), read=float("-inf"))  # the key is read again, so its call can fail too
    target = getattr(world.door, client)
    for name in ("set_desired_capacity", "describe_auto_scaling_groups", "describe_target_health", "describe_rules",
                 "get_secret_value"):  # fmt: skip
        if hasattr(target, name):
            monkeypatch.setattr(target, name, _throttled)
    answer = _request(world, {"authorization": f"Bearer {KEY}"})
    assert answer["statusCode"] == 503 and answer["headers"]["Retry-After"] == str(world.door.AWS_RETRY_S)
    assert "could not start an instance just now" in json.loads(answer["body"])["error"]["message"]


@pytest.mark.parametrize("tag", ["inf", "nan"])
def test_a_hand_edited_woken_at_tag_does_not_crash_it(world, monkeypatch, tag):  # noqa: F811
    _asleep(world)
    _request(world, {"authorization": f"Bearer {KEY}"})  # woken: desired 1
    monkeypatch.setattr(world.door, "in_service", lambda g: [])  # still booting
    world.door.set_woken_at(tag)
    answer = _request(world, {"authorization": f"Bearer {KEY}"})
    assert answer["statusCode"] == 503 and 5 <= int(answer["headers"]["Retry-After"]) <= WAKE_S
