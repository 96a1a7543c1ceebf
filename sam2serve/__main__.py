"""``python -m sam2serve``: the same command line as the ``sam2serve`` script."""

import sys

from sam2serve.cli import main

sys.exit(main())
