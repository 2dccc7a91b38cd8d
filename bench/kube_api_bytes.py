#!/usr/bin/env python3
"""API-server bytes per minute for pod discovery: list polling vs watches (`./just bench` runs it).

The code is bench/pdbench/kube_api_bytes.py; `--help` lists the options."""

import sys

from pdbench.kube_api_bytes import main

if __name__ == "__main__":
    sys.exit(main())
