"""The front door of a group at zero (stacks/wake_door.py). One function, three callers:

- the load balancer, while the listener's rule sends requests here (no instance in service): a request with the API
  key gets 503 with Retry-After (the wake-up's expected time left) and an OpenAI-shaped error, and a group at zero is
  set to one instance at once (SetDesiredCapacity), the first request's wake-up time written on the group as a tag.
  A request without the key gets llama-server's own 401 and wakes nothing (the key is checked as llama-server checks
  it: Authorization, else X-Api-Key, one leading "Bearer "); a health check gets 503 and wakes nothing; when AWS
  throttles or fails a call, the answer is still a 503 with Retry-After, never the load balancer's bare 502;
- EC2 Auto Scaling's events for the group (EventBridge): an instance in service sends requests to the servers,
  the last one leaving sends them here;
- a schedule every few minutes, which does the same from the group's state (a lost event is put right).

Standard library and boto3 only (the Lambda runtime's). Logs one line per decision.
"""

import hmac
import json
import math
import os
import time

import boto3

GROUP = os.environ["GROUP_NAME"]
LISTENER = os.environ["LISTENER_ARN"]
SERVERS = os.environ["SERVERS_TARGET_GROUP_ARN"]
WAKE_S = int(os.environ["WAKE_S"])  # the profile's wake-up plan: launch (or start) to /health 200
WOKEN_TAG = os.environ["WOKEN_TAG"]  # epoch seconds of the wake-up in progress, on the group
API_KEY_SECRET = os.environ["API_KEY_SECRET_ARN"]  # the key llama-server checks (LLAMA_API_KEY: comma-separated)
KEY_TTL_S = 300  # a rotated key is read again after this long, or after a mismatch at most once a minute
KEY_RECHECK_S = 60
AWS_RETRY_S = 10  # Retry-After when AWS throttled or failed a call of the door's
PUBLIC_PATHS = ("/health", "/v1/health")
UNAUTHORIZED = {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
MIN_RETRY_S = 5  # never ask a client to come back sooner: the instance is not there yet
HEALTHY_WAIT_S = 60  # after an instance is in service, how long to wait for its target to pass the ALB's checks

autoscaling = boto3.client("autoscaling")
elbv2 = boto3.client("elbv2")
secrets = boto3.client("secretsmanager")
_keys: dict = {"keys": (), "read": -math.inf}


def handler(event, context):
    if "requestContext" in event and "elb" in event["requestContext"]:
        try:
            return request(event)
        except Exception as e:  # noqa: BLE001 - throttled or failed: the client is told when to come back
            print(f"wake door: {type(e).__name__}: {e}; answered 503")
            return answer(AWS_RETRY_S, "the service could not start an instance just now")
    if event.get("source") == "aws.autoscaling":
        return reconcile(wait_healthy=event.get("detail-type") == "EC2 Instance Launch Successful")
    return reconcile(wait_healthy=False)


def group():
    (g,) = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"]
    return g


def in_service(g) -> list[str]:
    return [i["InstanceId"] for i in g["Instances"] if i["LifecycleState"] == "InService"]


def healthy_targets() -> list[str]:
    described = elbv2.describe_target_health(TargetGroupArn=SERVERS)["TargetHealthDescriptions"]
    return [t["Target"]["Id"] for t in described if t["TargetHealth"]["State"] == "healthy"]


def the_rule() -> tuple[str, str, bool]:
    """The listener's rule that forwards to the servers and one other target group (the door): its ARN, the
    door's target group, and whether requests go to the door now."""
    for rule in elbv2.describe_rules(ListenerArn=LISTENER)["Rules"]:
        for action in rule["Actions"]:
            groups = action.get("ForwardConfig", {}).get("TargetGroups", [])
            weights = {t["TargetGroupArn"]: t.get("Weight", 1) for t in groups}
            if action["Type"] == "forward" and SERVERS in weights and len(weights) == 2:
                (door,) = set(weights) - {SERVERS}
                return rule["RuleArn"], door, weights[door] > 0
    raise RuntimeError(f"no rule on {LISTENER} forwards to {SERVERS} and a wake door")


def route(here: bool, why: str) -> None:
    rule, door, now_here = the_rule()
    if now_here == here:
        return
    groups = [{"TargetGroupArn": SERVERS, "Weight": 0 if here else 1}, {"TargetGroupArn": door, "Weight": int(here)}]
    elbv2.modify_rule(RuleArn=rule, Actions=[{"Type": "forward", "ForwardConfig": {"TargetGroups": groups}}])
    print(f"wake door: requests now go to the {'door' if here else 'servers'}: {why}")


def woken_at(g) -> float | None:
    """The tag's epoch seconds, when it is one: not inf, nan or a time in the future (a hand-edited tag)."""
    tags = {t["Key"]: t["Value"] for t in g.get("Tags", [])}
    try:
        value = float(tags[WOKEN_TAG])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) and 0 <= value <= time.time() + 60 else None


