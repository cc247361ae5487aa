"""``python -m transfer_agent.cli``: the ``fstream`` command."""

from __future__ import annotations

import sys

from transfer_agent.cli.main import main

sys.exit(main())
