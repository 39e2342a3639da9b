"""The drain through the real hop in front of a real llama-server, with the rehearsal's IMDS stand-in setting the
notices EC2 would and moto (behind the rehearsal's recorder) taking the lifecycle and metric calls.

A Spot notice: a stream already running completes, /health and new requests answer 503 + Retry-After, the counts
reach CloudWatch. A stream still running at the notice's deadline is counted cut. A scale-in: heartbeats while the
slot is busy, CONTINUE once it is idle. A first boot into the warm pool and a rebalance recommendation do not drain.
"""

from __future__ import annotations

import datetime
import http.client
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from gguf_serve.container.hop import names as hop_names
from gguf_serve.container.hop.drain import (
    PUBLISH_MARGIN_S,
    REBALANCE,
    SPOT_ACTION,
    TARGET_STATE,
    Drainer,
    DrainSettings,
)
from gguf_serve.container.hop.proxy import ProxyServer
from gguf_serve.container.metrics import names
from gguf_serve.container.names import DRAIN_HOOK
from tests.rehearsal.aws import AwsStandIn
from tests.rehearsal.imds import Imds, Instance
from tests.rehearsal.tls import ensure_ca, server_certificate

pytestmark = [pytest.mark.e2e]  # a real llama-server behind the hop (local_server)

REGION = "cn-northwest-1"
GROUP = "DrainStack-ServingGroup-0123456789AB"
NAMESPACE = "GgufServe/DrainTest"


@pytest.fixture(scope="module")
def aws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AwsStandIn]:
    tls = tmp_path_factory.mktemp("tls")
    stand_in = AwsStandIn(server_certificate(ensure_ca(tls / "ca"), ["localhost"], tls))
    asg = stand_in.client("autoscaling")
    asg.create_launch_configuration(
        LaunchConfigurationName="drain-lc", ImageId="ami-0123456789abcdef0", InstanceType="c8i.4xlarge"
    )
    asg.create_auto_scaling_group(
        AutoScalingGroupName=GROUP, LaunchConfigurationName="drain-lc", MinSize=0, MaxSize=0,
        AvailabilityZones=[f"{REGION}a"],
    )  # fmt: skip
    asg.put_lifecycle_hook(
        AutoScalingGroupName=GROUP, LifecycleHookName=DRAIN_HOOK, HeartbeatTimeout=180, DefaultResult="CONTINUE",
        LifecycleTransition="autoscaling:EC2_INSTANCE_TERMINATING",
    )  # fmt: skip
    yield stand_in
    stand_in.close()


_ids = iter(range(1, 1000))


@pytest.fixture
def instance() -> Iterator[tuple[Instance, Imds]]:
    inst = Instance(f"i-0d{next(_ids):015d}", GROUP, REGION, "drain-role", user_data="")
    imds = Imds(inst)
    yield inst, imds
    imds.close()


# A stream that is still running when the drain starts and for several heartbeats after, on any host: 64 tokens
# took 0.7 s on a host where Gemma 3 270M decodes 87 tok/s, shorter than one 1 s heartbeat after the drain began
# (a heartbeat test failed there); 256 tokens last 3 s there and 13 s at 20 tok/s.
LONG_STREAM_TOKENS = 256
HEARTBEAT_S = 0.25


@pytest.fixture(name="drain_hop")
def drain_hop_fixture(make_hop, local_server, aws: AwsStandIn, instance):  # noqa: ANN201
    """drain_hop(**DrainSettings): the package's make_hop in front of the real llama-server, with a drain watch on
    the IMDS stand-in and moto."""
    _, imds = instance

    def make(**settings) -> ProxyServer:
        defaults = {"poll_s": 0.1, "hook": DRAIN_HOOK, "namespace": NAMESPACE, "region": REGION}
        drainer = Drainer(
            DrainSettings(imds_url=f"http://127.0.0.1:{imds.port}", **{**defaults, **settings}), aws=aws.client
        )
        return make_hop(local_server[0], drainer=drainer)

    return make


@dataclass
class Stream:
    """One streamed chat completion read on its own thread: tokens as they come, whether [DONE] arrived."""

    tokens: int = 0
    status: int = 0
    done: bool = False
    first: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    ended_at: float = 0.0


