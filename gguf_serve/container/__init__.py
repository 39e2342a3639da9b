"""What the serving image runs, and nothing else; the image copies this folder whole (docker/app.Dockerfile).

Here: the runtime spec and its loader (`spec`), the llama-server settings (`server`) and flags (`flags`), and the
names two processes must agree on (`names`), standard library only. Below: the image's programs, `launch` (the
container's entry point), `fetch` (model delivery), `hop` (the timing hop in front of llama-server) and `metrics`
(llama-server's /metrics to CloudWatch)."""
