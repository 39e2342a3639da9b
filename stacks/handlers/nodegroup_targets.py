"""Custom resource: attach a managed node group's Auto Scaling group to a load balancer target group.

AWS::EKS::Nodegroup names its group only through the EKS API (DescribeNodegroup, resources.autoScalingGroups), so
the template cannot. Attached, the group registers every node it launches on the target group's port (the
Service's NodePort) and deregisters a node before terminating it, waiting out the deregistration delay. The physical
id names the group and the target group: a new node group or target group is a new attachment, and CloudFormation's
delete of the old id detaches the old pair.
"""

import boto3
from botocore.exceptions import ClientError


def _group(props):
    found = boto3.client("eks").describe_nodegroup(clusterName=props["ClusterName"], nodegroupName=props["Nodegroup"])
    return found["nodegroup"]["resources"]["autoScalingGroups"][0]["name"]


def handler(event, context):
    props = event["ResourceProperties"]
    autoscaling = boto3.client("autoscaling")
    if event["RequestType"] == "Delete":
        group, _, target_group = event["PhysicalResourceId"].partition("|")
        if not target_group:  # a create that failed before attaching
            return {"PhysicalResourceId": event["PhysicalResourceId"]}
        try:
            autoscaling.detach_load_balancer_target_groups(AutoScalingGroupName=group, TargetGroupARNs=[target_group])
        except ClientError as e:  # the group went with its node group: nothing is attached any more
            print(f"detach {target_group} from {group}: {e}")
        return {"PhysicalResourceId": event["PhysicalResourceId"]}
    group = _group(props)
    autoscaling.attach_load_balancer_target_groups(
        AutoScalingGroupName=group, TargetGroupARNs=[props["TargetGroupArn"]]
    )
    print(f"attached {props['TargetGroupArn']} to {group}")
    return {"PhysicalResourceId": f"{group}|{props['TargetGroupArn']}", "Data": {"GroupName": group}}
