import boto3


def handler(event, context):
    props = event["ResourceProperties"]
    if event["RequestType"] == "Delete":
        return {"PhysicalResourceId": event["PhysicalResourceId"]}
    build = boto3.client("codebuild").start_build(projectName=props["ProjectName"])["build"]
    print(f"started {build['id']} for image tag {props['ImageTag']}")
    return {"PhysicalResourceId": props["ImageTag"], "Data": {"BuildId": build["id"]}}
