"""`python -m service.cli`: the `seqserve` command."""

import sys

from service.cli import main

sys.exit(main())
