"""`python -m seqserve`: the `seqserve` command."""

import sys

from seqserve.cli import main

sys.exit(main())
