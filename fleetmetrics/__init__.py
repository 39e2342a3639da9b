"""Publish llama-server's Prometheus /metrics as CloudWatch custom metrics."""
