"""An instance boot rehearsed end to end: the real rendered user data, run unmodified by systemd in a fake
instance with its own Docker engine, pulling the image the image tier builds, against the stand-ins.

One fake instance boots cold and is then killed into, stopped and started, and started as a stale release; a
second boots from the S3 cache; two more fail on purpose (ECR login, the MTP refusal). Timings go to
~/.cache/gguf-serve/rehearsal/timings.json for docs/rehearsal.md.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from gguf_serve.container.metrics import names as fleet_names
from gguf_serve.container.server import Speculative
from stacks.fleet import GROUP_LOGICAL_ID, READY_HOOK, release_parameter_name
from tests.rehearsal.aws import iam_action
from tests.rehearsal.harness import GROUP, STACK, STATE, World
from tests.rehearsal.imds import ROLE_ACCESS_KEY
from tests.rehearsal.tiny_mtp import artifact, with_gpu_speculation, write
from userdata import InstanceSpec, render_user_data

pytestmark = [pytest.mark.rehearsal, pytest.mark.slow, pytest.mark.timeout(1800)]

STEPS = [
    "container runtime and CloudWatch agent",
    "server configuration",
    "image ",
    "model ",
    "systemd units gguf-serve-llama and gguf-serve-hop",
    "readiness and metrics units",
    "healthy; boot complete",
]
TIMINGS: dict[str, object] = {}


@pytest.fixture(scope="module")
def world(serving_image, gemma_gguf):
    with World(serving_image, gemma_gguf) as w:
        TIMINGS["image_compressed_bytes"] = w.registry.compressed_bytes
        TIMINGS["model_bytes"] = w.profile.model.size_bytes
        yield w
    STATE.mkdir(parents=True, exist_ok=True)
    (STATE / "timings.json").write_text(json.dumps(TIMINGS, indent=1))


def _steps(instance) -> dict[str, float]:
    return {t.step: round(t.at, 1) for t in instance.step_times()}


def _health(instance) -> str:
    return instance.sh("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8080/health").stdout


def _signals(world, instance, status: str | None = None):
    params = {"UniqueId": instance.instance_id, **({"Status": status} if status else {})}
    return world.aws.recorder.of("SignalResource", **params)


def _lifecycle(world, instance, result: str | None = None):
    """The instance's completions of its launch hook (the legacy hook's refused completion is not one)."""
    params = {"InstanceId": instance.instance_id, "LifecycleHookName": READY_HOOK}
    params |= {"LifecycleActionResult": result} if result else {}
    return world.aws.recorder.of("CompleteLifecycleAction", **params)


def _model_key(world) -> str:
    listed = world.aws.client("s3").list_objects_v2(Bucket=world.boot.model_cache_url.split("/")[2])
    keys = [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(world.profile.model.file)]
    assert len(keys) == 1, listed
    return keys[0]


def _model_gets(world) -> int:
    return len(
        [c for c in world.aws.recorder.calls if c.action.startswith("GET /") and world.profile.model.file in c.action]
    )


@pytest.fixture(scope="module")
def cold(world):
    a = world.instance("i-0a00000000000c01d")
    a.start()
    TIMINGS["cold_result"] = a.wait_boot_done(timeout=900)
    TIMINGS["cold_steps"] = _steps(a)
    TIMINGS["cold_fetch_log"] = [line for line in a.boot_log().splitlines() if " modelfetch " in line]
    return a


def test_boot_steps_log_in_order(cold):
    assert TIMINGS["cold_result"] == "run-user-data: user data exited 0", cold.diagnostics()
    lines = [
        line.removeprefix("gguf-serve-boot: ")
        for line in cold.boot_log().splitlines()
        if line.startswith("gguf-serve-boot: ")
    ]
    assert len(lines) == len(STEPS), lines
    for line, step in zip(lines, STEPS, strict=True):
        assert line.startswith(step), lines
    times = [t.at for t in cold.step_times()]
    assert times == sorted(times)


def test_model_fetched_verified_and_written_back_to_the_s3_cache(world, cold):
    log = cold.boot_log()
    assert "S3 cache miss" in log and "from http://169.254.100.3" in log, log  # then ModelScope
    assert world.hub.stats.downloads(), "nothing was downloaded from the ModelScope stand-in"
    model = world.profile.model
    head = world.aws.client("s3").head_object(Bucket=world.boot.model_cache_url.split("/")[2], Key=_model_key(world))
    assert head["ContentLength"] == model.size_bytes
    on_disk = cold.sh(f"sha256sum /opt/gguf-serve/models/{model.local_name}").stdout.split()[0]
    assert on_disk == model.sha256


def test_llama_server_is_healthy_through_the_real_image(world, cold):
    assert _health(cold) == "200"
    for container in ("llama", "hop"):  # the hop in front on the server port, the same image and user
        image = cold.sh(f"docker inspect -f '{{{{.Config.Image}}}} {{{{.Config.User}}}}' {container}").stdout.split()
        assert image == [world.boot.image_uri, "10001"], container
    chat = _chat(world, cold)
    reply = json.loads(chat)
    assert reply["usage"]["completion_tokens"] > 0, chat
    denied = cold.sh("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8080/v1/models").stdout
    assert denied == "401"  # the key from Secrets Manager is the one the server holds


def _chat(world, cold) -> str:
    """One chat through the server port (the hop) with the key from Secrets Manager; the raw answer."""
    return cold.sh(
        "curl -s -H 'Authorization: Bearer " + world.api_key + "' -H 'Content-Type: application/json' "
        '-d \'{"messages":[{"role":"user","content":"Say hello."}],"max_tokens":8}\' '
        "http://127.0.0.1:8080/v1/chat/completions",
        timeout=120,
    ).stdout


def test_lifecycle_action_continue_and_stack_success_are_recorded(world, cold):
    (action,) = _lifecycle(world, cold)
    assert action.params["LifecycleActionResult"] == "CONTINUE"
    assert action.params["AutoScalingGroupName"] == GROUP and action.params["LifecycleHookName"] == READY_HOOK
    (signal,) = _signals(world, cold)
    assert signal.params["Status"] == "SUCCESS"
    assert signal.params["StackName"] == STACK and signal.params["LogicalResourceId"] == GROUP_LOGICAL_ID


def test_metrics_reach_cloudwatch(world, cold):
    cloudwatch = world.aws.client("cloudwatch")

    def published():
        metrics = cloudwatch.list_metrics(Namespace=world.boot.metrics_namespace)["Metrics"]
        return [m for m in metrics if {"Name": "AutoScalingGroupName", "Value": GROUP} in m["Dimensions"]]

    metrics = cold.wait(published, 150, "no metrics in CloudWatch", interval=5)
    assert {m["MetricName"] for m in metrics}, metrics

    # A chat through the latency hop once a scrape has succeeded (gauges published; a scrape during the model load
    # publishes ScrapeFailed only): its time to first token reaches CloudWatch as a distribution. the metrics publisher
    # publishes each interval's histogram increase, and its first successful scrape is the baseline.
    def scraped():
        return fleet_names.REQUESTS_PROCESSING in {m["MetricName"] for m in published()}

    cold.wait(scraped, 150, "no successful scrape published", interval=5)
    assert json.loads(_chat(world, cold))["usage"]["completion_tokens"] > 0

    def latency():
        return {m["MetricName"] for m in published()} >= {fleet_names.TTFT, fleet_names.DECODE_TPS}

    try:
        cold.wait(latency, 180, "no TimeToFirstToken from the hop in CloudWatch", interval=5)
    except TimeoutError as e:
        raise AssertionError(cold.sh("docker logs --tail 30 metrics 2>&1").stdout) from e


def test_boot_and_container_logs_reach_cloudwatch_logs(world, cold):
    logs = world.aws.client("logs")

    def boot_stream_done():
        events = logs.get_log_events(logGroupName=world.boot.log_group, logStreamName=f"{cold.instance_id}/boot")
        return any("healthy; boot complete" in e["message"] for e in events["events"])

    cold.wait(boot_stream_done, 60, "the boot log did not reach CloudWatch Logs", interval=2)
    streams = {s["logStreamName"] for s in logs.describe_log_streams(logGroupName=world.boot.log_group)["logStreams"]}
    assert {"ip-10-0-1-23/fetch", "ip-10-0-1-23/llama-server"} <= streams, streams  # the awslogs driver
    fetch = logs.get_log_events(logGroupName=world.boot.log_group, logStreamName="ip-10-0-1-23/fetch")["events"]
    assert any("model ready" in e["message"] for e in fetch), fetch


def test_killing_the_server_container_makes_systemd_restart_it(cold):
    assert cold.sh("systemctl show -p NRestarts --value gguf-serve-llama").stdout.strip() == "0"
    killed = time.monotonic()
    cold.sh("docker kill llama", check=True)
    cold.wait(lambda: cold.sh("systemctl show -p NRestarts --value gguf-serve-llama").stdout.strip() == "1", 60,
              "gguf-serve-llama was not restarted", interval=0.5)  # fmt: skip
    cold.wait(lambda: _health(cold) == "200", 120, "not healthy after the restart", interval=0.5)
    TIMINGS["restart_to_healthy_s"] = round(time.monotonic() - killed, 1)


@pytest.fixture(scope="module")
def warm(world, cold):
    """Stop and start the instance (a warm-pool start): the user data must not run again."""
    downloads, gets = len(world.hub.stats.downloads()), _model_gets(world)
    cold.stop()
    started = time.time()
    cold.start()
    cold.wait(lambda: len(_signals(world, cold, "SUCCESS")) == 2, 300, "no SUCCESS signal after the start")
    TIMINGS["warm_start_to_signal_s"] = round(_signals(world, cold, "SUCCESS")[-1].at - started, 1)
    return downloads, gets


def test_stop_and_start_comes_back_healthy_without_user_data_or_fetching(world, cold, warm):
    downloads, gets = warm
    assert _health(cold) == "200"
    assert "already ran" in cold.sh("journalctl -b -u run-user-data -o cat --no-pager").stdout
    assert cold.boot_log().count("gguf-serve-boot: healthy; boot complete") == 1  # the script did not run again
    assert len(world.hub.stats.downloads()) == downloads and _model_gets(world) == gets
    assert [a.params["LifecycleActionResult"] for a in _lifecycle(world, cold)] == ["CONTINUE", "CONTINUE"]


def test_warm_instance_of_an_older_release_abandons(world, cold, warm):
    ssm = world.aws.client("ssm")
    name = release_parameter_name(STACK)
    ssm.put_parameter(Name=name, Value="rel-newer", Type="String", Overwrite=True)  # a rolling update happened
    try:
        cold.stop()
        cold.start()
        cold.wait(lambda: _lifecycle(world, cold, "ABANDON"), 120, "the stale instance did not abandon")
        assert len(_signals(world, cold, "SUCCESS")) == 2  # no new SUCCESS for a stale release
        out = cold.sh("journalctl -b -u gguf-serve-ready -o cat --no-pager").stdout
        assert f"release {world.release} is stale" in out, out
    finally:
        cold.stop()
        ssm.put_parameter(Name=name, Value=world.release, Type="String", Overwrite=True)


def test_a_transient_aws_error_at_start_still_ends_healthy_and_signalled(world, cold):
    """Secrets Manager failing for the first seconds of a warm start: the server start is retried and the
    readiness unit still waits for it, releases the hook and signals, instead of failing with its dependency."""
    cold.stop()
    successes = len(_signals(world, cold, "SUCCESS"))
    world.aws.recorder.outages["GetSecretValue"] = time.time() + 20
    try:
        cold.start()
        cold.wait(lambda: len(_signals(world, cold, "SUCCESS")) > successes, 180, "no SUCCESS after the outage")
        restarts = int(cold.sh("systemctl show -p NRestarts --value gguf-serve-llama").stdout)
        assert restarts >= 1  # the outage did fail a start
        assert _health(cold) == "200"
    finally:
        world.aws.recorder.outages.clear()
        cold.stop()


ROUTED = "Qwen3.6-27B"  # another fleet's model behind the same endpoint (sharedEndpoint)


def test_a_second_instance_reads_the_model_from_the_s3_cache(world, cold):
    """... and boots as a fleet behind a shared endpoint does: its hop's unit, as systemd runs it, routes the other
    fleet's model to the route listener (GET /v1/models lists it beside its own) and serves its own."""
    downloads, gets = len(world.hub.stats.downloads()), _model_gets(world)
    route_url = "http://internal-shared-endpoint.cn-northwest-1.elb.amazonaws.com.cn:8000"
    spec = InstanceSpec.of(world.profile, (ROUTED,))
    b = world.instance("i-0b00000000000ca5e", render_user_data(spec, replace(world.boot, route_url=route_url)))
    b.start()
    result = b.wait_boot_done(timeout=900)
    TIMINGS["cache_steps"] = _steps(b)
    TIMINGS["cache_fetch_log"] = [line for line in b.boot_log().splitlines() if " modelfetch " in line]
    try:
        assert result == "run-user-data: user data exited 0", b.diagnostics()
        assert "fetching gemma-3-270m-q4_k_m.gguf from the S3 cache" in b.boot_log()
        assert len(world.hub.stats.downloads()) == downloads, "the second instance went to ModelScope"
        assert _model_gets(world) > gets
        assert [s.params["Status"] for s in _signals(world, b)] == ["SUCCESS"]
        listed = b.sh(f"curl -s -H 'Authorization: Bearer {world.api_key}' http://127.0.0.1:8080/v1/models").stdout
        names = [m["id"] for m in json.loads(listed)["data"]]
        assert names == [*world.profile.runtime().model.served_names, ROUTED], listed
        assert json.loads(_chat(world, b))["usage"]["completion_tokens"] > 0  # its own model, served here
    finally:
        b.stop()


