"""EksServingStack: one EKS cluster serving several profiles from the same image, lock and signals as the EC2 stacks.

Per profile: a managed node group (stacks/eks/nodes.py), the serving Deployment, Service and PodDisruptionBudget
(stacks/eks/manifests.py), the scaler (stacks/eks/scaler_objects.py) and an internal ALB on the Service's NodePort,
the same construct as the EC2 stacks' (allowed networks, certificate, access logs). Shared: the VPC, the cluster,
the model cache, the API key and one in-region image build per image target.
"""

from __future__ import annotations

from aws_cdk import Annotations, Aspects, CfnOutput, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from constructs import Construct

from gguf_serve.catalog import ServingProfile
from gguf_serve.catalog.images import DEFAULT_ARM64_BUILDER, DEFAULT_DEBIAN_MIRRORS
from gguf_serve.container.metrics import names as metric_names
from stacks.access_logs import AccessLogs
from stacks.api_key import ApiKey
from stacks.checkov import CheckovAcknowledgements
from stacks.eks.acknowledgements import acknowledge_cluster, acknowledge_pod_roles, nag_text
from stacks.eks.cluster import ServingCluster, control_target, kube_arch
from stacks.eks.manifests import WorkloadDeploy, serving_objects
from stacks.eks.monitoring import EksCostDashboard, ProfileCost
from stacks.eks.nodes import ServingNodes
from stacks.eks.scaler_guard import scaler_guard_objects
from stacks.eks.scaler_objects import ScalerDeploy, scaler_name, scaler_objects
from stacks.eks.targets import NodegroupTargets, managed_groups_arn
from stacks.eks.workload import NAMESPACE, ServingWorkload, node_port
from stacks.errors import PropsError
from stacks.fleet_cost import cost_basis
from stacks.image_build import ImageBuild
from stacks.load_balancer import InferenceLoadBalancer
from stacks.model_cache import ModelCache
from stacks.nag import acknowledge
from stacks.network import ServingNetwork
from stacks.plan import ServicePlan

STACK_NAME = "EksServingStack"


