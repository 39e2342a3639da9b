import boto3


def handler(event, context):
    if event["RequestType"] == "Delete":
        return {"IsComplete": True}
    build_id = event["Data"]["BuildId"]
    if not build_id:  # the object was already staged
        return {"IsComplete": True}
    build = boto3.client("codebuild").batch_get_builds(ids=[build_id])["builds"][0]
    status = build["buildStatus"]
    print(f"{build_id}: {status} ({build.get('currentPhase')})")
    if status == "IN_PROGRESS":
        return {"IsComplete": False}
    if status == "SUCCEEDED":
        return {"IsComplete": True}
    raise RuntimeError(f"model staging {build_id} ended {status}; its CodeBuild log says why (the fetcher's last line)")