def _stream(hop: ProxyServer, key: str, max_tokens: int) -> Stream:
    s = Stream()

    def read() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", hop.server_address[1], timeout=120)
        body = {
            "messages": [{"role": "user", "content": "Count from one to one thousand, one number a line."}],
            "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "stream": True,
        }  # fmt: skip
        try:
            conn.request("POST", "/v1/chat/completions", json.dumps(body), _headers(key))
            r = conn.getresponse()
            s.status = r.status
            for line in r:
                if line.startswith(b"data: [DONE]"):
                    s.done = True
                elif line.startswith(b"data: ") and b'"content"' in line:
                    s.tokens += 1
                    s.first.set()
        except OSError:
            pass
        finally:
            s.ended_at = time.time()
            s.ended.set()
            s.first.set()
            conn.close()

    threading.Thread(target=read, daemon=True).start()
    return s


def _headers(key: str) -> dict[str, str]:
    return {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}


def _request(hop: ProxyServer, method: str, path: str, key: str, body: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", hop.server_address[1], timeout=30)
    conn.request(method, path, json.dumps(body) if body is not None else None, _headers(key))
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), data


def _until(predicate, timeout: float, what: str) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def _hop_metrics(hop: ProxyServer, key: str) -> dict[str, float]:
    """The hop's own unlabelled families from GET /metrics."""
    status, _, body = _request(hop, "GET", "/metrics", key)
    assert status == 200
    values = {}
    for line in body.decode().splitlines():
        name, _, value = line.partition(" ")
        if name.startswith(hop_names.PREFIX) and "{" not in name and value:
            values[name] = float(value)
    return values


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _metric_sum(aws: AwsStandIn, metric: str, instance_id: str) -> float:
    cw = aws.client("cloudwatch")
    now = datetime.datetime.now(datetime.UTC)
    stats = cw.get_metric_statistics(
        Namespace=NAMESPACE, MetricName=metric, StartTime=now - datetime.timedelta(minutes=10),
        EndTime=now + datetime.timedelta(minutes=1), Period=60, Statistics=["Sum"],
        Dimensions=[{"Name": names.DIM_GROUP, "Value": GROUP}, {"Name": names.DIM_INSTANCE, "Value": instance_id}],
    )  # fmt: skip
    return sum(p["Sum"] for p in stats["Datapoints"])


def test_a_stream_started_before_a_spot_notice_completes_and_new_requests_get_503(
    drain_hop, local_server, instance, aws, caplog
):
    caplog.set_level(logging.INFO, logger="gguf-serve-hop")
    inst, _ = instance
    key = local_server[1]
    hop = drain_hop()
    assert _request(hop, "GET", "/health", key)[0] == 200
    assert _hop_metrics(hop, key)[hop_names.DRAINING] == 0 and hop_names.DRAIN_STREAMS_CUT not in _hop_metrics(hop, key)
    stream = _stream(hop, key, max_tokens=LONG_STREAM_TOKENS)
    assert stream.first.wait(60) and stream.status == 200
    notice_at = time.time()
    inst.notices[SPOT_ACTION] = json.dumps({"action": "terminate", "time": _iso(notice_at + 120)})
    _until(lambda: hop.drain is not None, 5, "the hop to see the notice")

    status, headers, _ = _request(hop, "GET", "/health", key)
    assert status == 503 and int(headers["retry-after"]) >= 1  # the target group stops choosing this instance
    status, headers, body = _request(hop, "POST", "/v1/chat/completions", key, {"messages": [], "max_tokens": 1})
    assert status == 503 and int(headers["retry-after"]) >= 1
    assert json.loads(body)["error"]["type"] == "unavailable_error"
    assert _request(hop, "GET", "/v1/models", key)[0] == 200  # only slot-taking requests are refused

    assert stream.ended.wait(120) and stream.done and stream.tokens > 0  # the whole answer, [DONE] included
    _until(lambda: hop.drain.done, 10, "the drain to end")
    drain = hop.drain
    print(
        f"\nspot notice: {drain.finished} stream completed, {drain.cut} cut, {drain.refused} refused 503; "
        f"{stream.tokens} tokens; drain took {drain.ended - drain.started:.1f} s of the 120 s notice"
    )
    assert (drain.finished, drain.cut, drain.broken, drain.refused) == (1, 0, 0, 1)
    assert drain.ended < notice_at + 120
    seen = _hop_metrics(hop, key)  # what a Prometheus scrape of the instance sees
    assert (seen[hop_names.DRAINING], seen[hop_names.DRAIN_REFUSED], seen[hop_names.DRAIN_STREAMS_CUT]) == (1, 1, 0)
    assert "drain (spot terminate): 1 streams finished, 0 cut" in caplog.text
    _until(lambda: _metric_sum(aws, names.DRAIN_STREAMS_FINISHED, inst.instance_id) == 1, 10, "PutMetricData")
    assert _metric_sum(aws, names.DRAIN_STREAMS_CUT, inst.instance_id) == 0
    assert _metric_sum(aws, names.DRAINS, inst.instance_id) == 1


