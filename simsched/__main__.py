"""``python -m simsched``: the ``simsched`` command."""

import sys

from simsched.cli import main

sys.exit(main())
