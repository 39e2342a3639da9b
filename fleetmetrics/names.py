"""CloudWatch names published by fleetmetrics.

The CDK stack imports these constants for scaling policies, alarms and the
dashboard, so changing one here changes it everywhere.
"""

from catalog.names import METRICS_NAMESPACE

NAMESPACE = METRICS_NAMESPACE  # catalog/names.py: the IAM condition and the publisher agree on it

# Metric names
REQUESTS_PROCESSING = "RequestsProcessing"  # gauge, Count
REQUESTS_DEFERRED = "RequestsDeferred"  # gauge, Count
SLOTS_BUSY_RATIO = "SlotsBusyRatio"  # gauge, Percent (0-100)
GENERATED_TPS = "GeneratedTokensPerSecond"  # rate, Count/Second
PROMPT_TPS = "PromptTokensPerSecond"  # rate, Count/Second
DRAFT_ACCEPTANCE = "DraftAcceptanceRate"  # ratio, Percent (0-100)
SCRAPE_FAILED = "ScrapeFailed"  # 1 when a scrape failed, Count

# Dimension names
DIM_GROUP = "AutoScalingGroupName"
DIM_INSTANCE = "InstanceId"

ALL_METRICS = (
    REQUESTS_PROCESSING,
    REQUESTS_DEFERRED,
    SLOTS_BUSY_RATIO,
    GENERATED_TPS,
    PROMPT_TPS,
    DRAFT_ACCEPTANCE,
    SCRAPE_FAILED,
)
