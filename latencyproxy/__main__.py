import sys

from latencyproxy.cli import main

sys.exit(main())
