"""SageMaker's container contract for real-time endpoints, as the image meets it: every fact with its source.

Sources (AWS China documentation first; the same text is on docs.aws.amazon.com):
- SM-CODE: SageMaker Developer Guide, "Custom Inference Code with Hosting Services",
  https://docs.amazonaws.cn/en_us/sagemaker/latest/dg/your-algorithms-inference-code.html
- SM-PIPE: "Run Real-time Predictions with an Inference Pipeline",
  https://docs.amazonaws.cn/en_us/sagemaker/latest/dg/inference-pipeline-real-time.html
- SM-INVOKE: SageMaker Runtime API Reference, InvokeEndpoint,
  https://docs.amazonaws.cn/sagemaker/latest/APIReference/API_runtime_InvokeEndpoint.html
- SM-CONTAINER: API Reference, ContainerDefinition,
  https://docs.amazonaws.cn/sagemaker/latest/APIReference/API_ContainerDefinition.html
Standard library only: the image ships this folder.
"""

from __future__ import annotations

from gguf_serve.container.names import SAGEMAKER_PORT_ENV

# SM-CODE: "SageMaker AI runs the container as: docker run image serve" (the argument replaces the image's CMD).
SERVE_ARGV = ("serve",)
# SM-INVOKE: every InvokeEndpoint is signed (SigV4) and authorized by IAM before SageMaker forwards it; with network
# isolation nothing else reaches the container. That is the front's gate: it checks no API key of its own.
IAM_GATE = "SageMaker's IAM (InvokeEndpoint is SigV4-signed; network isolation)"
# SM-CODE: a web server answering POST /invocations and GET /ping on port 8080.
PING = "/ping"
INVOCATIONS = "/invocations"
DEFAULT_PORT = 8080
# SM-PIPE: where the image carries LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true, the
# container listens on SAGEMAKER_BIND_TO_PORT; "If this environment variable isn't present, containers default to
# using port 8080". A second port (here llama-server's) comes from the range in SAGEMAKER_SAFE_PORT_RANGE.
BIND_PORT_LABEL = "com.amazonaws.sagemaker.capabilities.accept-bind-to-port"
BIND_PORT_ENV = SAGEMAKER_PORT_ENV  # also read by the image's HEALTHCHECK (launch/health.py)
SAFE_PORT_RANGE_ENV = "SAGEMAKER_SAFE_PORT_RANGE"
# SM-CODE: "The request timeout on /ping attempts is 2 seconds"; the container "must accept socket connection
# requests within 250 ms": the front binds before the model is checked or loaded.
PING_TIMEOUT_S = 2.0
# SM-CODE: on scale-in or an update, "The command sends the SIGTERM signal, then it sends the SIGKILL signal thirty
# seconds later."
SIGKILL_AFTER_S = 30.0
# SM-CODE: SageMaker copies the model data to /opt/ml/model before the container starts (S3Prefix: every object
# under the prefix, by its key below it).
MODEL_DIR = "/opt/ml/model"
# SM-INVOKE: SageMaker strips request headers InvokeEndpoint does not support; this one passes (1024 visible
# US-ASCII characters at most). Header names reach the container in any case: compare them lowercased.
CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"
CUSTOM_ATTRIBUTES_MAX = 1024
# SM-INVOKE: "A customer's model containers must respond to requests within 60 seconds" (InvokeEndpoint);
# longer answers go through InvokeEndpointWithResponseStream.
SYNC_ANSWER_S = 60
# SM-CONTAINER: Environment, "Each key and value ... can have length of up to 1024" (China page: 16 entries; the
# global page says 100). The runtime spec travels as one value, so it must fit one.
ENV_VALUE_MAX = 1024
ENV_ENTRIES_MAX = 16

# Set in the model's Environment by the stack (stacks/sagemaker/endpoint.py), read here.
ENDPOINT_ENV = "GGUF_SERVE_ENDPOINT_NAME"  # the EndpointName dimension of the container's metrics
VARIANT_ENV = "GGUF_SERVE_VARIANT_NAME"  # the VariantName dimension
VARIANT_NAME = "AllTraffic"  # the one production variant each stack's endpoint has
