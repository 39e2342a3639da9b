"""The EKS pod, rehearsed under Docker from its own manifest (stacks/eks/manifests.py), by the kubelet stand-in of
tests/rehearsal/pod.py: the API key from Secrets Manager and the GGUF (S3 cache first, then ModelScope, sha256
verified) by the init containers, llama-server as a sidecar held back by its startup probe, the hop ready, a stream
running, then the pod's termination: the hop's preStop drain, SIGTERM, the grace period. Zero streams cut.

The pod's network is its own loopback: moto (Secrets Manager, S3) and the local ModelScope stand-in serve there, so
nothing is reached outside the pod. The model is the real Gemma 3 270M GGUF; the image is the x86-64 CPU image the
image tier builds (tests/rehearsal/conftest.py). What stands in for the cluster: endpoint and credential variables
(on EKS, IAM roles for service accounts inject AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE instead).
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import replace

import pytest

from stacks.eks.manifests import WorkloadDeploy, serving_objects
from stacks.eks.workload import ServingWorkload
from tests.committed import local_profile
from tests.rehearsal.pod import PodRun

pytestmark = [pytest.mark.rehearsal, pytest.mark.slow, pytest.mark.timeout(3600)]

SECRET = "gguf-serve-api-key"
BUCKET = "gguf-serve-model-cache"
KEY = "rehearsal-key-0123456789"
DRAIN_DEADLINE_S = 240  # the rehearsal's: a Gemma answer takes seconds (on a loaded machine, tens), not minutes


# Long enough to still run when the pod's preStop drain starts, on any host ('"finished": 1'): the drain starts after
# the node left its target group and the load balancer's nodes caught up (kube/targets.py SETTLE_S, 5 s); 1024
# tokens last 12 s where Gemma 3 270M decodes 87 tok/s (256 ended before the drain began there).
STREAM_TOKENS = 1024


def _stream(port: int, max_tokens: int) -> dict:
    """A streamed chat from inside the pod: the bytes, and when the first and last arrived."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = {"messages": [{"role": "user", "content": "Count from one to two hundred in words."}],
            "max_tokens": max_tokens, "stream": True, "ignore_eos": True}  # fmt: skip
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Authorization": f"Bearer {KEY}"})
    answer = conn.getresponse()
    seen, first = b"", None
    while chunk := answer.read1(65536):
        first = first or time.monotonic()
        seen += chunk
    return {"status": answer.status, "body": seen, "first": first, "last": time.monotonic()}


def _request(
    port: int, method: str, path: str, body: dict | None = None, *, key: bool = True
) -> tuple[int, dict[str, str]]:  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, json.dumps(body) if body else None, {"Authorization": f"Bearer {KEY}"} if key else {})
    answer = conn.getresponse()
    answer.read()
    return answer.status, dict(answer.getheaders())


