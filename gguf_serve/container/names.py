"""Every name and number that two processes must agree on, in one place.

The stack (IAM conditions, lifecycle hook, metric namespace), the boot script (paths, units, the API key
file), the image (user, port, where the packages live), the launcher, the fetcher and the metrics publisher
all read these. The names are model-neutral: the tool serves any GGUF, so nothing here names a model family.
Files that cannot import Python (Dockerfiles, shell) are checked against this module by tests.

Renamed from the `qwen36` names of earlier releases; docs/upgrading.md says what that means for a running
deploy.
"""

from __future__ import annotations

PRODUCT = "gguf-serve"

# The container image (docker/app.Dockerfile, docker/bootstrap-base.sh)
CONTAINER_UID = 10001  # the non-root user every container runs as; owns the model folder on the host
APP_DIR = f"/opt/{PRODUCT}"  # the runtime packages; their wheels in APP_DIR/site
SERVER_PORT = 8080  # what clients and the ALB reach: the latency hop on an instance, llama-server where none runs
# llama-server listens on SERVER_PORT inside its container (the runtime spec's port); on an instance that port is
# published on the host's loopback only, here, and the latency hop (the hop) in front of it takes SERVER_PORT.
UPSTREAM_PORT = 8081

# The instance's file system (userdata/templates/boot.sh.j2) and the containers' view of it
CONFIG_DIR = f"/etc/{PRODUCT}"  # host; mounted read-only at the same path in every container
RUNTIME_SPEC_PATH = (
    f"{CONFIG_DIR}/runtime.json"  # gguf_serve.container.spec.RuntimeSpec, the only profile an instance gets
)
# Where no file can be mounted (a SageMaker model), the runtime spec's JSON travels in this variable instead
RUNTIME_SPEC_ENV = "GGUF_SERVE_RUNTIME_SPEC"
# The port SageMaker gives the container (gguf_serve/container/sagemaker/contract.py says where that is written)
SAGEMAKER_PORT_ENV = "SAGEMAKER_BIND_TO_PORT"
HOST_MODEL_DIR = f"/opt/{PRODUCT}/models"
CONTAINER_MODEL_DIR = "/models"
RUN_DIR = f"/run/{PRODUCT}"  # tmpfs, 0700: the API key, written at each server start
API_KEY_ENV_FILE = f"{RUN_DIR}/api.env"
API_KEY_ENV = "LLAMA_API_KEY"  # the variable llama-server itself reads; the key never goes in argv
BOOT_LOG = f"/var/log/{PRODUCT}-boot.log"
BOOT_TAG = f"{PRODUCT}-boot"  # syslog tag and the prefix of every boot step line

# systemd units and helper scripts on the instance
SERVER_UNIT = f"{PRODUCT}-llama"
READY_UNIT = f"{PRODUCT}-ready"
METRICS_UNIT = f"{PRODUCT}-metrics"
HOP_UNIT = f"{PRODUCT}-hop"  # the hop: TTFT, inter-token and queue-wait histograms
API_KEY_SCRIPT = f"/usr/local/bin/{PRODUCT}-api-key"

# AWS names
METRICS_NAMESPACE = "GgufServe/LlamaServer"  # CloudWatch; the IAM condition on PutMetricData names it
# The lifecycle hooks live in the group's own LifecycleHookSpecificationList (stacks/fleet.py). They were separate
# AWS::AutoScaling::LifecycleHook resources named gguf-serve-ready and gguf-serve-drain: new names, so that the
# update's cleanup, which deletes the old resources' hooks by name, cannot delete the group's (docs/upgrading.md).
LIFECYCLE_HOOK = f"{PRODUCT}-launch-ready"  # launch hook the instance completes once /health answers 200
LEGACY_LIFECYCLE_HOOK = f"{PRODUCT}-ready"  # the launch hook's name before; completed too, for the upgrade's update
DRAIN_HOOK = f"{PRODUCT}-terminate-drain"  # termination hook the hop completes when its streams are done (drain.py)
# The hop records a heartbeat on the drain hook this often while streams run; the hook's timeout is three of these,
# so a hop that died releases the instance within minutes while a live one holds it up to the drain deadline.
DRAIN_HEARTBEAT_S = 60

# This machine: llama-server builds, staged image sources, test tiers (outside the checkout)
LOCAL_CACHE = PRODUCT  # under $XDG_CACHE_HOME or ~/.cache; $LLAMA_SERVER_CACHE overrides the whole path
