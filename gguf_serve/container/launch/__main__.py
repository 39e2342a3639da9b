import sys

if sys.argv[1:2] == ["health"]:  # the HEALTHCHECK: the light path, without the rest of the launcher
    from gguf_serve.container.launch.health import main as health

    sys.exit(health(sys.argv[2:]))

from gguf_serve.container.launch.cli import main

sys.exit(main())
