"""`python -m bench.peers`: install the peers' virtual environments (see `bench.peers`)."""

import sys

from bench.peers import main

sys.exit(main())
