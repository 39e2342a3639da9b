"""The SageMaker model, endpoint configuration and endpoint: the serving image and the staged GGUF, isolated.

- Model: the image from the stack's ECR repository, the runtime spec in its Environment (the container reads it
  there: gguf_serve/container/sagemaker), the staged prefix as ModelDataSource (S3Prefix, CompressionType None:
  uncompressed files copied under /opt/ml/model), network isolation, the isolated subnets.
- Endpoint configuration: one variant on the profile's ml type, the health-check and download timeouts from its
  load budget, least-outstanding-requests routing (a slot is busy for a whole answer), the storage volume sized for
  the model and encrypted with the stack's KMS key (types with NVMe instance storage take neither: SageMaker
  encrypts that storage itself and refuses a KmsKeyId for it, CreateEndpointConfig KmsKeyId,
  https://docs.amazonaws.cn/sagemaker/latest/APIReference/API_CreateEndpointConfig.html).
- Endpoint: a fixed name, so that its log group (/aws/sagemaker/Endpoints/<name>) is this stack's, with retention.
The execution role holds what CreateModel's role needs ("SageMaker AI roles", CreateModel API: execution role
permissions, https://docs.amazonaws.cn/en_us/sagemaker/latest/dg/sagemaker-roles.html), narrowed to this stack.
"""

from __future__ import annotations

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from gguf_serve.catalog.hosting import SageMakerPlan
from gguf_serve.container.names import RUNTIME_SPEC_ENV
from gguf_serve.container.sagemaker import contract
from gguf_serve.container.spec import RuntimeSpec
from stacks.errors import PropsError
from stacks.nag import acknowledge
from stacks.principals import service_principal


