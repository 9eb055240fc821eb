"""`python -m leapp`: the command line (leapp/cli.py)."""
import sys

from .cli import main

sys.exit(main())
