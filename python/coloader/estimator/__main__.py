"""`python3 -m coloader.estimator --model M --batch-size B ...`: the estimator's command line
(coloader.estimator.core.main; `--help` lists the options)."""

import sys

from .core import main

if __name__ == "__main__":
    sys.exit(main())
