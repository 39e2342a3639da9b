import sys

from gguf_serve.local.workstation.cli import main

sys.exit(main())
