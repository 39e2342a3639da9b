"""Read-only checks of an AWS account before the first `cdk deploy`: `gguf-serve-preflight [Stack ...]`."""
