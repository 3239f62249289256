"""`python -m agent …` runs the emmy-agent command line."""

import sys

from agent.cli import main

sys.exit(main())
