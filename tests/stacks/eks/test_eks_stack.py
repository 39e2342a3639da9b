"""EksServingStack's template: the cluster, the node groups, the load balancers and what they may do. cdk-nag ran at
synth (conftest.py); cfn-lint and checkov run here on the same template."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stacks.eks.workload import FIRST_NODE_PORT, PROFILE_LABEL
from stacks.load_balancer import MODEL_HEADER, ROUTE_PORT
from tests.conftest import ROOT
from tests.stacks.eks.conftest import ADMIN, PROFILES, flat, kube_objects, resources

LISTENER = "AWS::ElasticLoadBalancingV2::Listener"


def test_the_cluster_is_private_logs_everything_and_encrypts_secrets(eks_template):
    [cluster] = resources(eks_template, "AWS::EKS::Cluster").values()
    assert cluster["Version"] == "1.35"
    vpc = cluster["ResourcesVpcConfig"]
    assert vpc["EndpointPrivateAccess"] is True and vpc["EndpointPublicAccess"] is False
    logged = {t["Type"] for t in cluster["Logging"]["ClusterLogging"]["EnabledTypes"]}
    assert logged == {"api", "audit", "authenticator", "controllerManager", "scheduler"}
    assert cluster["EncryptionConfig"][0]["Resources"] == ["secrets"]
    assert cluster["ComputeConfig"]["Enabled"] is False  # not Auto Mode
    assert cluster["AccessConfig"]["AuthenticationMode"] == "API"
    principals = [flat(e["PrincipalArn"]) for e in resources(eks_template, "AWS::EKS::AccessEntry").values()]
    assert ADMIN in principals


def test_one_bottlerocket_node_group_per_profile_labelled_and_tainted_for_its_pods(eks_template):
    groups = resources(eks_template, "AWS::EKS::Nodegroup").values()
    serving = {g["Labels"][PROFILE_LABEL]: g for g in groups if PROFILE_LABEL in g.get("Labels", {})}
    assert set(serving) == set(PROFILES)
    assert serving["graviton-moe"]["AmiType"] == "BOTTLEROCKET_ARM_64"
    assert serving["graviton-moe"]["InstanceTypes"] == ["c8g.4xlarge"]
    assert serving["gpu-mtp"]["AmiType"] == "BOTTLEROCKET_x86_64_NVIDIA"  # the device plugin is in the AMI
    for name, group in serving.items():
        assert group["Taints"] == [{"Effect": "NO_SCHEDULE", "Key": PROFILE_LABEL, "Value": name}]
        assert group["CapacityType"] == "ON_DEMAND"
        assert group["ScalingConfig"]["MaxSize"] == 5  # four pods and a rollout's surge
    templates = resources(eks_template, "AWS::EC2::LaunchTemplate").values()
    data = [t["LaunchTemplateData"] for t in templates]
    assert all(d["MetadataOptions"] == {"HttpPutResponseHopLimit": 1, "HttpTokens": "required"} for d in data)
    volumes = sorted(d["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] for d in data)
    assert volumes == [38, 44, 44]  # model + 2 GiB + the 20 GiB image headroom: the 27B (16.8 GB), the 35B (22.7 GB)
    assert all(d["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] is True for d in data)


def test_one_internal_alb_for_every_profile_each_on_its_node_port_for_the_allowed_network_with_tls(eks_template):
    [alb] = resources(eks_template, "AWS::ElasticLoadBalancingV2::LoadBalancer").values()
    assert alb["Scheme"] == "internal"
    groups = resources(eks_template, "AWS::ElasticLoadBalancingV2::TargetGroup")
    assert sorted(g["Port"] for g in groups.values()) == [FIRST_NODE_PORT + i for i in range(len(PROFILES))]
    assert all(g["TargetType"] == "instance" and g["HealthCheckPath"] == "/health" for g in groups.values())
    listeners = {(v["Protocol"], v["Port"]): v for v in resources(eks_template, LISTENER).values()}
    assert set(listeners) == {("HTTPS", 443), ("HTTP", ROUTE_PORT)}
    # A client naming the model in the body only lands on the first profile's pods (its hop forwards the rest)
    [default] = listeners[("HTTPS", 443)]["DefaultActions"]
    assert groups[default["TargetGroupArn"]["Ref"]]["Port"] == FIRST_NODE_PORT
    # The route listener: a name no fleet serves is OpenAI's 404, never a fleet's work
    [unrouted] = listeners[("HTTP", ROUTE_PORT)]["DefaultActions"]
    assert unrouted["FixedResponseConfig"]["StatusCode"] == "404"
    assert json.loads(unrouted["FixedResponseConfig"]["MessageBody"])["error"]["code"] == "model_not_found"
    [sg] = [sg for sg in resources(eks_template, "AWS::EC2::SecurityGroup").values() if "ALB" in sg["GroupDescription"]]
    assert [(r["CidrIp"], r["FromPort"]) for r in sg["SecurityGroupIngress"]] == [("10.8.0.0/16", 443)]
    rules = resources(eks_template, "AWS::EC2::SecurityGroupIngress").values()
    ingress = [i for i in rules if i["FromPort"] == ROUTE_PORT]
    # the forwards come from the nodes only (the cluster security group), no address range
    assert [flat(i["SourceSecurityGroupId"]) for i in ingress] == ["<ClusterC2E21B66.ClusterSecurityGroupId>"]
    assert all("CidrIp" not in i for i in ingress)
    attachments = resources(eks_template, "Custom::NodegroupTargets").values()
    assert len(attachments) == len(PROFILES)


def _served(template) -> dict[str, set[str]]:
    """Model name -> the profiles whose pods answer to it (each profile's ModelNames output)."""
    out: dict[str, set[str]] = {}
    for key, output in template["Outputs"].items():
        if "ModelNames" in key:
            profile = output["Description"].split(":")[0]
            for name in output["Value"].split(", "):
                out.setdefault(name, set()).add(profile)
    return out


def test_each_model_name_reaches_exactly_the_profiles_that_serve_it_on_both_listeners(eks_template):
    served = _served(eks_template)
    assert served["Qwen3.6-35B-A3B"] == {"graviton-moe", "intel-moe"} and served["Qwen3.6-27B"] == {"gpu-mtp"}
    port_of = {FIRST_NODE_PORT + i: p for i, p in enumerate(PROFILES)}
    groups = resources(eks_template, "AWS::ElasticLoadBalancingV2::TargetGroup")
    listeners = resources(eks_template, LISTENER)
    routed: dict[str, dict[str, set[str]]] = {name: {} for name in listeners}
    for rule in resources(eks_template, "AWS::ElasticLoadBalancingV2::ListenerRule").values():
        [condition] = rule["Conditions"]
        assert condition["HttpHeaderConfig"]["HttpHeaderName"] == MODEL_HEADER
        assert len(condition["HttpHeaderConfig"]["Values"]) <= 5  # ELB: condition values per rule
        [action] = rule["Actions"]
        refs = ([g["TargetGroupArn"]["Ref"] for g in action["ForwardConfig"]["TargetGroups"]]
                if "ForwardConfig" in action else [action["TargetGroupArn"]["Ref"]])  # fmt: skip
        if "ForwardConfig" in action:  # a model two fleets serve: each gets an equal share
            assert {g["Weight"] for g in action["ForwardConfig"]["TargetGroups"]} == {1}
        for name in condition["HttpHeaderConfig"]["Values"]:
            target = routed[rule["ListenerArn"]["Ref"]]
            assert name not in target, f"{name} routed twice"
            target[name] = {port_of[groups[r]["Port"]] for r in refs}
    assert list(routed.values()) == [served, served]


def test_each_hop_forwards_the_other_profiles_models_to_the_route_listener_and_serves_its_own(eks_template):
    served = _served(eks_template)
    deployments = {o["metadata"]["name"]: o for o in kube_objects(eks_template) if o["kind"] == "Deployment"}
    for profile in PROFILES:
        [hop] = [c for c in _containers(deployments[profile]) if c["name"] == "hop"]
        argv = [*hop.get("command", []), *hop.get("args", [])]
        routes = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--route")
        assert set(routes) == {name for name, profiles in served.items() if profile not in profiles}, profile
        assert set(routes.values()) == {f"http://<LoadBalancerAlb240B1141.DNSName>:{ROUTE_PORT}"}


def test_pods_get_aws_access_through_irsa_and_the_scaler_only_its_groups(eks_template):
    [provider] = resources(eks_template, "AWS::IAM::OIDCProvider").values()
    assert provider["ClientIdList"] == ["sts.amazonaws.com"]
    accounts = {o["metadata"]["name"]: o for o in kube_objects(eks_template) if o["kind"] == "ServiceAccount"}
    assert set(accounts) == {*PROFILES, *(f"{p}-scaler" for p in PROFILES)}
    assert all("eks.amazonaws.com/role-arn" in a["metadata"]["annotations"] for a in accounts.values())
    text = json.dumps(eks_template)
    assert "autoscaling:SetDesiredCapacity" in text and "autoScalingGroupName/eks-*" in text


def test_nothing_partition_or_registry_specific_is_hard_coded(eks_template):
    text = json.dumps(eks_template)
    for foreign in ("arn:aws:", "docker.io", "ghcr.io", "registry.k8s.io", "nvcr.io", "public.ecr.aws", "github"):
        assert foreign not in text, foreign
    images = {c["image"] for o in kube_objects(eks_template) if o["kind"] == "Deployment" for c in _containers(o)}
    # <account>.dkr.ecr.<region>.<URL suffix>/<repository>: the stack's own repositories, nothing else
    ecr = re.compile(
        r"^<select:<split:<Image(\w+)Repository\w+\.Arn>>>\.dkr\.ecr\.<select:[^/]+>\.<AWS::URLSuffix>/<Image\1Repository\w+>:"
    )
    assert images and all(ecr.match(i) for i in images), images


def _containers(deployment: dict) -> list[dict]:
    spec = deployment["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.mark.scan
def test_cfn_lint_finds_nothing(eks_assembly):
    out = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "--config-file", str(ROOT / ".cfnlintrc.yaml"), "--",
         str(eks_assembly)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.scan
def test_checkov_finds_nothing_unreasoned(eks_assembly, tmp_path):
    checkov = ROOT / ".venv-checkov" / "bin" / "checkov"
    (tmp_path / "eks.template.json").write_text(eks_assembly.read_text())
    out = subprocess.run(
        [str(checkov), "-d", str(tmp_path), "--framework", "cloudformation", "--quiet", "--compact", "-o", "json"],
        capture_output=True, text=True, timeout=600,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BC_SKIP_MAPPING": "TRUE"},
    )  # fmt: skip
    report = json.loads(out.stdout)
    assert report["results"]["failed_checks"] == []
    assert report["summary"]["passed"] > 400


@pytest.fixture(scope="module")
def spot_cluster(tmp_path_factory) -> dict:
    """A second cluster synth: -c spot=true and -c eksAutoModeFields=false, the Graviton profile alone."""
    from stacks.app import build_app
    from stacks.eks.stack import STACK_NAME
    from tests.conftest import cdk_context

    context = {**cdk_context(), "eksProfiles": "graviton-moe", "spot": "true", "eksAutoModeFields": "false"}
    app = build_app(context, config_file=tmp_path_factory.mktemp("spot") / "absent.toml", stack_names=[STACK_NAME])
    return app.synth().get_stack_by_name(STACK_NAME).template


def test_the_auto_mode_fields_can_be_left_out_of_create_cluster(spot_cluster):
    """-c eksAutoModeFields=false (docs/first-deploy.md, "Refused late"): the three fields are gone, nothing else."""
    [cluster] = resources(spot_cluster, "AWS::EKS::Cluster").values()
    assert not {"ComputeConfig", "StorageConfig"} & set(cluster)
    assert cluster["KubernetesNetworkConfig"] == {"IpFamily": "ipv4"}
    assert cluster["AccessConfig"]["AuthenticationMode"] == "API"


def test_on_spot_a_profile_gets_an_on_demand_floor_and_a_spot_group_of_several_types(spot_cluster):
    groups = [g for g in resources(spot_cluster, "AWS::EKS::Nodegroup").values()
              if g.get("Labels", {}).get(PROFILE_LABEL) == "graviton-moe"]  # fmt: skip
    by_type = {g["CapacityType"]: g for g in groups}
    assert set(by_type) == {"ON_DEMAND", "SPOT"}
    floor, spot = by_type["ON_DEMAND"], by_type["SPOT"]
    assert floor["ScalingConfig"] == {"MinSize": 1, "DesiredSize": 1, "MaxSize": 1}  # the profile's minimum
    assert spot["ScalingConfig"]["MinSize"] == 0 and spot["ScalingConfig"]["MaxSize"] == 4  # the rest, and a surge
    assert spot["InstanceTypes"] == ["c8g.4xlarge", "m8g.4xlarge"]  # fleet.spot_instance_types, as on EC2
    objects = kube_objects(spot_cluster)
    [scaler] = [o for o in objects if o["kind"] == "Deployment" and "scaler" in o["metadata"]["name"]]
    command = scaler["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--fixed-nodes") + 1] == "1"  # it sizes the Spot group for the pods above the floor
    [spot_id] = [k for k, v in resources(spot_cluster, "AWS::EKS::Nodegroup").items() if v is spot]
    assert command[command.index("--nodegroup") + 1] == f"<{spot_id}.NodegroupName>"
    attached = [flat(p["Nodegroup"]) for p in resources(spot_cluster, "Custom::NodegroupTargets").values()]
    assert len(attached) == 2  # both groups' nodes behind the load balancer


def test_each_serving_pod_may_move_its_node_in_and_out_of_its_own_target_group_only(eks_template):
    """The hop's hooks (gguf_serve/container/kube/targets.py): Register/DeregisterTargets on the profile's target
    group, no other; its preStop takes the node out before the drain, its postStart puts it back."""
    groups = resources(eks_template, "AWS::ElasticLoadBalancingV2::TargetGroup")
    deployments = {o["metadata"]["name"]: o for o in kube_objects(eks_template) if o["kind"] == "Deployment"}
    policies = resources(eks_template, "AWS::IAM::Policy").values()
    for name in PROFILES:
        [hop] = deployments[name]["spec"]["template"]["spec"]["containers"]
        leave = hop["lifecycle"]["preStop"]["exec"]["command"]
        join = hop["lifecycle"]["postStart"]["exec"]["command"]
        assert leave[3] == "lb-leave" and join[3] == "lb-join"
        target = leave[leave.index("--target-group") + 1]
        assert target == join[join.index("--target-group") + 1] and target.strip("<>").split(".")[0] in groups
        assert leave[leave.index("--") + 1 :][:3] == ["python3", "-m", "gguf_serve.container.hop.pod"]  # then drain
        assert {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}} in hop["env"]
        statements = [s for p in policies for s in p["PolicyDocument"]["Statement"]
                      if "elasticloadbalancing:DeregisterTargets" in s["Action"]]  # fmt: skip
        assert len(statements) == len(PROFILES)
        assert all(isinstance(s["Resource"], dict) and "Ref" in s["Resource"] for s in statements)  # one group each


