import os
import sys

if sys.argv[1:2] == ["health"]:  # the HEALTHCHECK: the light path, without the rest of the launcher
    from gguf_serve.container.launch.health import main as health

    sys.exit(health(sys.argv[2:]))

from gguf_serve.container.sagemaker.mode import sagemaker_mode

if sagemaker_mode(sys.argv[1:], os.environ):  # `docker run <image> serve` on SageMaker
    from gguf_serve.container.sagemaker.serve import main as sagemaker

    sys.exit(sagemaker())

from gguf_serve.container.launch.cli import main

sys.exit(main())
