import sys

from gguf_serve.container.kube.cli import main

sys.exit(main())