def _dashboard_body(template) -> dict:
    [board] = [r for r in template["Resources"].values() if r["Type"] == "AWS::CloudWatch::Dashboard"]
    return json.loads(re.sub(r"<[^>]+>", "X", flat(board["Properties"]["DashboardBody"])))


def test_each_profile_shows_its_live_cost_from_what_its_scaler_publishes(eks_template):
    """The dashboard reads, per profile, the EksProfile its scaler publishes under (--usage-profile), priced as the
    EC2 dashboards price (tests/stacks/constructs/test_fleet_cost.py evaluates that math); the scaler may put metrics
    into the project's namespace only."""
    from gguf_serve.container.metrics import names
    from tests.stacks.constructs.test_fleet_cost import evaluate

    board = _dashboard_body(eks_template)
    priced = [w for w in board["widgets"] if w["properties"].get("title", "").startswith("¥ per million")]
    assert len(priced) == len(PROFILES)
    deployments = {o["metadata"]["name"]: o for o in kube_objects(eks_template) if o["kind"] == "Deployment"}
    for profile, widget in zip(PROFILES, priced, strict=True):
        [scaler] = deployments[f"{profile}-scaler"]["spec"]["template"]["spec"]["containers"]
        argv = scaler["command"]
        published = argv[argv.index("--usage-profile") + 1]
        assert published == f"EksServingStack/{profile}"
        rows = widget["properties"]["metrics"]
        read = {(r[1], r[3]) for r in rows if isinstance(r[0], str)}
        assert read == {(names.SERVING_NODES, published), (names.OUTPUT_TOKENS, published)}
        daily = next(r[0]["expression"] for r in rows if isinstance(r[0], dict) and "daily" in r[0]["label"])
        hourly = float(re.search(r"units_d \* ([0-9.]+) \* 24", daily).group(1))
        # two nodes all day, 1,000,000 tokens: 48 node-hours at the type's price
        assert evaluate(daily, {"units_d": 2, "tokens_d": 1e6}) == pytest.approx(hourly * 48)
    statements = [
        s for p in resources(eks_template, "AWS::IAM::Policy").values() for s in p["PolicyDocument"]["Statement"]
        if "cloudwatch:PutMetricData" in json.dumps(s["Action"])
    ]  # fmt: skip
    assert len(statements) == len(PROFILES)
    assert all(s["Condition"] == {"StringEquals": {"cloudwatch:namespace": names.NAMESPACE}} for s in statements)