def test_a_failing_step_names_its_cause_in_the_boot_log_and_signals_failure(world):
    broken = replace(world.boot, registry="nosuch.dkr.ecr.cn-northwest-1.amazonaws.com.cn")
    c = world.instance("i-0c0000000000fa11d", world.user_data(boot=broken))
    c.start()
    try:
        assert c.wait_boot_done(timeout=300) == "run-user-data: user data exited 1"
        last = c.boot_log().strip().splitlines()[-1]
        assert last == f"gguf-serve-boot: FAILED: ECR login to {broken.registry} failed", c.boot_log()
        assert [s.params["Status"] for s in _signals(world, c)] == ["FAILURE"]
        assert not _lifecycle(world, c)
    finally:
        c.stop()


def test_the_refusal_exit_does_not_restart_loop_and_signals_failure_with_its_cause(world, cold):
    """MTP on a file without MTP layers: the launcher refuses (exit 78), systemd does not restart it."""
    profile = world.profile
    claims_mtp = replace(profile.model, has_mtp_layers=True)  # the catalog is wrong about the file
    mtp = replace(profile, model=claims_mtp, server=replace(profile.server, parallel=1, speculative=Speculative()))
    d = world.instance("i-0d000000000078ef0", world.user_data(profile=mtp))
    started = time.time()
    d.start()
    try:
        assert d.wait_boot_done(timeout=600) == "run-user-data: user data exited 1", d.diagnostics()
        failed_after = _signals(world, d, "FAILURE")[0].at - started
        TIMINGS["refusal_to_failure_signal_s"] = round(failed_after, 1)
        last = d.boot_log().strip().splitlines()[-1]
        assert last.startswith(
            "gguf-serve-boot: FAILED: llama-server not healthy: gguf-serve-launch: refusing to start:"
        ), last
        assert "has no MTP layers" in last
        time.sleep(12)  # two RestartSec periods: a restart loop would show here
        show = d.sh("systemctl show -p NRestarts -p ExecMainStatus -p ActiveState gguf-serve-llama").stdout.split()
        assert sorted(show) == ["ActiveState=failed", "ExecMainStatus=78", "NRestarts=0"], show
        assert {s.params["Status"] for s in _signals(world, d)} == {"FAILURE"}
        assert not _lifecycle(world, d, "CONTINUE")
    finally:
        d.stop()