def credential(event) -> bytes:
    """What llama-server reads: Authorization, else X-Api-Key (ALB headers are lower-case), less one "Bearer "."""
    headers = {k.lower(): v for k, v in (event.get("headers") or {}).items()}
    for k, v in (event.get("multiValueHeaders") or {}).items():
        headers.setdefault(k.lower(), v[0] if v else "")
    given = (headers.get("authorization") or headers.get("x-api-key") or "").strip().encode()
    return given[len(b"Bearer ") :] if given.startswith(b"Bearer ") else given


def keys(refresh: bool = False) -> tuple:
    now = time.monotonic()
    age = now - _keys["read"]
    if not _keys["keys"] or age > KEY_TTL_S or (refresh and age > KEY_RECHECK_S):
        value = secrets.get_secret_value(SecretId=API_KEY_SECRET)["SecretString"]
        _keys.update(keys=tuple(k.strip().encode() for k in value.split(",") if k.strip()), read=now)
    return _keys["keys"]


def keyed(event) -> bool:
    given = credential(event)

    def match(candidates) -> bool:
        found = False
        for key in candidates:  # every key compared in constant time: no early exit to time
            found |= hmac.compare_digest(given, key)
        return found

    return bool(given) and (match(keys()) or match(keys(refresh=True)))


def set_woken_at(value: str) -> None:
    tag = {"ResourceId": GROUP, "ResourceType": "auto-scaling-group", "Key": WOKEN_TAG, "Value": value}
    autoscaling.create_or_update_tags(Tags=[{**tag, "PropagateAtLaunch": False}])


def reconcile(*, wait_healthy: bool) -> dict:
    g = group()
    serving = in_service(g)
    if not serving:
        route(True, f"no instance in service (desired {g['DesiredCapacity']})")
        return {"routed": "door", "in_service": 0}
    deadline = time.monotonic() + (HEALTHY_WAIT_S if wait_healthy else 0)
    while not set(healthy_targets()) & set(serving) and time.monotonic() < deadline:
        time.sleep(5)
    # With no healthy target the ALB sends to every registered one (fail open): the servers are still the answer.
    route(False, f"{len(serving)} instance(s) in service")
    if woken_at(g) is not None:
        set_woken_at("")
    return {"routed": "servers", "in_service": len(serving)}


def request(event) -> dict:
    if (event.get("path") or "/") in PUBLIC_PATHS or event.get("httpMethod") == "OPTIONS":
        return answer(MIN_RETRY_S, "no instance is in service; a request without the key wakes nothing")
    if not keyed(event):
        return unauthorized()
    g = group()
    if in_service(g) and healthy_targets():
        route(False, "a request found a healthy instance")
        return answer(MIN_RETRY_S, "an instance has just come into service")
    now = time.time()
    since = woken_at(g)
    if g["DesiredCapacity"] == 0:
        if g["MaxSize"] < 1:
            return answer(WAKE_S, "the group is held at zero (its maximum is 0, e.g. off hours without a wake-up)")
        autoscaling.set_desired_capacity(AutoScalingGroupName=GROUP, DesiredCapacity=1, HonorCooldown=False)
        set_woken_at(str(int(now)))
        since = now
        print(f"wake door: {event.get('httpMethod')} {event.get('path')} woke {GROUP} (desired 0 -> 1)")
    left = WAKE_S - (now - since) if since is not None else WAKE_S
    return answer(max(MIN_RETRY_S, int(left)), "the service is starting an instance")


def unauthorized() -> dict:
    return {
        "statusCode": 401,
        "statusDescription": "401 Unauthorized",
        "isBase64Encoded": False,
        "headers": {"Content-Type": "application/json; charset=utf-8", "Cache-Control": "no-store"},
        "body": json.dumps(UNAUTHORIZED, separators=(",", ":")),
    }


def answer(retry_after: int, why: str) -> dict:
    message = f"{why}; retry in about {retry_after} s"
    body = {"error": {"message": message, "type": "service_unavailable", "code": "waking"}}
    return {
        "statusCode": 503,
        "statusDescription": "503 Service Unavailable",
        "isBase64Encoded": False,
        "headers": {"Content-Type": "application/json", "Retry-After": str(retry_after), "Cache-Control": "no-store"},
        "body": json.dumps(body),
    }
