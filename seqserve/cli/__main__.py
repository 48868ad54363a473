"""`python -m seqserve.cli`: the `seqserve` command (as `python -m seqserve`)."""

import sys

from seqserve.cli import main

sys.exit(main())