def test_an_mtp_profile_boots_and_drafts_through_the_real_image(world, tmp_path_factory):
    """The GPU profile's speculative settings on the tiny MTP GGUF, booted like any instance: the launcher in the
    image accepts the file, llama-server drafts with the MTP head, the instance signals SUCCESS."""
    path = write(tmp_path_factory.mktemp("mtp") / "qwen36-tiny-mtp.gguf", agree=True)
    profile = with_gpu_speculation(replace(world.profile, model=artifact(path)))
    world.hub.add_file(profile.model.repo, profile.model.file, path)
    e = world.instance("i-0e0000000000d7a9f", world.user_data(profile=profile))
    e.start()
    try:
        assert e.wait_boot_done(timeout=600) == "run-user-data: user data exited 0", e.diagnostics()
        assert "--spec-type draft-mtp" in e.sh("journalctl -u gguf-serve-llama -o cat --no-pager").stdout
        chat = e.sh(
            "curl -s -H 'Authorization: Bearer " + world.api_key + "' -H 'Content-Type: application/json' "
            '-d \'{"messages":[{"role":"user","content":"Say hello."}],"max_tokens":32}\' '
            "http://127.0.0.1:8080/v1/chat/completions",
            timeout=120,
        ).stdout
        timings = json.loads(chat)["timings"]
        assert timings["draft_n"] > 0 and timings["draft_n_accepted"] == timings["draft_n"], timings
        TIMINGS["mtp_timings"] = timings
        assert [s.params["Status"] for s in _signals(world, e)] == ["SUCCESS"]
    finally:
        e.stop()


