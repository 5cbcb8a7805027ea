"""``python -m serving``: see :mod:`serving.model_servers.main`."""

import sys

from serving.model_servers.main import main

if __name__ == "__main__":
    sys.exit(main())