class EksServingStack(Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        plans: list[ServicePlan],
        availability_zones: list[str],
        certificate_arn: str | None = None,
        image_build_args: dict[str, str] | None = None,
        arm64_builder: str = DEFAULT_ARM64_BUILDER,
        debian_mirrors: tuple[str, ...] = DEFAULT_DEBIAN_MIRRORS,
        admin_role_arns: tuple[str, ...] = (),
        auto_mode_fields: bool = True,
        **kwargs,
    ) -> None:
        """plans: the serving profiles this cluster serves, one node group each (-c eksProfiles), each with the deploy
        options resolved against it (stacks/plan.py); the first one's network settings shape the VPC. The other props
        are the EC2 stacks' deploy options."""
        workloads = _check(plans)
        profiles = [p.profile for p in plans if p.profile is not None]
        super().__init__(
            scope, construct_id, description="llama.cpp GGUF serving on EKS: " + ", ".join(workloads), **kwargs
        )
        self._azs = availability_zones
        Aspects.of(self).add(CheckovAcknowledgements())
        network = ServingNetwork(self, "Network", settings=profiles[0].fleet.network)
        self.access_logs = AccessLogs(self, "AccessLogs")
        self.cache = ModelCache(self, "ModelCache", access_logs=self.access_logs.bucket)
        self.api_key = ApiKey(self, "ApiKey")
        control = control_target([p.image for p in profiles])
        self.serving = ServingCluster(
            self, "Cluster", name=construct_id, vpc=network.vpc, system_architecture=control.architecture,
            admin_role_arns=admin_role_arns, auto_mode_fields=auto_mode_fields,
        )  # fmt: skip
        images: dict[str, ImageBuild] = {}
        image_scope = Construct(self, "Image")  # one in-region build per image target the profiles use
        for target in dict.fromkeys(p.image for p in profiles):
            images[target.name] = ImageBuild(
                image_scope, target.name, target=target, build_args=image_build_args, arm64_builder=arm64_builder,
                debian_mirrors=debian_mirrors,
            )  # fmt: skip
        self.control_image = images[control.name]  # every scaler's, on the system nodes of its architecture
        # What a scaler may change in a pod, enforced by the API server before any scaler runs (scaler_guard.py)
        self.scaler_guard = self.serving.cluster.add_manifest("ScalerGuard", *scaler_guard_objects())
        # One endpoint for every profile (docs/eks.md, "One endpoint"): the first profile's load balancer, shared.
        self.names = {p.name: p.runtime().model.served_names for p in profiles}
        self.load_balancer = self._shared_load_balancer(plans[0], network.vpc, certificate_arn)
        self.target_groups: dict[str, elbv2.IApplicationTargetGroup] = {}
        self.costs: list[ProfileCost] = []  # each profile's live cost (its scaler publishes the usage)
        for i, plan in enumerate(plans):
            name = plan.profile.name if plan.profile else ""
            self._serve(Construct(self, name), plan, workloads[name], images[plan.image.name], i)
        self._route_models()
        self.monitoring = EksCostDashboard(self, "Monitoring", name=self.stack_name, profiles=self.costs)
        self._acknowledge()

    def _route_models(self) -> None:
        """Each model name to the target groups of the profiles that serve it, and the one endpoint's URL."""
        fleets: dict[str, list[elbv2.IApplicationTargetGroup]] = {}
        for profile_name, names in self.names.items():
            for model in names:
                fleets.setdefault(model, []).append(self.target_groups[profile_name])
        self.load_balancer.route_models(fleets)
        CfnOutput(self, "EndpointUrl", value=f"{self.load_balancer.url}/v1",
                  description="every profile's model: OpenAI-compatible URL (VPC); name the model in the body, or "
                  "send X-Gateway-Model-Name to skip a forward")  # fmt: skip

    def _serve(
        self,
        scope: Construct,
        plan: ServicePlan,
        w: ServingWorkload,
        image: ImageBuild,
        index: int,
    ) -> None:
        cluster = self.serving.cluster
        profile, f = plan.profile, plan.fleet
        assert profile is not None  # _check refused a plan without one
        nodes = ServingNodes(
            scope, "Nodes", cluster=cluster, workload=w, hardware=profile.hardware, volume=f.volume, spot=plan.spot,
            spot_instance_types=plan.capacity.spot_instance_types,
        )  # fmt: skip
        pods = self._account(scope, "PodRole", w.name)
        self.api_key.secret.grant_read(pods)
        objects = self.cache.bucket.arn_for_objects(f"{self.cache.prefix}*")
        pods.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"], resources=[objects]
            )
        )
        pods.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[self.cache.bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{self.cache.prefix}*"]}},
            )
        )
        port = node_port(index)
        group = self._target_group(scope, profile.name, nodes, port, index)
        # The hop's hooks take its node out of the target group before the drain and put it back at a start
        # (gguf_serve/container/kube/targets.py): that target group only, and DescribeInstances to find the node.
        pods.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["elasticloadbalancing:RegisterTargets", "elasticloadbalancing:DeregisterTargets"],
                resources=[group.target_group_arn],
            )
        )
        # A request naming another profile's model goes on to the shared load balancer's rule for it.
        own = self.names[profile.name]  # a model this profile serves too is served here, never forwarded
        routes = tuple(dict.fromkeys((n, self.load_balancer.route_url) for other, names in self.names.items()
                                     if other != profile.name for n in names if n not in own))  # fmt: skip
        pods.add_to_principal_policy(iam.PolicyStatement(actions=["ec2:DescribeInstances"], resources=["*"]))
        deploy = WorkloadDeploy(
            image=image.image_uri, architecture=kube_arch(image.target.architecture), region=self.region,
            api_key_secret_arn=self.api_key.secret.secret_arn, model_cache_url=self.cache.s3_url,
            service_account=w.name, node_port=port, target_group_arn=group.target_group_arn, routes=routes,
        )  # fmt: skip
        workload = cluster.add_manifest(f"{profile.name}-workload", *serving_objects(w, deploy))
        workload.node.add_dependency(pods, image.build, self.serving.namespace)
        scaler = self._account(scope, "ScalerRole", scaler_name(w))
        self.api_key.secret.grant_read(scaler)
        self._allow_scaling(scaler, nodes.nodegroup)
        usage_profile = f"{self.stack_name}/{profile.name}"
        scaler.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],  # no resource-level permission (Service Authorization Reference, CloudWatch)
                conditions={"StringEquals": {"cloudwatch:namespace": metric_names.NAMESPACE}},
            )
        )
        self.costs.append(ProfileCost(profile.name, usage_profile, cost_basis(profile, plan.hardware, spot=plan.spot),
                                      f.alarms.cost_multiple))  # fmt: skip
        acknowledge_pod_roles(
            scope,
            cache_objects=nag_text(self, objects),
            groups=nag_text(self, managed_groups_arn(self)),
        )
        control = self.control_image
        scaler_deploy = ScalerDeploy(
            image=control.image_uri, architecture=kube_arch(control.target.architecture), region=self.region,
            api_key_secret_arn=self.api_key.secret.secret_arn, service_account=scaler_name(w),
            cluster=cluster.cluster_name, nodegroup=nodes.nodegroup.nodegroup_name,
            fixed_nodes=0 if nodes.floor is None else w.min_replicas,  # the On-Demand floor, outside the scaled group
            usage_profile=usage_profile,
        )  # fmt: skip
        cluster.add_manifest(f"{profile.name}-scaler", *scaler_objects(w, scaler_deploy)).node.add_dependency(
            scaler, workload, control.build, self.scaler_guard
        )
        CfnOutput(scope, "ModelNames", value=", ".join(self.names[profile.name]),
                  description=f"{profile.name}: the model names its pods answer to at the shared endpoint")  # fmt: skip

    def _shared_load_balancer(
        self, plan: ServicePlan, vpc: ec2.IVpc, certificate_arn: str | None
    ) -> InferenceLoadBalancer:  # fmt: skip
        """The EC2 stacks' internal ALB construct, shared: the first profile's target group is its default (a client
        naming the model in the body only lands there, and that hop forwards what another profile serves), each
        profile's reached directly by the X-Gateway-Model-Name header; the hops forward on its route listener."""
        f = plan.fleet
        assert plan.profile is not None
        lb = InferenceLoadBalancer(
            self, "LoadBalancer", vpc=vpc, vpc_cidr=f.network.vpc_cidr, access_logs=self.access_logs.bucket,
            targets=[], target_port=node_port(0), settings=f.load_balancer, allowed_cidrs=plan.options.allowed_cidrs,
            certificate_arn=certificate_arn,
        )  # fmt: skip
        # The node groups' nodes are attached at deploy (stacks/eks/targets.py): instance targets, on the NodePort.
        lb.target_group.node.default_child.add_property_override("TargetType", "instance")  # type: ignore[union-attr]
        Annotations.of(lb.target_group).acknowledge_warning(
            "@aws-cdk/aws-elbv2:targetGroupSpecifyTargetTypeForEmptyTargetGroup", "TargetType set to instance above"
        )
        lb.share(self.serving.cluster.cluster_security_group)
        return lb

    def _target_group(
        self, scope: Construct, name: str, nodes: ServingNodes, port: int, index: int
    ) -> elbv2.IApplicationTargetGroup:  # fmt: skip
        """The profile's target group on its NodePort (the shared load balancer's default for the first profile),
        both node groups' nodes attached."""
        cluster, lb = self.serving.cluster, self.load_balancer
        if index == 0:
            group: elbv2.IApplicationTargetGroup = lb.target_group
        else:
            group = lb.add_fleet(scope, "TargetGroup", port=port)
        lb.security_group.connections.allow_to(cluster.cluster_security_group, ec2.Port.tcp(port), "NodePort")
        for nodegroup in nodes.groups:  # the Spot group's and the On-Demand floor's nodes alike
            suffix = "" if nodegroup is nodes.groups[0] else "Spot"
            NodegroupTargets(
                scope, f"Targets{suffix}", cluster_name=cluster.cluster_name, nodegroup=nodegroup,
                target_group=group,
            )  # fmt: skip
        self.target_groups[name] = group
        return group

    def _account(self, scope: Construct, construct_id: str, name: str) -> eks.ServiceAccount:
        """A service account in the serving namespace with its own IAM role (IRSA: Pod Identity is not offered in
        China, docs.amazonaws.cn "EKS Pod Identities")."""
        account = eks.ServiceAccount(
            scope, construct_id, cluster=self.serving.cluster, name=name, namespace=NAMESPACE,
            identity_type=eks.IdentityType.IRSA,
        )  # fmt: skip
        account.node.add_dependency(self.serving.namespace)
        return account

    def _allow_scaling(self, scaler: eks.ServiceAccount, nodegroup: eks.Nodegroup) -> None:
        groups = managed_groups_arn(self)
        scaler.add_to_principal_policy(
            iam.PolicyStatement(actions=["eks:DescribeNodegroup"], resources=[nodegroup.nodegroup_arn])
        )
        scaler.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
                resources=[groups],
            )
        )
        scaler.add_to_principal_policy(
            iam.PolicyStatement(actions=["autoscaling:DescribeAutoScalingGroups"], resources=["*"])
        )

    def _acknowledge(self) -> None:
        acknowledge_cluster(self.serving.cluster)
        acknowledge(
            self,
            "CloudFormation-Validate::W3010",
            "Zones are pinned on purpose in cdk.context.json: no lookup at synth, and the user picks zones that offer "
            "the instance type.",
        )

    @property
    def availability_zones(self) -> list[str]:
        return self._azs


def _check(plans: list[ServicePlan]) -> dict[str, ServingWorkload]:
    if not plans:
        raise PropsError(f"{STACK_NAME} serves no profile: name one or more, e.g. -c eksProfiles=graviton-moe")
    missing = [p.stack_name for p in plans if p.profile is None]
    if missing:
        raise PropsError(f"eksProfiles: {missing} have no locked model; lock it first")
    profiles: list[ServingProfile] = [p.profile for p in plans]  # type: ignore[misc]
    names = [p.name for p in profiles]
    if len(set(names)) != len(names):
        raise PropsError(f"eksProfiles: {names} names a profile twice")
    return {p.profile.name: ServingWorkload.of(p.profile, p.capacity) for p in plans}  # type: ignore[union-attr]
