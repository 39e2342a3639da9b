"""What the serving image runs in a Kubernetes pod beyond the launcher and the hop.

`python3 -m gguf_serve.container.kube api-key|serve|scale|lb-join|lb-leave`: write the API key from Secrets Manager
to a file on the pod's memory volume (an init container), start llama-server with that key in its environment (the
launcher, unchanged), the scaler: a small controller that sets a Deployment's replicas from llama.cpp's own load
signals and has the node group follow (gguf_serve/container/kube/scaler.py), and the hop container's hooks that put
its node in its target group and take it out before the drain (gguf_serve/container/kube/targets.py). Standard
library and boto3: it runs in the serving image, so the cluster needs no image from outside the region.
"""