def test_a_stream_still_running_at_the_spot_deadline_is_counted_cut(drain_hop, local_server, instance, aws):
    inst, _ = instance
    key = local_server[1]
    hop = drain_hop()
    stream = _stream(hop, key, max_tokens=4000)
    assert stream.first.wait(60)
    inst.notices[SPOT_ACTION] = json.dumps({"action": "terminate", "time": _iso(time.time() + PUBLISH_MARGIN_S + 2)})
    _until(lambda: hop.drain is not None and hop.drain.done, 15, "the drain to end at its deadline")
    drain = hop.drain
    print(f"\nspot deadline: {drain.finished} completed, {drain.cut} cut (the stream had {stream.tokens} tokens)")
    assert not stream.ended.is_set(), "the stream ended before the deadline: make it longer"
    assert (drain.finished, drain.cut) == (0, 1)
    _until(lambda: _metric_sum(aws, names.DRAIN_STREAMS_CUT, inst.instance_id) == 1, 10, "PutMetricData")


def test_after_a_spot_drain_the_group_taking_the_instance_completes_the_hook_at_once(drain_hop, instance, aws):
    inst, _ = instance
    inst.notices[TARGET_STATE] = "InService"
    hop = drain_hop()
    _until(lambda: hop.drainer.seen_in_service, 5, "InService")
    inst.notices[SPOT_ACTION] = json.dumps({"action": "terminate", "time": _iso(time.time() + 120)})
    _until(lambda: hop.drain is not None and hop.drain.done, 5, "the (idle) Spot drain to end")
    inst.notices[TARGET_STATE] = "Terminated"  # EC2 Auto Scaling replaces the interrupted instance
    _until(lambda: hop.drainer.completed_hook, 5, "CompleteLifecycleAction")
    (done,) = aws.recorder.of("CompleteLifecycleAction", InstanceId=inst.instance_id, LifecycleHookName=DRAIN_HOOK)
    assert done.params["LifecycleActionResult"] == "CONTINUE"


def test_scale_in_waits_for_a_busy_slot_with_heartbeats_then_continues(drain_hop, local_server, instance, aws):
    inst, _ = instance
    key = local_server[1]
    inst.notices[TARGET_STATE] = "InService"
    hop = drain_hop(heartbeat_s=HEARTBEAT_S, deadline_s=300)
    stream = _stream(hop, key, max_tokens=LONG_STREAM_TOKENS)
    assert stream.first.wait(60)
    _until(lambda: hop.drainer.seen_in_service, 5, "the hop to read InService")
    inst.notices[TARGET_STATE] = "Terminated"  # the group chose this instance for scale-in
    _until(lambda: hop.drain is not None, 5, "the drain")
    assert _request(hop, "GET", "/health", key)[0] == 503
    assert stream.ended.wait(180) and stream.done
    _until(lambda: hop.drainer.completed_hook, 10, "CompleteLifecycleAction")
    calls = aws.recorder
    beats = calls.of("RecordLifecycleActionHeartbeat", InstanceId=inst.instance_id, LifecycleHookName=DRAIN_HOOK)
    (done,) = calls.of("CompleteLifecycleAction", InstanceId=inst.instance_id, LifecycleHookName=DRAIN_HOOK)
    took = stream.ended_at - hop.drain.started
    print(f"\nscale-in: {len(beats)} heartbeats over {took:.1f} s of a busy slot, then CONTINUE; "
          f"{hop.drain.finished} completed, {hop.drain.cut} cut")  # fmt: skip
    assert done.params["LifecycleActionResult"] == "CONTINUE" and done.params["AutoScalingGroupName"] == GROUP
    assert took > 2 * HEARTBEAT_S, "the stream ended within two heartbeats of the drain's start: make it longer"
    assert beats and all(b.at <= done.at for b in beats)
    assert done.at >= stream.ended_at - 0.5  # not before the stream's end (the recorder's clock is the same)
    assert (hop.drain.finished, hop.drain.cut) == (1, 0)


