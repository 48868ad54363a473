"""`python -m seqserve.service.cli`: the `seqserve` command."""

import sys

from seqserve.service.cli import main

sys.exit(main())
