#!/usr/bin/env python3
"""The decider's bench rows: what not splitting saves, at c=1 (`./just bench-e2e` runs it after run.py).

The code is bench/pdbench/decider.py; `--help` lists the options."""

import sys

from pdbench.decider import main

if __name__ == "__main__":
    sys.exit(main())
