"""Drain on notice: the hop watches the instance metadata and stops taking new requests before the instance goes.

Three notices, polled every POLL_S with an IMDSv2 token:
- `spot/instance-action` (a Spot interruption, two minutes ahead, with its time): drain until that time.
- `autoscaling/target-lifecycle-state` leaving InService (scale-in, a rolling update, capacity rebalancing, a
  return to the warm pool, standby): drain up to the drain deadline (the profile's longest expected answer),
  record a heartbeat on the drain hook while streams run, complete it with CONTINUE once they are done. Standby
  has no hook; an instance the group brings back InService (ExitStandby) takes requests again.
- `events/recommendations/rebalance`: logged only. Capacity rebalancing launches the replacement first and
  terminates this instance once the replacement is healthy, through the drain hook above (EC2 Auto Scaling User
  Guide, "Capacity Rebalancing in Auto Scaling to replace at-risk Spot Instances", docs.amazonaws.cn).

While draining, /health answers 503 (the target group stops choosing the instance after its unhealthy threshold)
and every new slot-taking request is answered 503 with Retry-After; streams already admitted run to their end.
When the drain ends (idle, or the deadline), one log line and one PutMetricData say how many streams finished and
how many were still running (cut). AWS calls go through boto3 with the instance role (imported only when used).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gguf_serve.container.names import DRAIN_HEARTBEAT_S

log = logging.getLogger("gguf-serve-hop")

# "We recommend that you check for these interruption notices every 5 seconds" (EC2 User Guide, "Spot Instance
# interruption notices", docs.amazonaws.cn).
POLL_S = 5.0
SPOT_ACTION = "meta-data/spot/instance-action"  # JSON {"action": "terminate"|"stop"|"hibernate", "time": ISO-8601}
REBALANCE = "meta-data/events/recommendations/rebalance"  # JSON {"noticeTime": ISO-8601}
# InService, Terminated, Detached, Standby, Warmed:* (EC2 Auto Scaling User Guide, "Retrieve the target lifecycle
# state through instance metadata", docs.amazonaws.cn)
TARGET_STATE = "meta-data/autoscaling/target-lifecycle-state"
IN_SERVICE = "InService"
STANDBY = "Standby"  # EnterStandby: no lifecycle hook holds it, and ExitStandby brings it back InService
PUBLISH_MARGIN_S = 10.0  # a Spot drain reports this long before the interruption, while the network is still there
TOKEN_TTL_S = 21600
# A CompleteLifecycleAction that fails (throttled, the network) is tried again at each poll for this long: the
# hook's own timeout (three heartbeats) ends the wait anyway. A ValidationError means no action waits: not retried.
COMPLETE_RETRY_S = 3 * DRAIN_HEARTBEAT_S


class Imds:
    """IMDSv2: a session token first, then GETs with it; 404 is "no such item" (no notice)."""

    def __init__(self, base: str = "http://169.254.169.254", timeout_s: float = 2.0) -> None:
        self.base = base.rstrip("/")
        self.timeout_s = timeout_s
        self._token: str | None = None
        self._token_until = 0.0

    def _fresh_token(self) -> str:
        if self._token is None or time.monotonic() > self._token_until:
            request = urllib.request.Request(  # noqa: S310 - a fixed http:// base
                f"{self.base}/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
            )
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:  # noqa: S310
                self._token = answer.read().decode()
            self._token_until = time.monotonic() + TOKEN_TTL_S * 0.8
        return self._token

    def get(self, path: str) -> str | None:
        for attempt in (1, 2):
            request = urllib.request.Request(  # noqa: S310
                f"{self.base}/latest/{path}", headers={"X-aws-ec2-metadata-token": self._fresh_token()}
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:  # noqa: S310
                    return answer.read().decode()
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return None
                if e.code == 401 and attempt == 1:  # the token expired: one more try with a new one
                    self._token = None
                    continue
                raise
        return None


@dataclass
class DrainState:
    """One drain: why, until when, and what became of the streams."""

    reason: str
    deadline: float  # time.time()
    started: float = field(default_factory=time.time)
    running_at_start: int = 0
    finished: int = 0  # slot-taking requests admitted before the drain that ended with their whole answer
    broken: int = 0  # ... that ended otherwise (the client left, llama-server broke off)
    refused: int = 0  # new slot-taking requests answered 503
    cut: int | None = None  # still running when the drain ended (None: not ended yet)
    ended: float | None = None

    @property
    def done(self) -> bool:
        return self.cut is not None

    def summary(self) -> str:
        took = (self.ended or time.time()) - self.started
        return (
            f"drain ({self.reason}): {self.finished} streams finished, {self.cut} cut, {self.broken} ended early, "
            f"{self.refused} new requests answered 503, {took:.1f} s"
        )


@dataclass
class DrainSettings:
    imds_url: str = "http://169.254.169.254"
    deadline_s: float = 450.0  # scale-in and lifecycle drains: the longest expected answer (fleet.drain_deadline_s)
    hook: str | None = None  # the termination lifecycle hook to heartbeat and complete; None: no lifecycle calls
    region: str | None = None
    namespace: str | None = None  # CloudWatch namespace for the drain's counts; None: log only
    poll_s: float = POLL_S
    heartbeat_s: float = DRAIN_HEARTBEAT_S


class Drainer:
    """An asyncio task beside the hop's connections (ProxyServer starts it); blocking calls run in threads."""

    def __init__(self, settings: DrainSettings, *, imds: Imds | None = None, aws: Any = None) -> None:
        self.settings = settings
        self.imds = imds or Imds(settings.imds_url)
        self._aws = aws  # a factory service -> boto3 client; None: boto3 with the instance role
        self._clients: dict[str, Any] = {}
        self.rebalance_seen = False
        self.seen_in_service = False
        self.lifecycle_state: str | None = None
        self.completed_hook = False
        self.complete_tries = 0
        self.heartbeats = 0
        self._last_beat = 0.0
        self.identity: tuple[str, str] | None = None  # (group, instance id)

    def client(self, service: str) -> Any:
        if service not in self._clients:
            if self._aws is not None:
                self._clients[service] = self._aws(service)
            else:
                import boto3

                self._clients[service] = boto3.client(service, region_name=self.settings.region)
        return self._clients[service]

    async def run(self, server: Any) -> None:
        while True:
            try:
                await self._poll(server)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a metadata or AWS hiccup must not end the watch
                log.warning("drain watch: %s: %s", type(e).__name__, e)
            await asyncio.sleep(self.settings.poll_s)

    async def _poll(self, server: Any) -> None:
        drain: DrainState | None = server.drain
        # Read the notices until a drain the hook holds is done: after a Spot drain the group's turn comes, and a
        # Standby drain may end with the instance back InService.
        if drain is None or not drain.done or not self._hooked():
            await self._notice(server)
        drain = server.drain
        if drain is None:
            return
        now = time.time()
        if not drain.done:
            spot = drain.reason.startswith("spot")
            stop_at = drain.deadline - (PUBLISH_MARGIN_S if spot else 0)
            if server.in_flight == 0 or now >= stop_at:
                server.end_drain()
                log.info("%s", drain.summary())
                await asyncio.to_thread(self._publish, drain)
            elif self._hooked() and now - self._last_beat >= self.settings.heartbeat_s:
                await asyncio.to_thread(self._lifecycle, "heartbeat", server.in_flight)
                self._last_beat = now
        if drain.done and self._hooked() and not self.completed_hook:
            self.complete_tries += 1
            done = await asyncio.to_thread(self._lifecycle, "complete")
            last = self.complete_tries * self.settings.poll_s >= COMPLETE_RETRY_S
            self.completed_hook = done or last

    async def _notice(self, server: Any) -> None:
        spot, state, rebalance = await asyncio.to_thread(self._read)
        if rebalance and not self.rebalance_seen:
            self.rebalance_seen = True
            log.info(
                "rebalance recommendation %s: capacity rebalancing launches a replacement first; this instance "
                "drains when the group terminates it",
                rebalance.get("noticeTime", ""),
            )
        if state == IN_SERVICE:
            self.seen_in_service = True
            if self.lifecycle_state is not None:
                await self._resume(server)
        elif state and self.seen_in_service and self.lifecycle_state is None:
            # Only after InService: a first boot into the warm pool reads Warmed:Stopped while it loads.
            self.lifecycle_state = state
            self._last_beat = time.time()
            if server.drain is None:
                server.begin_drain(f"lifecycle {state}", time.time() + self.settings.deadline_s)
        if spot and server.drain is None:
            deadline = _epoch(spot.get("time")) or time.time() + 120  # the notice comes two minutes ahead
            server.begin_drain(f"spot {spot.get('action', 'interruption')}", deadline)

    def _hooked(self) -> bool:
        """A lifecycle drain that the drain hook holds (a termination or a warm-pool return; not Standby)."""
        return self.lifecycle_state not in (None, STANDBY)

    async def _resume(self, server: Any) -> None:
        """Back InService after a lifecycle drain (ExitStandby): close the drain's books and serve again. A Spot
        drain never resumes: the interruption comes whatever the group says."""
        drain = server.drain
        self.lifecycle_state, self.completed_hook, self.complete_tries = None, False, 0
        if drain is None or drain.reason.startswith("spot"):
            return
        if not drain.done:
            server.end_drain()
            log.info("%s", drain.summary())
            await asyncio.to_thread(self._publish, drain)
        server.resume()

    def _read(self) -> tuple[dict | None, str | None, dict | None]:
        spot = self.imds.get(SPOT_ACTION)
        state = self.imds.get(TARGET_STATE)
        rebalance = self.imds.get(REBALANCE)
        return _json(spot), state.strip() if state else None, _json(rebalance)

    def _who(self) -> tuple[str, str]:
        if self.identity is None:
            group = self.imds.get("meta-data/tags/instance/aws:autoscaling:groupName") or ""
            self.identity = (group, self.imds.get("meta-data/instance-id") or "")
        return self.identity

    def _lifecycle(self, what: str, running: int = 0) -> bool:
        """True when the call went through, or can never go through (nothing to retry)."""
        if not self.settings.hook:
            return True
        group, instance = self._who()
        args = {"AutoScalingGroupName": group, "LifecycleHookName": self.settings.hook, "InstanceId": instance}
        autoscaling = self.client("autoscaling")
        try:
            if what == "heartbeat":
                autoscaling.record_lifecycle_action_heartbeat(**args)
                self.heartbeats += 1
                log.info("drain: heartbeat on %s (%d streams running)", self.settings.hook, running)
            else:
                autoscaling.complete_lifecycle_action(**args, LifecycleActionResult="CONTINUE")
                log.info("drain: completed %s with CONTINUE", self.settings.hook)
        except Exception as e:  # noqa: BLE001 - no pending action (a Spot drain, a detach), or a throttle
            code = getattr(e, "response", {}).get("Error", {}).get("Code", "")
            final = code == "ValidationError" or what != "complete"  # no action waits; a heartbeat comes again
            log.warning("drain: %s on %s: %s%s", what, self.settings.hook, e, "" if final else "; tried again")
            return final
        return True

    def _publish(self, drain: DrainState) -> None:
        if not self.settings.namespace:
            return
        from gguf_serve.container.metrics import names
        from gguf_serve.container.metrics.derive import COUNT, Datum
        from gguf_serve.container.metrics.publish import metric_data

        group, instance = self._who()
        datums = [
            Datum(names.DRAINS, 1, COUNT),
            Datum(names.DRAIN_STREAMS_FINISHED, drain.finished, COUNT),
            Datum(names.DRAIN_STREAMS_CUT, drain.cut or 0, COUNT),
            Datum(names.DRAIN_REFUSED, drain.refused, COUNT),
            Datum(names.DRAIN_SECONDS, (drain.ended or time.time()) - drain.started, "Seconds"),
        ]
        data = metric_data(datums, group=group, instance_id=instance, timestamp=datetime.now(UTC))
        try:
            self.client("cloudwatch").put_metric_data(Namespace=self.settings.namespace, MetricData=data)
        except Exception as e:  # noqa: BLE001 - the counts are in the log line already
            log.warning("drain: PutMetricData failed (%s); the counts are in the line above", e)


def _json(text: str | None) -> dict | None:
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _epoch(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
