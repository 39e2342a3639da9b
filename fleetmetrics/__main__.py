import sys

from fleetmetrics.cli import main

sys.exit(main())
