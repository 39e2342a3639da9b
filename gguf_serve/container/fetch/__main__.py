import sys

from gguf_serve.container.fetch.cli import main

sys.exit(main())
