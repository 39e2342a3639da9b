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
    """Exposes `nodegroup` (the group the scaler sizes: the Spot group on Spot) and `floor` (on Spot, the On-Demand
    group that holds the profile's minimum; None otherwise), and `groups` (both, or the one)."""

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
        spot_instance_types: tuple[str, ...] = (),
    ) -> None:
        """
        cluster: the serving cluster.
        workload: the profile's pod (its name labels and taints the nodes, its model sizes the data volume).
        hardware: the instance type and architecture.
        volume: the data volume's throughput and IOPS, the image headroom.
        spot: Spot nodes above an On-Demand floor (stacks/plan.py decides: CPU profiles only); default On-Demand.
        spot_instance_types: the Spot group's other types (the profile's fleet.spot_instance_types, of the same
            shape: checked at load), beside the profile's own.
        """
        super().__init__(scope, construct_id)
        data_gib = workload.model_gib + volume.image_headroom_gib
        self._template = ec2.LaunchTemplate(
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
        self._cluster, self._workload, self._hardware = cluster, workload, hardware
        self._role = node_role(self)
        most = workload.max_replicas + 1  # a rollout's surge pod needs a node of its own
        self.floor: eks.Nodegroup | None = None
        if spot:
            # As the EC2 stacks do (stacks/fleet.py): the pods a deploy waits for on On-Demand nodes, so an empty
            # Spot pool never stalls it, and the rest on Spot over several types of the same shape. A managed node
            # group has one capacity type ("Managed node group capacity types", Amazon EKS User Guide,
            # docs.amazonaws.cn), so the floor is a group of its own, at a fixed size; the scaler sizes the Spot one.
            floor = workload.min_replicas
            self.floor = self._group("Nodegroup", eks.CapacityType.ON_DEMAND, (), floor, floor, floor)
            types = tuple(dict.fromkeys((hardware.instance_type, *spot_instance_types)))
            self.nodegroup = self._group("SpotNodegroup", eks.CapacityType.SPOT, types[1:], 0, 0, most - floor)
        else:
            self.nodegroup = self._group(
                "Nodegroup", eks.CapacityType.ON_DEMAND, (), workload.min_replicas, workload.min_replicas, most
            )
        self.groups = tuple(g for g in (self.floor, self.nodegroup) if g is not None)

    def _group(
        self, construct_id: str, capacity: eks.CapacityType, others: tuple[str, ...], low: int, desired: int, high: int
    ) -> eks.Nodegroup:
        w = self._workload
        return eks.Nodegroup(
            self,
            construct_id,
            cluster=self._cluster,
            node_role=self._role,
            instance_types=[ec2.InstanceType(t) for t in (self._hardware.instance_type, *others)],
            ami_type=ami_type(self._hardware),
            capacity_type=capacity,
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self._template.launch_template_id or "", version=self._template.latest_version_number
            ),
            min_size=low,
            desired_size=desired,
            max_size=high,
            labels={PROFILE_LABEL: w.name},
            taints=[eks.TaintSpec(effect=eks.TaintEffect.NO_SCHEDULE, key=PROFILE_LABEL, value=w.name)],
            subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
        )
