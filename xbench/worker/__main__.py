"""`python -m xbench.worker`: the launcher starts each worker process this way."""

import sys

from xbench.worker.main import main

sys.exit(main())
