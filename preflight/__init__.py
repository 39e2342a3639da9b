"""Read-only checks of an AWS account before the first `cdk deploy`: `python -m preflight [Stack ...]`."""
