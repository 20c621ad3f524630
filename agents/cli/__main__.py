"""``python -m orchestrl.agents.cli``: the ``orchestrl`` command without an installed entry point."""

import sys

from orchestrl.agents.cli import main

if __name__ == "__main__":  # importing this module (e.g. to check it imports) must not run the command
    sys.exit(main())