def test_every_call_the_instances_made_is_granted_to_the_instance_role(world, cold, instance_role_actions):
    """moto enforces no IAM: hold every call signed with the instance role's credentials (and each image pull)
    against the actions the synthesized IntelMoeStack grants its instance role. Actions only, not resources."""
    calls = [c for c in world.aws.recorder.calls if c.key == ROLE_ACCESS_KEY]
    needed = {iam_action(c) for c in calls}
    if world.registry.pulled:
        needed |= {"ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"}
    expected = {"s3:GetObject", "s3:PutObject", "secretsmanager:GetSecretValue", "cloudformation:SignalResource",
                "autoscaling:CompleteLifecycleAction", "cloudwatch:PutMetricData", "logs:PutLogEvents"}  # fmt: skip
    assert expected <= needed, needed  # the recorder saw the instances' own calls
    TIMINGS["instance_role_actions_used"] = sorted(needed)
    assert needed <= instance_role_actions, f"not granted: {sorted(needed - instance_role_actions)}"


def test_a_spot_notice_then_the_group_taking_the_instance_drain_the_hop_on_the_instance(world):
    """The drain's wiring on a real boot (the drain itself: tests/container/hop/test_drain.py): the hop unit reads
    the notices through the instance's IMDS, answers 503 + Retry-After, lets a stream finish, puts the counts to
    CloudWatch with the role's credentials, and completes the drain hook when the group takes the instance."""
    from gguf_serve.container.hop.drain import SPOT_ACTION, TARGET_STATE
    from gguf_serve.container.names import DRAIN_HOOK

    d = world.instance("i-0a00000000000d7a1")
    d.imds.instance.notices[TARGET_STATE] = "InService"
    d.start()
    assert d.wait_boot_done(timeout=900) == "run-user-data: user data exited 0", d.diagnostics()
    steps = _steps(d)
    TIMINGS["drain_instance_healthy_s"] = steps.get("healthy; boot complete")
    auth = f"-H 'Authorization: Bearer {world.api_key}' -H 'Content-Type: application/json'"
    # The stream must still run when the hop sees the notice (it polls IMDS every 5 s): size it from this
    # machine's own speed, timed with a 16-token answer (prompt included, so the rate is an underestimate), to
    # last about 30 s, well inside the 120 s notice whatever the load.
    probe = '{"messages":[{"role":"user","content":"Count to ten."}],"max_tokens":16,"ignore_eos":true}'
    took = float(d.sh(f"curl -s -o /dev/null -w '%{{time_total}}' {auth} -d '{probe}' "
                      "http://127.0.0.1:8080/v1/chat/completions").stdout)  # fmt: skip
    tokens = max(16, min(2048, round(16 / max(took, 1e-3) * 30)))
    body = json.dumps(
        {"messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": tokens, "ignore_eos": True,
         "stream": True}, separators=(",", ":"),
    )  # fmt: skip
    d.sh(f"nohup curl -sN {auth} -d '{body}' http://127.0.0.1:8080/v1/chat/completions > /tmp/stream 2>&1 &")
    d.wait(lambda: "data: " in d.sh("cat /tmp/stream").stdout, 60, "the stream's first token", interval=0.2)
    noticed = time.time()
    deadline = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(noticed + 120))
    d.imds.instance.notices[SPOT_ACTION] = json.dumps({"action": "terminate", "time": deadline})
    d.wait(lambda: _health(d) == "503", 30, "/health 503 after the notice", interval=0.5)
    assert "data: [DONE]" not in d.sh("cat /tmp/stream").stdout, f"a {tokens}-token stream ended before the drain"
    refused = d.sh(f'curl -si {auth} -d \'{{"messages":[],"max_tokens":1}}\' http://127.0.0.1:8080/v1/chat/completions')
    assert refused.stdout.startswith("HTTP/1.1 503") and "retry-after:" in refused.stdout.lower(), refused.stdout
    d.wait(lambda: "data: [DONE]" in d.sh("cat /tmp/stream").stdout, 110, "the stream's end", interval=0.5)
    streamed = time.time() - noticed

    def drain_metric(name: str) -> float:
        cw = world.aws.client("cloudwatch")
        stats = cw.get_metric_statistics(
            Namespace=world.boot.metrics_namespace, MetricName=name, Period=60, Statistics=["Sum"],
            StartTime=time.time() - 900, EndTime=time.time() + 60,
            Dimensions=[{"Name": fleet_names.DIM_GROUP, "Value": GROUP},
                        {"Name": fleet_names.DIM_INSTANCE, "Value": d.instance_id}],
        )  # fmt: skip
        return sum(p["Sum"] for p in stats["Datapoints"])

    d.wait(lambda: drain_metric(fleet_names.DRAINS) == 1, 30, "the drain's PutMetricData")
    finished, cut = drain_metric(fleet_names.DRAIN_STREAMS_FINISHED), drain_metric(fleet_names.DRAIN_STREAMS_CUT)
    d.imds.instance.notices[TARGET_STATE] = "Terminated"  # the group replaces the interrupted instance
    calls = world.aws.recorder
    d.wait(
        lambda: calls.of("CompleteLifecycleAction", InstanceId=d.instance_id, LifecycleHookName=DRAIN_HOOK),
        30,
        "CompleteLifecycleAction on the drain hook",
    )
    (done,) = calls.of("CompleteLifecycleAction", InstanceId=d.instance_id, LifecycleHookName=DRAIN_HOOK)
    TIMINGS["drain_spot"] = {"finished": finished, "cut": cut, "stream_end_after_notice_s": round(streamed, 1)}
    print(f"\nrehearsal drain: healthy {steps.get('healthy; boot complete')} s after start; after the notice the "
          f"stream ended in {streamed:.1f} s; {finished:g} completed, {cut:g} cut; drain hook CONTINUE")  # fmt: skip
    assert (finished, cut) == (1, 0)
    assert done.params["LifecycleActionResult"] == "CONTINUE" and done.params["AutoScalingGroupName"] == GROUP
    assert done.key == ROLE_ACCESS_KEY  # signed with the instance role's credentials from IMDS


