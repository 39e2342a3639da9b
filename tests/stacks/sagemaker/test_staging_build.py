"""The model staging's CodeBuild build, run here as CodeBuild runs it: the synthesized buildspec's commands, the
synthesized source and staged-sources assets, the project's environment. Only the world differs: a tiny GGUF in a
local ModelScope-shaped hub stands for the 23 GB file, and moto's S3 server for the stack's bucket. The fetcher then
stages it under the pin's prefix, and the staging trigger (stacks/handlers/model_staging_start.py) finds it there."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from gguf_serve.local.hub import LocalScope
from gguf_serve.local.process import free_port
from stacks.build_step import HANDLERS
from tests.container.sagemaker.conftest import FILE, spec_for, write_gguf

pytestmark = pytest.mark.slow
REGION = "cn-northwest-1"


def _asset(assembly_dir: Path, location) -> Path:
    (digest,) = re.findall(r"/([0-9a-f]{64})\.zip", json.dumps(location))
    return assembly_dir / f"asset.{digest}"


@pytest.fixture
def moto_s3(monkeypatch):
    server = ThreadedMotoServer(port=free_port())
    server.start()
    url = f"http://127.0.0.1:{server._port}"  # noqa: SLF001 - moto's server keeps its port there
    for key, value in {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="models", CreateBucketConfiguration={"LocationConstraint": REGION})
    yield url, s3
    server.stop()


def test_the_synthesized_staging_build_stages_the_pinned_file_once(assembly, moto_s3, tmp_path):
    url, s3 = moto_s3
    template = assembly.get_stack_by_name("GravitonMoeSageMakerStack").template
    (project,) = [
        r["Properties"] for r in template["Resources"].values()
        if r["Type"] == "AWS::CodeBuild::Project" and r["Properties"]["Description"].startswith("Stage ")
    ]  # fmt: skip
    commands = json.loads(project["Source"]["BuildSpec"])["phases"]["build"]["commands"]
    directory = Path(assembly.directory)
    context, sources = (
        _asset(directory, project["Source"]["Location"]),
        _asset(directory, project["SecondarySources"][0]["Location"]),
    )
    env = {v["Name"]: v["Value"] for v in project["Environment"]["EnvironmentVariables"]}
    assert json.loads(env["RUNTIME_SPEC"])["model"]["file"] == "Qwen3.6-35B-A3B-UD-Q4_K_M.gguf"

    tiny = write_gguf(tmp_path / "hub" / FILE)
    spec = spec_for(tiny)  # the stand-in for the 23 GB file: same fetcher, same checks
    sha = spec.model.sha256
    with LocalScope() as hub:
        hub.add_file(spec.model.repo, spec.model.file, tiny)
        run_env = {
            **os.environ,
            "CODEBUILD_SRC_DIR": str(context), "CODEBUILD_SRC_DIR_sources": str(sources),
            "RUNTIME_SPEC": spec.to_json(), "STAGING_URI": f"s3://models/sagemaker/{sha}/",
            "MODELSCOPE_ENDPOINT": hub.url, "TMPDIR": str(tmp_path),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # python3: CodeBuild's runtime
        }  # fmt: skip
        build = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", "\n".join(commands)], env=run_env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-3000:]
    key = f"sagemaker/{sha}/{spec.model.repo}/{spec.model.revision}/{FILE}"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="models", Prefix=f"sagemaker/{sha}/")["Contents"]] == [key]
    head = s3.head_object(Bucket="models", Key=key)
    assert head["ContentLength"] == spec.model.size_bytes and head["Metadata"]["sha256"] == sha

    handler = importlib.util.spec_from_file_location("staging_start", HANDLERS / "model_staging_start.py")
    start = importlib.util.module_from_spec(handler)
    handler.loader.exec_module(start)  # type: ignore[union-attr]
    event = {"RequestType": "Create", "ResourceProperties": {"ProjectName": "p", "Bucket": "models", "Key": key,
             "SizeBytes": str(spec.model.size_bytes), "Sha256": sha}}  # fmt: skip
    assert start.handler(event, None) == {"PhysicalResourceId": key, "Data": {"BuildId": ""}}  # no second build
    assert not start.staged("models", key.replace(FILE, "other.gguf"), spec.model.size_bytes, sha)
    assert not start.staged("models", key, spec.model.size_bytes, "0" * 64)  # another pin: fetch it
