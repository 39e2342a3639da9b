"""The S3 cache's client takes the region the boot script and the pod give it (AWS_REGION), not only IMDS's."""

from __future__ import annotations

from gguf_serve.container.fetch.s3cache import S3Cache


def test_the_region_comes_from_aws_region_without_instance_metadata(monkeypatch):
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "cn-northwest-1")  # botocore alone reads only AWS_DEFAULT_REGION
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # a pod: no instance metadata to ask
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    cache = S3Cache("s3://bucket/models")
    assert cache.client.meta.region_name == "cn-northwest-1"
    assert cache.client.meta.endpoint_url.endswith(".amazonaws.com.cn")