def test_the_pod_fetches_serves_and_drains_with_zero_cut_streams(serving_image, gemma_gguf, tmp_path):
    from gguf_serve.local.hub import LocalScope
    from tests.rehearsal.aws import AwsStandIn
    from tests.rehearsal.tls import ensure_ca, server_certificate

    profile = local_profile()
    workload = replace(ServingWorkload.of(profile), drain_deadline_s=DRAIN_DEADLINE_S)
    deploy = WorkloadDeploy(
        image=serving_image, architecture="amd64", region="cn-northwest-1", api_key_secret_arn=SECRET,
        model_cache_url=f"s3://{BUCKET}/models/", service_account="rehearsal", node_port=30080,
    )  # fmt: skip
    # The profile's target group as the stack passes it: a deploy-time value (a CloudFormation reference), here the
    # one moto makes below, filled in as CloudFormation fills in a reference.
    deploy = replace(deploy, target_group_arn=TARGET_GROUP_TOKEN)
    runtime, deployment, _, _ = serving_objects(workload, deploy)
    spec = deployment["spec"]["template"]["spec"]
    pod = PodRun(spec, {runtime["metadata"]["name"]: runtime["data"]}, tmp_path)
    hub = aws = None
    try:
        pod.create(serving_image)
        tls = tmp_path / "tls"
        certificate = server_certificate(ensure_ca(tls / "ca"), ["localhost"], tls)
        aws = pod.in_pod(lambda: AwsStandIn(certificate))  # moto on the pod's loopback
        elbv2 = aws.client("elbv2")
        node, group = pod.in_pod(lambda: _node_and_target_group(aws, deploy.node_port))
        pod.spec = json.loads(json.dumps(pod.spec).replace(TARGET_GROUP_TOKEN, group))
        spec = pod.spec
        pod.host_ip = node["PrivateIpAddress"]
        hub = pod.in_pod(lambda: LocalScope().start())
        hub.add_file(profile.model.repo, profile.model.file, gemma_gguf)
        secrets, s3 = aws.client("secretsmanager"), aws.client("s3")  # called from the pod's network only
        pod.in_pod(lambda: secrets.create_secret(Name=SECRET, SecretString=KEY))
        location = {"LocationConstraint": "cn-northwest-1"}
        pod.in_pod(lambda: s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration=location))
        pod.cluster_env = {
            "AWS_ENDPOINT_URL": aws.url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "MODELSCOPE_ENDPOINT": hub.url,
        }  # fmt: skip

        init = {c["name"]: c for c in spec["initContainers"]}
        assert "API key written" in pod.run_init(init["api-key"], timeout=120)
        fetched = pod.run_init(init["fetch"], timeout=600)
        assert "model ready" in fetched, fetched[-2000:]
        cached = pod.in_pod(lambda: s3.list_objects_v2(Bucket=BUCKET)).get("Contents", [])
        assert [o["Size"] for o in cached] == [profile.model.size_bytes], "the fresh download was written back to S3"

        pod.start(init["llama"])  # a sidecar: the main container waits for its startup probe
        pod.probe(init["llama"], "startupProbe")
        [hop] = spec["containers"]
        pod.start(hop)  # its postStart hook puts the node in the target group
        targets_started = pod.in_pod(lambda: _targets(elbv2, group))
        pod.probe(hop, "readinessProbe")
        port = workload.port

        status, _ = pod.in_pod(
            lambda: _request(port, "POST", "/v1/chat/completions", {"messages": [], "max_tokens": 1})
        )
        assert status != 401, status  # the key from Secrets Manager reached llama-server
        streaming, result = pod.spawn_in_pod(lambda: _stream(port, max_tokens=STREAM_TOKENS))
        deadline = time.monotonic() + 60
        while pod.in_pod(lambda: _health_in_flight(port)) == 0:
            assert time.monotonic() < deadline and streaming.is_alive(), result
            time.sleep(0.05)
        pod.log("a stream is running")
        # A keyless client beside the keyed one (hostile input, round 4): 401 at the head from the hop started by the
        # manifest's own flags, no admission place taken, nothing shed (what the scaler would add a pod for).
        from gguf_serve.container.hop.names import SHED

        shed_before = pod.in_pod(lambda: _hop_counter(port, SHED))
        ask = {"messages": [], "max_tokens": 1}
        keyless = pod.in_pod(lambda: [_request(port, "POST", "/v1/chat/completions", ask, key=False)[0]
                                      for _ in range(50)])  # fmt: skip
        keyless_after = {"statuses": set(keyless), "shed": pod.in_pod(lambda: _hop_counter(port, SHED)) - shed_before}
        pod.log(f"50 keyless requests: {sorted(keyless_after['statuses'])}, shed +{keyless_after['shed']}")

        during: dict = {}

        def watch_drain() -> None:  # while the pod terminates: /health and a new request answer 503
            until = time.monotonic() + 30
            while time.monotonic() < until and "health" not in during:
                status, _ = _request(port, "GET", "/health")
                if status == 503:
                    during["targets"] = _targets(elbv2, group)  # the moment the pod stops taking requests
                    during["health"] = status
                    during["new"] = _request(port, "POST", "/v1/chat/completions", {"messages": [], "max_tokens": 1})
                time.sleep(0.05)

        watcher, _ = pod.spawn_in_pod(watch_drain)
        outcome = pod.terminate()
        streaming.join(120)
        watcher.join(30)
        targets_ended = pod.in_pod(lambda: _targets(elbv2, group))
    finally:
        print("\n".join(f"{e.at:7.2f}s  {e.what}" for e in pod.events))
        logs = {name: pod.logs(name)[-3000:] for name in pod.containers}
        pod.remove()
        if hub is not None:
            hub.stop()
        if aws is not None:
            aws.close()

    assert keyless_after == {"statuses": {401}, "shed": 0}, keyless_after
    # The node joined its target group at the start and left it before the drain began (lb-leave, then the drain).
    assert targets_started == [(node["InstanceId"], deploy.node_port)], (targets_started, pod.post_start)
    assert targets_ended == [], targets_ended
    assert during.get("targets") == [], during  # out of the load balancer before it answered 503
    assert "deregistered: no new request reaches it" in outcome["prestop"]["hop"][1], outcome["prestop"]
    code, printed = outcome["prestop"]["hop"]
    assert "value" in result, (result.get("error"), printed, logs)
    stream = result["value"]
    assert stream["status"] == 200 and stream["body"].endswith(b"data: [DONE]\n\n"), (stream, logs)
    assert stream["body"].count(b'"content"') >= STREAM_TOKENS  # the whole answer: every token it asked for
    assert code == 0 and '"cut": 0' in printed and '"finished": 1' in printed, (printed, logs)
    assert (
        during.get("health") == 503
        and during["new"][0] == 503
        and "retry-after" in {k.lower() for k in during["new"][1]}
    ), during
    assert outcome["killed"] == [], outcome  # everything stopped within the grace period: no SIGKILL
    assert outcome["exit"] == {"hop": 0, "llama": 0}, (outcome, logs)
    assert outcome["seconds"] < spec["terminationGracePeriodSeconds"]
    assert stream["last"] > stream["first"]
    print(json.dumps({"termination_s": outcome["seconds"], "grace_s": spec["terminationGracePeriodSeconds"],
                      "stream_s": round(stream["last"] - stream["first"], 2), "drain": printed.strip()}))  # fmt: skip


