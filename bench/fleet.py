#!/usr/bin/env python3
"""Fleet benchmark: a production trace through each router onto simulated GPU pods (`./just bench-fleet`).

The code is bench/pdbench/fleet.py; `--help` lists the options."""

import sys

from pdbench.fleet import main

if __name__ == "__main__":
    sys.exit(main())
