import boto3


def image_exists(repository: str, tag: str) -> bool:
    try:
        boto3.client("ecr").describe_images(repositoryName=repository, imageIds=[{"imageTag": tag}])
    except boto3.client("ecr").exceptions.ImageNotFoundException:
        return False
    return True


def handler(event, context):
    props = event["ResourceProperties"]
    if event["RequestType"] == "Delete":
        return {"PhysicalResourceId": event["PhysicalResourceId"]}
    tag = props["ImageTag"]
    # A tag already pushed (a redeploy, or a rollback to the previous image) is never built or pushed again:
    # the repository's tags are immutable.
    if image_exists(props["RepositoryName"], tag):
        print(f"image tag {tag} is in {props['RepositoryName']}; nothing to build")
        return {"PhysicalResourceId": tag, "Data": {"BuildId": ""}}
    build = boto3.client("codebuild").start_build(
        projectName=props["ProjectName"],
        environmentVariablesOverride=[{"name": "STAGE", "value": props["Stage"], "type": "PLAINTEXT"}],
        computeTypeOverride=props["ComputeType"],
    )["build"]
    print(f"started {build['id']} for image tag {tag} ({props['Stage']})")
    return {"PhysicalResourceId": tag, "Data": {"BuildId": build["id"]}}
