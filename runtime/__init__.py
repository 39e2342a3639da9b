"""What the serving image needs at run time, and nothing else: the runtime spec and its loader (runtime.spec),
the llama-server settings (runtime.server) and flags (runtime.flags), and the names two processes must agree on
(runtime.names). Standard library only; the image copies this package whole (docker/app.Dockerfile)."""
