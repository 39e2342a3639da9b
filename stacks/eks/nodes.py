"""One managed node group per serving profile: the profile's instance type, labelled and tainted for its pods only.

The AMI is EKS's Bottlerocket for the architecture, the NVIDIA variant for a GPU: "When using the EKS-optimized
Bottlerocket AMIs with NVIDIA GPUs, you don't need to install the NVIDIA Kubernetes device plugin, as it's already
included"; the AL2023 NVIDIA AMI would need the plugin as an add-on image ("Install Kubernetes device plugin for
GPUs", Amazon EKS User Guide, docs.amazonaws.cn). So no add-on image comes from outside the region.
A launch template adds what the node group's defaults lack: IMDSv2 only, with one hop (pods use their IAM roles, not
the node's), and an encrypted gp3 data volume (Bottlerocket's second volume, /dev/xvdb, holds containerd and the pods'
emptyDirs) sized for the model, the image and headroom.
"""

from __future__ import annotations

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from gguf_serve.catalog.fleet import RootVolume
from gguf_serve.catalog.hardware import Architecture, Hardware
from stacks.eks.node_role import node_role
from stacks.eks.workload import PROFILE_LABEL, ServingWorkload

DATA_DEVICE = "/dev/xvdb"  # Bottlerocket's data volume (Bottlerocket docs, "Storage")
_AMI = {
    (Architecture.ARM64, False): eks.NodegroupAmiType.BOTTLEROCKET_ARM_64,
    (Architecture.X86_64, False): eks.NodegroupAmiType.BOTTLEROCKET_X86_64,
    (Architecture.ARM64, True): eks.NodegroupAmiType.BOTTLEROCKET_ARM_64_NVIDIA,
    (Architecture.X86_64, True): eks.NodegroupAmiType.BOTTLEROCKET_X86_64_NVIDIA,
}


def ami_type(hardware: Hardware) -> eks.NodegroupAmiType:
    return _AMI[(hardware.architecture, hardware.has_gpu)]


class ServingNodes(Construct):
    """Exposes `nodegroup`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        workload: ServingWorkload,
        hardware: Hardware,
        volume: RootVolume,
        spot: bool = False,
    ) -> None:
        """
        cluster: the serving cluster.
        workload: the profile's pod (its name labels and taints the nodes, its model sizes the data volume).
        hardware: the instance type and architecture.
        volume: the data volume's throughput and IOPS, the image headroom.
        spot: Spot nodes (stacks/plan.py decides: CPU profiles only); default On-Demand.
        """
        super().__init__(scope, construct_id)
        data_gib = workload.model_gib + volume.image_headroom_gib
        template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            require_imdsv2=True,
            http_put_response_hop_limit=1,
            block_devices=[
                ec2.BlockDevice(
                    device_name=DATA_DEVICE,
                    volume=ec2.BlockDeviceVolume.ebs(
                        data_gib,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        encrypted=True,
                        iops=volume.volume_iops,
                        throughput=volume.volume_throughput_mibps,
                        delete_on_termination=True,
                    ),
                )
            ],
        )
        self.nodegroup = eks.Nodegroup(
            self,
            "Nodegroup",
            cluster=cluster,
            node_role=node_role(self),
            instance_types=[ec2.InstanceType(hardware.instance_type)],
            ami_type=ami_type(hardware),
            capacity_type=eks.CapacityType.SPOT if spot else eks.CapacityType.ON_DEMAND,
            launch_template_spec=eks.LaunchTemplateSpec(
                id=template.launch_template_id or "", version=template.latest_version_number
            ),
            min_size=workload.min_replicas,
            desired_size=workload.min_replicas,
            max_size=workload.max_replicas + 1,  # a rollout's surge pod needs a node of its own
            labels={PROFILE_LABEL: workload.name},
            taints=[eks.TaintSpec(effect=eks.TaintEffect.NO_SCHEDULE, key=PROFILE_LABEL, value=workload.name)],
            subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
        )