def test_a_group_at_zero_wakes_on_a_request_and_the_woken_instance_serves_it(world, monkeypatch):
    """The wake door's function (stacks/handlers/wake_door.py) against the rehearsal's moto, with the load
    balancer's front as WakeDoor leaves it: a request at zero gets 503 + Retry-After and sets the group to one;
    the group's instance (a fake instance booting the real user data) completes its launch hook; the rehearsal
    then plays EC2 Auto Scaling (moto does neither): it registers the instance with the servers' target group and
    sends the launch event; the door routes requests back, and the client's retry is served by the instance."""
    from tests.stacks.test_wake_door_handler import alb_request, build_front, load_door

    aws = world.aws
    front = build_front(aws.client("ec2"), aws.client("elbv2"))
    autoscaling, elbv2 = aws.client("autoscaling"), aws.client("elbv2")
    autoscaling.update_auto_scaling_group(AutoScalingGroupName=GROUP, MaxSize=1)  # wakeOnRequest keeps the max
    monkeypatch.setenv("AWS_DEFAULT_REGION", "cn-northwest-1")
    secrets = aws.client("secretsmanager")
    secret = secrets.describe_secret(SecretId=f"{STACK}-ApiKey")["ARN"]  # the stack's key, as the door reads it
    door = load_door(monkeypatch, front, group=GROUP, wake_s=world.profile.wake_s, secret=secret)
    door.autoscaling, door.elbv2, door.secrets = autoscaling, elbv2, secrets  # the Lambda's clients, at the stand-in
    assert door.handler({"source": "aws.events", "detail-type": "Scheduled Event"}, None)["routed"] == "door"
    request = alb_request(front.door)
    request["headers"]["authorization"] = f"Bearer {world.api_key}"  # only a request with the key wakes the group

    asked = time.time()
    answer = door.handler(request, None)
    assert answer["statusCode"] == 503 and answer["headers"]["Retry-After"] == str(world.profile.wake_s), answer
    (group,) = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"]
    assert group["DesiredCapacity"] == 1
    woke = world.instance("i-0a00000000000a4e1")  # the instance the group launches for it
    woke.start()
    assert woke.wait_boot_done(timeout=900) == "run-user-data: user data exited 0", woke.diagnostics()
    assert _lifecycle(world, woke, "CONTINUE"), "the launch hook was not completed"
    later = door.handler(request, None)  # a retry before the group's instance is registered
    assert later["statusCode"] == 503 and int(later["headers"]["Retry-After"]) < world.profile.wake_s
    (moto_instance,) = (
        group["Instances"]
        or autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]["Instances"]
    )
    elbv2.register_targets(TargetGroupArn=front.servers, Targets=[{"Id": moto_instance["InstanceId"], "Port": 8080}])
    routed = door.handler({"source": "aws.autoscaling", "detail-type": "EC2 Instance Launch Successful"}, None)
    assert routed == {"routed": "servers", "in_service": 1}
    served = json.loads(_chat(world, woke))
    assert served["choices"][0]["message"], served
    wake_s = time.time() - asked
    TIMINGS["wake_from_zero"] = {
        "retry_after_s": int(answer["headers"]["Retry-After"]),
        "request_to_answer_s": round(wake_s, 1),
        "healthy_after_start_s": _steps(woke).get("healthy; boot complete"),
    }
    print(f"\nrehearsal wake from zero: 503 Retry-After {answer['headers']['Retry-After']} s, desired 0 -> 1; the "
          f"retry answered {wake_s:.1f} s after the first request (a cold boot of the fake instance)")  # fmt: skip
    autoscaling.update_auto_scaling_group(AutoScalingGroupName=GROUP, MinSize=0, MaxSize=0, DesiredCapacity=0)
