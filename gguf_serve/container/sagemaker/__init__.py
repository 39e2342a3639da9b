"""The image as a SageMaker real-time endpoint's container: `docker run <image> serve` on SageMaker.

`mode` tells a SageMaker start from the EC2 one; `serve` runs it: the front (`front`: the hop with /ping and
/invocations mapped onto llama-server, routes from `routes`) listens at once, the one GGUF under /opt/ml/model is
checked against the lock (`model`), llama-server starts behind the front, metrics go to CloudWatch through the log
(`emf`), and SIGTERM drains. `contract` holds SageMaker's facts with their sources. Standard library and the
image's own packages only.
"""
