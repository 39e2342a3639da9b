"""A thin HTTP hop in front of llama-server that times each request and exports latency histograms.

llama.cpp's /metrics has counters and gauges only. This hop passes every request through unchanged (SSE
streams chunk by chunk, the API key untouched: llama-server checks it) and records per request the time to
first token, the gaps between tokens, the queue wait, the decode speed and the draft acceptance, as Prometheus
histograms appended to llama-server's own /metrics. Standard library and h11 (pure Python, pinned): it runs in the
serving image. It also bounds what a client can hold (client.py) and sheds load with 429 (admission.py).
"""

from gguf_serve.container.hop.histogram import Histogram
from gguf_serve.container.hop.metrics import RequestMetrics

__all__ = ["Histogram", "RequestMetrics"]
