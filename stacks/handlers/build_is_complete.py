import os

import boto3


def handler(event, context):
    if event["RequestType"] == "Delete":
        return {"IsComplete": True}
    build_id = event["Data"]["BuildId"]
    if not build_id:  # the start handler found the build's output there already
        return {"IsComplete": True}
    build = boto3.client("codebuild").batch_get_builds(ids=[build_id])["builds"][0]
    status = build["buildStatus"]
    print(f"{build_id}: {status} ({build.get('currentPhase')})")
    if status == "IN_PROGRESS":
        return {"IsComplete": False}
    if status == "SUCCEEDED":
        return {"IsComplete": True}
    raise RuntimeError(f"{os.environ['BUILD_WHAT']} {build_id} ended {status}; {os.environ['BUILD_LOOK']}")
