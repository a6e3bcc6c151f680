"""The estimator's old module path, kept for callers from before it became the package
coloader.estimator: `python3 -m coloader.estimate ...` runs `python3 -m coloader.estimator ...`,
and `from coloader.estimate import estimate, estimate_module` still works. New code uses
coloader.estimator; the estimator's internals are in coloader.estimator.core. Importing coloader
does not import this module.
"""

import sys

from .estimator import (  # noqa: F401
    CALIBRATION, OPTIMIZERS, PRECISIONS, Estimate, EstimateError, __all__, estimate, estimate_module)

if __name__ == "__main__":
    from .estimator.core import main

    sys.exit(main())