def test_an_idle_instance_leaving_the_group_continues_at_once(drain_hop, local_server, instance, aws):
    inst, _ = instance
    inst.notices[TARGET_STATE] = "InService"
    hop = drain_hop(heartbeat_s=0.5)
    _until(lambda: hop.drainer.seen_in_service, 5, "InService")
    inst.notices[TARGET_STATE] = "Warmed:Stopped"  # scale-in back into the warm pool (reuse_on_scale_in)
    _until(lambda: hop.drainer.completed_hook, 5, "CompleteLifecycleAction")
    assert not aws.recorder.of("RecordLifecycleActionHeartbeat", InstanceId=inst.instance_id)
    assert (hop.drain.finished, hop.drain.cut) == (0, 0)


def test_standby_drains_without_the_hook_and_the_return_to_service_serves_again(drain_hop, local_server, instance, aws):
    inst, _ = instance
    key = local_server[1]
    inst.notices[TARGET_STATE] = "InService"
    hop = drain_hop(heartbeat_s=0.5)
    _until(lambda: hop.drainer.seen_in_service, 5, "InService")
    inst.notices[TARGET_STATE] = "Standby"  # EnterStandby: the ALB deregisters it; no lifecycle hook holds it
    _until(lambda: hop.drain is not None and hop.drain.done, 10, "the Standby drain to end")
    assert _request(hop, "POST", "/v1/chat/completions", key, {"messages": [], "max_tokens": 1})[0] == 503
    inst.notices[TARGET_STATE] = "InService"  # ExitStandby
    _until(lambda: hop.drain is None, 10, "the hop to serve again")
    assert _request(hop, "GET", "/health", key)[0] == 200
    status, _, body = _request(
        hop, "POST", "/v1/chat/completions", key, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    )
    assert status == 200, body
    seen = _hop_metrics(hop, key)
    assert (seen[hop_names.DRAINING], seen[hop_names.DRAIN_REFUSED]) == (0, 1)  # the counter keeps its count
    assert not aws.recorder.of("CompleteLifecycleAction", InstanceId=inst.instance_id)
    assert not aws.recorder.of("RecordLifecycleActionHeartbeat", InstanceId=inst.instance_id)
    inst.notices[TARGET_STATE] = "Terminated"  # and a later scale-in drains again, through the hook
    _until(lambda: hop.drainer.completed_hook, 10, "CompleteLifecycleAction")


def test_a_first_boot_into_the_warm_pool_and_a_rebalance_recommendation_do_not_drain(
    drain_hop, local_server, instance, caplog
):
    caplog.set_level(logging.INFO, logger="gguf-serve-hop")
    inst, imds = instance
    inst.notices[TARGET_STATE] = "Warmed:Stopped"  # what a warm-pool instance reads while its user data runs
    inst.notices[REBALANCE] = json.dumps({"noticeTime": _iso(time.time())})
    hop = drain_hop()
    _until(lambda: sum(1 for _, path, _ in imds.requests if path.endswith(TARGET_STATE)) >= 5, 10, "polls")
    assert hop.drain is None
    assert _request(hop, "GET", "/health", local_server[1])[0] == 200  # the ready unit can release the launch hook
    assert "capacity rebalancing launches a replacement first" in caplog.text
    tokens = [path for method, path, _ in imds.requests if method == "PUT"]
    assert len(tokens) == 1  # one IMDSv2 token for all polls


def test_boot_script_runs_the_hop_with_the_drain_watch():
    """The rendered unit passes what the drain needs; the deadline is the fleet's (one source of truth)."""
    from tests.committed import PROFILES
    from tests.userdata.test_boot_script import BOOT
    from userdata import InstanceSpec, render_user_data

    for p in PROFILES.values():
        text = render_user_data(InstanceSpec.of(p), BOOT)
        assert f"--drain-imds http://169.254.169.254 --drain-deadline {p.fleet.drain.deadline_s} " in text, p.name
    assert all(p.fleet.load_balancer.deregistration_delay_s >= p.fleet.drain.deadline_s for p in PROFILES.values())
