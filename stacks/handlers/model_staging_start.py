import boto3


def staged(bucket: str, key: str, size: int, sha256: str) -> bool:
    """The object is there with the pinned size and the sha256 the fetcher verified before it wrote it."""
    try:
        head = boto3.client("s3").head_object(Bucket=bucket, Key=key)
    except boto3.client("s3").exceptions.ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return head["ContentLength"] == size and head.get("Metadata", {}).get("sha256") == sha256


def handler(event, context):
    props = event["ResourceProperties"]
    if event["RequestType"] == "Delete":  # the object stays: the bucket is kept, and a rollback may need it
        return {"PhysicalResourceId": event["PhysicalResourceId"]}
    key = props["Key"]
    if staged(props["Bucket"], key, int(props["SizeBytes"]), props["Sha256"]):
        print(f"s3://{props['Bucket']}/{key} is staged (sha256 {props['Sha256'][:12]}...); nothing to fetch")
        return {"PhysicalResourceId": key, "Data": {"BuildId": ""}}
    build = boto3.client("codebuild").start_build(projectName=props["ProjectName"])["build"]
    print(f"started {build['id']} to stage s3://{props['Bucket']}/{key}")
    return {"PhysicalResourceId": key, "Data": {"BuildId": build["id"]}}
