#!/usr/bin/env python3
"""The prepared GPU check: CUDA build, real-shaped random models, costs and exactness on the GPU.

The steps live in ``benchmarks/gpucheck/`` (see its docstring for the modes); this file is the
command to run.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpucheck.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
