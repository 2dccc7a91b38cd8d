#!/usr/bin/env python3
"""The no-hop rows (`./just bench-nohop`): pd-router against an endpoint picker over
ext_proc and vllm-router, long prompts at high concurrency.

The code is bench/pdbench/nohop.py; `--help` lists the options."""

import sys

from pdbench.nohop import main

if __name__ == "__main__":
    sys.exit(main())
