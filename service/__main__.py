"""``python -m service``: the same as the ``retrieval-monitor`` command."""

import sys

from service.cli import main

sys.exit(main())
