import sys

from modelfetch.cli import main

sys.exit(main())
