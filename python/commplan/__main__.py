"""python3 -m commplan: see commplan/cli.py (python3 -m commplan --help)."""
import sys

from .cli import main

sys.exit(main())
