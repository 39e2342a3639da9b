import sys

from gguf_serve.container.hop.cli import main

sys.exit(main())