class SageMakerEndpoint(Construct):
    """Exposes `endpoint_name`, `variant_name`, `endpoint` (CfnEndpoint), `model`, `role` and `log_group`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        endpoint_name: str,
        runtime: RuntimeSpec,
        plan: SageMakerPlan,
        image_uri: str,
        repository: ecr.IRepository,
        bucket: s3.IBucket,
        model_prefix_uri: str,
        model_key_prefix: str,
        subnets: list[str],
        security_group: ec2.ISecurityGroup,
    ) -> None:
        """
        endpoint_name: the endpoint's fixed name (gguf_serve.catalog.hosting.endpoint_name), at most 63 characters.
        runtime: the runtime spec the container reads from its Environment (at most 1024 characters of JSON).
        plan: the ml type, timeouts, volume and AMI version (gguf_serve.catalog.hosting.plan_sagemaker).
        image_uri, repository: the serving image and its ECR repository (stacks.image_build.ImageBuild).
        bucket, model_prefix_uri, model_key_prefix: where the GGUF is staged (stacks.sagemaker.staging).
        subnets, security_group: the isolated subnets and the endpoint's security group.
        """
        spec_json = runtime.to_json()
        _check_props(endpoint_name, spec_json, subnets)
        super().__init__(scope, construct_id)
        self.endpoint_name, self.variant_name = endpoint_name, contract.VARIANT_NAME
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            log_group_name=f"/aws/sagemaker/Endpoints/{endpoint_name}",
            retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.role = self._role(repository, bucket, model_key_prefix)
        self.model = sagemaker.CfnModel(
            self,
            "Model",
            execution_role_arn=self.role.role_arn,
            enable_network_isolation=True,
            vpc_config=sagemaker.CfnModel.VpcConfigProperty(
                subnets=subnets, security_group_ids=[security_group.security_group_id]
            ),
            primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
                image=image_uri,
                environment={
                    RUNTIME_SPEC_ENV: spec_json,
                    contract.ENDPOINT_ENV: endpoint_name,
                    contract.VARIANT_ENV: self.variant_name,
                },
                model_data_source=sagemaker.CfnModel.ModelDataSourceProperty(
                    s3_data_source=sagemaker.CfnModel.S3DataSourceProperty(
                        s3_uri=model_prefix_uri, s3_data_type="S3Prefix", compression_type="None"
                    )
                ),
            ),
        )
        self.model.node.add_dependency(self.role)  # the role's policy before SageMaker checks the image and data
        self.key = None if plan.volume_gb is None else kms.Key(self, "VolumeKey", enable_key_rotation=True)
        if self.key is not None:  # the volume's key: SageMaker uses it through grants on the endpoint's behalf
            self.key.grant(self.role, "kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey", "kms:CreateGrant",
                           "kms:DescribeKey")  # fmt: skip
        config = self._config(plan)
        self.endpoint = sagemaker.CfnEndpoint(
            self, "Endpoint", endpoint_name=endpoint_name, endpoint_config_name=config.attr_endpoint_config_name
        )
        self.endpoint.node.add_dependency(self.log_group)

    def _role(self, repository: ecr.IRepository, bucket: s3.IBucket, key_prefix: str) -> iam.Role:
        role = iam.Role(
            self, "ExecutionRole", assumed_by=service_principal(self, "sagemaker"),
            description="SageMaker: pull the serving image, read the staged GGUF, write the endpoint's logs",
        )  # fmt: skip
        repository.grant_pull(role)
        role.add_to_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[bucket.arn_for_objects(f"{key_prefix}/*")])
        )
        role.add_to_policy(  # S3Prefix: SageMaker lists the prefix to find the objects it copies
            iam.PolicyStatement(
                actions=["s3:ListBucket"], resources=[bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{key_prefix}/*"]}},
            )
        )  # fmt: skip
        self.log_group.grant_write(role)
        role.add_to_policy(
            iam.PolicyStatement(actions=["logs:DescribeLogStreams"], resources=[self.log_group.log_group_arn])
        )
        role.add_to_policy(iam.PolicyStatement(actions=["cloudwatch:PutMetricData"], resources=["*"]))
        # VpcConfig: SageMaker creates the endpoint's network interfaces in these subnets with this role.
        role.add_to_policy(
            iam.PolicyStatement(
                actions=[
                    "ec2:CreateNetworkInterface", "ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface",
                    "ec2:DeleteNetworkInterfacePermission", "ec2:DescribeNetworkInterfaces", "ec2:DescribeVpcs",
                    "ec2:DescribeDhcpOptions", "ec2:DescribeSubnets", "ec2:DescribeSecurityGroups",
                ],
                resources=["*"],
            )
        )  # fmt: skip
        stack = Stack.of(self)
        acknowledge(
            role,
            "AwsSolutions-IAM5",
            "PutMetricData and the EC2 network-interface calls SageMaker makes for VpcConfig take no resource-level "
            "permission (Resource *); ecr:GetAuthorizationToken neither; the S3 read is the staged prefix only; the "
            "log actions are this endpoint's log group only.",
            findings=[
                "Resource::*",
                f"Resource::<{stack.get_logical_id(bucket.node.default_child)}.Arn>/{key_prefix}/*",  # type: ignore[arg-type]
            ],
        )  # fmt: skip
        return role

    def _config(self, plan: SageMakerPlan) -> sagemaker.CfnEndpointConfig:
        variant = sagemaker.CfnEndpointConfig.ProductionVariantProperty(
            variant_name=self.variant_name,
            model_name=self.model.attr_model_name,
            instance_type=plan.ml_type,
            initial_instance_count=plan.min_instances,
            initial_variant_weight=1.0,
            container_startup_health_check_timeout_in_seconds=plan.startup_timeout_s,
            model_data_download_timeout_in_seconds=plan.download_timeout_s,
            volume_size_in_gb=plan.volume_gb,
            inference_ami_version=plan.inference_ami,
            routing_config=sagemaker.CfnEndpointConfig.RoutingConfigProperty(
                routing_strategy="LEAST_OUTSTANDING_REQUESTS"
            ),
        )
        config = sagemaker.CfnEndpointConfig(
            self, "Config", production_variants=[variant], kms_key_id=self.key.key_arn if self.key else None
        )
        if self.key is None:
            acknowledge(
                config,
                "AwsSolutions-SM2",
                f"{plan.ml_type} keeps the model on NVMe instance storage, which SageMaker encrypts in hardware; "
                "CreateEndpointConfig refuses a KmsKeyId for such types.",
            )
        return config


def _check_props(endpoint_name: str, spec_json: str, subnets: list[str]) -> None:
    if not 1 <= len(endpoint_name) <= 63 or not endpoint_name.replace("-", "").isalnum():
        raise PropsError(f"SageMaker endpoint name {endpoint_name!r}: 1-63 letters, digits and hyphens")
    if len(spec_json) > contract.ENV_VALUE_MAX:
        raise PropsError(
            f"SageMaker endpoint: the runtime spec is {len(spec_json)} characters; a model's Environment value takes "
            f"at most {contract.ENV_VALUE_MAX}: shorten the profile or model name"
        )
    if not subnets:
        raise PropsError("SageMaker endpoint: no subnets; pass the isolated subnets of the endpoint's VPC")
