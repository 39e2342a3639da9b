"""CloudWatch names published by the metrics publisher.

The CDK stack imports these constants for scaling policies, alarms and the
dashboard, so changing one here changes it everywhere.
"""

from gguf_serve.container.names import METRICS_NAMESPACE

NAMESPACE = METRICS_NAMESPACE  # gguf_serve/catalog/names.py: the IAM condition and the publisher agree on it

# Metric names
REQUESTS_PROCESSING = "RequestsProcessing"  # gauge, Count
REQUESTS_DEFERRED = "RequestsDeferred"  # gauge, Count
SLOTS_BUSY_RATIO = "SlotsBusyRatio"  # gauge, Percent (0-100)
GENERATED_TPS = "GeneratedTokensPerSecond"  # rate, Count/Second
PROMPT_TPS = "PromptTokensPerSecond"  # rate, Count/Second
DRAFT_ACCEPTANCE = "DraftAcceptanceRate"  # ratio, Percent (0-100)
SCRAPE_FAILED = "ScrapeFailed"  # 1 when a scrape failed, Count
# From the hop's admission control (the hop): requests it answered 429 since the last scrape, and the
# slot-taking requests it let through that are not finished (processing or waiting in llama-server)
REQUESTS_SHED = "RequestsShed"  # Count per scrape interval
HOP_REQUESTS_IN_FLIGHT = "HopRequestsInFlight"  # gauge, Count
# Generated tokens of the answers the hop relayed since the last scrape: the cost per token's denominator
OUTPUT_TOKENS = "OutputTokens"  # Count per scrape interval
SERVING_NODES = "ServingNodes"  # an EKS profile's nodes, Count (gguf_serve/container/kube/usage.py)
# From the hop's drain (gguf_serve/container/hop/drain.py), one datum each when a drain ends: a Spot notice or the
# instance
# leaving the group. Streams that ended with their whole answer, streams still running at the end (cut), new
# requests answered 503 meanwhile, and how long the drain took.
DRAINS = "Drains"  # Count
DRAIN_STREAMS_FINISHED = "DrainStreamsFinished"  # Count
DRAIN_STREAMS_CUT = "DrainStreamsCut"  # Count
DRAIN_REFUSED = "DrainRequestsRefused"  # Count
DRAIN_SECONDS = "DrainSeconds"  # Seconds

# Per-request distributions from the timing hop (the hop), published as Values/Counts so that CloudWatch
# computes fleet-wide percentiles (p50, p95, p99) itself
TTFT = "TimeToFirstToken"  # Seconds
INTER_TOKEN_LATENCY = "InterTokenLatency"  # noqa: S105 - a metric name; Seconds
QUEUE_WAIT = "QueueWait"  # Seconds
DECODE_TPS = "DecodeTokensPerSecond"  # Count/Second, per request
REQUEST_DRAFT_ACCEPTANCE = "RequestDraftAcceptance"  # Percent (0-100), per request with drafts

# Dimension names
DIM_GROUP = "AutoScalingGroupName"
DIM_INSTANCE = "InstanceId"
DIM_EKS_PROFILE = "EksProfile"  # <cluster>/<profile>: what an EKS profile's scaler publishes

ALL_METRICS = (
    REQUESTS_PROCESSING,
    REQUESTS_DEFERRED,
    SLOTS_BUSY_RATIO,
    GENERATED_TPS,
    PROMPT_TPS,
    DRAFT_ACCEPTANCE,
    SCRAPE_FAILED,
    REQUESTS_SHED,
    HOP_REQUESTS_IN_FLIGHT,
    OUTPUT_TOKENS,
)
LATENCY_METRICS = (TTFT, INTER_TOKEN_LATENCY, QUEUE_WAIT, DECODE_TPS, REQUEST_DRAFT_ACCEPTANCE)
