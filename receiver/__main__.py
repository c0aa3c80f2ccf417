"""``python -m receiver`` is the ``receiver`` command."""

import sys

from receiver.cli import main

sys.exit(main())
