import sys

if sys.argv[1:2] == ["health"]:  # the HEALTHCHECK: the light path, without the rest of the launcher
    from launcher.health import main as health

    sys.exit(health(sys.argv[2:]))

from launcher.cli import main

sys.exit(main())
