"""``python -m service``: the same as the ``retrieval-monitor`` command."""

import sys

from service.commands.cli import main

sys.exit(main())
