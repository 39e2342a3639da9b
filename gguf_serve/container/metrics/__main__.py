import sys

from gguf_serve.container.metrics.cli import main

sys.exit(main())
