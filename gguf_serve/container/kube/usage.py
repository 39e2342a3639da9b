"""What an EKS profile's tokens cost, published by its scaler: the profile's nodes, the output tokens its pods' hops
relayed and their busy slots, from the scrapes each scaling step makes anyway (no sidecar, no agent, no metrics
adapter). One PutMetricData call per `interval_s` into the project's namespace, dimension
EksProfile=<stack>/<profile>; the EKS stack's dashboard prices them with the same metric math as the EC2 and
SageMaker dashboards (stacks/fleet_cost.py).

- ServingNodes (Count, the Average of the steps in the interval): every node of the profile, ready or not, serving or
  not: each one bills by the hour.
- OutputTokens (Count, Sum): the increase of each pod's gguf_serve_output_tokens_total since the step before; a new
  pod's counter is counted from its first scrape on, a restarted one's (a lower value) from zero.
- SlotsBusyRatio (Percent): busy slots over the slots of the pods scraped, averaged over the interval's steps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gguf_serve.container.metrics import names

log = logging.getLogger("gguf-serve-scaler")

PutMetricData = Callable[..., Any]  # boto3's cloudwatch.put_metric_data


@dataclass
class FleetUsage:
    put: PutMetricData
    profile: str  # the EksProfile dimension's value: <stack>/<profile>
    slots: int  # llama-server slots per pod
    interval_s: float = 60.0
    _tokens_seen: dict[str, float] = field(default_factory=dict)
    _tokens: float = 0.0
    _nodes: list[int] = field(default_factory=list)
    _busy: list[float] = field(default_factory=list)
    _since: float | None = None

    def observe(self, now: float, *, nodes: int, tokens_total: dict[str, float], processing: float) -> None:
        """One scaling step: the profile's node count, each scraped pod's output-token counter, their busy slots."""
        for pod, total in tokens_total.items():
            before = self._tokens_seen.get(pod)
            if before is not None:
                self._tokens += total - before if total >= before else total  # a restarted hop counts from 0
        self._tokens_seen = dict(tokens_total)
        self._nodes.append(nodes)
        if tokens_total:
            self._busy.append(100.0 * processing / (len(tokens_total) * self.slots))
        if self._since is None:
            self._since = now
        elif now - self._since >= self.interval_s:
            self.publish()
            self._since = now

    def datums(self) -> list[dict[str, Any]]:
        dims = [{"Name": names.DIM_EKS_PROFILE, "Value": self.profile}]
        out = [
            {"MetricName": names.SERVING_NODES, "Dimensions": dims, "Unit": "Count",
             "Value": sum(self._nodes) / len(self._nodes)},
            {"MetricName": names.OUTPUT_TOKENS, "Dimensions": dims, "Unit": "Count", "Value": self._tokens},
        ]  # fmt: skip
        if self._busy:  # no pod scraped: no utilization to speak of (the nodes still cost)
            out.append({"MetricName": names.SLOTS_BUSY_RATIO, "Dimensions": dims, "Unit": "Percent",
                        "Value": sum(self._busy) / len(self._busy)})  # fmt: skip
        return out

    def publish(self) -> None:
        """Put the interval's datums, then start the next interval; a refused call loses this interval only."""
        if not self._nodes:
            return
        data = self.datums()
        try:
            self.put(Namespace=names.NAMESPACE, MetricData=data)
        except Exception as e:  # noqa: BLE001 - CloudWatch unreachable or refusing: the scaling goes on
            log.warning("usage for %s not published: %s: %s", self.profile, type(e).__name__, e)
        self._tokens, self._nodes, self._busy = 0.0, [], []
