#!/usr/bin/env python3
"""End-to-end benchmark of pd-router against its floor and its peers (`./just bench-e2e`).

The code is bench/pdbench/e2e.py; `--help` lists the options."""

import sys

from pdbench.e2e import main

if __name__ == "__main__":
    sys.exit(main())