TARGET_GROUP_TOKEN = "<ProfileTargetGroupArn>"


def _node_and_target_group(aws, port: int) -> tuple[dict, str]:
    """The pod's node (an instance with its private IP) and the profile's target group, in moto."""
    ec2, elbv2 = aws.client("ec2"), aws.client("elbv2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
    image = ec2.describe_images()["Images"][0]["ImageId"]  # one of moto's own
    [node] = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, SubnetId=subnet)["Instances"]
    group = elbv2.create_target_group(Name="intel-moe", Protocol="HTTP", Port=port, VpcId=vpc, TargetType="instance")
    return node, group["TargetGroups"][0]["TargetGroupArn"]


def _targets(elbv2, group: str) -> list[tuple[str, int]]:
    """The group's targets that take new requests (a draining one does not)."""
    health = elbv2.describe_target_health(TargetGroupArn=group)["TargetHealthDescriptions"]
    return [(t["Target"]["Id"], t["Target"]["Port"]) for t in health if t["TargetHealth"]["State"] != "draining"]


def _hop_counter(port: int, name: str) -> float:
    """A counter or gauge of the hop's /metrics (read with the key), 0 when it has no sample yet."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    text = conn.getresponse().read().decode()
    return next((float(x.split()[-1]) for x in text.splitlines() if x.split(" ")[0] == name), 0.0)


def _health_in_flight(port: int) -> int:
    """Slot-taking requests the hop has in flight (its own gauge on /metrics)."""
    from gguf_serve.container.hop import names as hop_names

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    text = conn.getresponse().read().decode()
    line = next((x for x in text.splitlines() if x.startswith(hop_names.IN_FLIGHT + " ")), f"x {0}")
    return int(float(line.split()[1]))
