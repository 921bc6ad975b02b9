"""`python -m labkit.cli …` is the `labkit` command."""

import sys

from labkit.cli.main import main

sys.exit(main())
