#!/usr/bin/env python3
"""End-to-end serving benchmark: lmsp against llama-server, same model, same load.

The code is the package ``bench/serving/``; ``--help`` describes the command line.

    python bench/serve.py --models smollm2-135m-instruct --servers llama,lmsp --clients 1,4,16,64
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the serving package and its neighbours

from serving.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
