"""``python -m receiver.cli`` is the ``receiver`` command too."""

import sys

from receiver.cli import main

sys.exit(main())
