"""Prometheus names the hop exports; the workstation's recording and alert rules and the metrics publisher read them."""

PREFIX = "gguf_serve"

TTFT = f"{PREFIX}_time_to_first_token_seconds"
ITL = f"{PREFIX}_inter_token_latency_seconds"
QUEUE_WAIT = f"{PREFIX}_queue_wait_seconds"
DECODE_TPS = f"{PREFIX}_decode_tokens_per_second"
DRAFT_ACCEPTANCE = f"{PREFIX}_draft_acceptance_ratio"
DURATION = f"{PREFIX}_request_duration_seconds"
# counter, labels: code (HTTP status, "client_closed", or "upstream_closed": llama-server cut the answer), stream
REQUESTS = f"{PREFIX}_requests_total"
SHED = f"{PREFIX}_requests_shed_total"  # counter: answered 429 by admission control
UNAUTHORIZED = f"{PREFIX}_requests_unauthorized_total"  # counter: answered 401 at the hop (no key)
OUTPUT_TOKENS = f"{PREFIX}_output_tokens_total"  # counter: tokens of the answers relayed (llama-server's predicted_n)
ROUTED = f"{PREFIX}_requests_routed_total"  # counter: forwarded to the fleet that serves the model they name
ROUTE_SHED = f"{PREFIX}_requests_route_shed_total"  # counter: of those, 429 (too many forwards at once)
WRONG_MODEL = f"{PREFIX}_requests_model_not_found_total"  # counter: answered 404, naming a model served elsewhere
IN_FLIGHT = f"{PREFIX}_requests_in_flight"  # gauge: slot-taking requests admitted, processing or waiting
ADMISSION_LIMIT = f"{PREFIX}_admission_limit"  # gauge: slots * (1 + queue_per_slot), when set
CONNECTIONS = f"{PREFIX}_connections_open"  # gauge
CONNECTIONS_EVICTED = f"{PREFIX}_connections_evicted_total"  # counter: closed for a newer one at the cap
DRAINING = f"{PREFIX}_draining"  # gauge: 1 from a Spot notice or the group's leave until the instance goes
DRAIN_REFUSED = f"{PREFIX}_drain_requests_refused_total"  # counter: slot-taking requests answered 503 while draining
DRAIN_STREAMS_CUT = f"{PREFIX}_drain_streams_cut"  # gauge: streams still running when the drain ended; absent before

GPU_MEMORY_USED = f"{PREFIX}_gpu_memory_used_bytes"  # gauge, label gpu (index)
GPU_MEMORY_TOTAL = f"{PREFIX}_gpu_memory_total_bytes"
GPU_TEMPERATURE = f"{PREFIX}_gpu_temperature_celsius"
GPU_UTILIZATION = f"{PREFIX}_gpu_utilization_ratio"

HISTOGRAMS = (TTFT, ITL, QUEUE_WAIT, DECODE_TPS, DRAFT_ACCEPTANCE, DURATION)
GPU_GAUGES = (GPU_MEMORY_USED, GPU_MEMORY_TOTAL, GPU_TEMPERATURE, GPU_UTILIZATION)

# Buckets: CPU prompts of thousands of tokens take tens of seconds before the first token; GPU decode steps
# are a few milliseconds. Upper bounds, seconds (ratios and tokens/s for the last two).
BUCKETS = {
    TTFT: (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128),
    ITL: (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2),
    QUEUE_WAIT: (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
    DECODE_TPS: (1, 2, 5, 10, 15, 20, 30, 40, 50, 60, 80, 100, 120, 150, 200, 300),
    DRAFT_ACCEPTANCE: (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1),
    DURATION: (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
}
