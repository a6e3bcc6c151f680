"""coloader.estimator: the GPU memory and SM activity of a training job, estimated without a GPU.

    python3 -m coloader.estimator --model torchvision:resnet50 --batch-size 128 --json

    from coloader.estimator import estimate
    e = estimate("torchvision:resnet50", batch_size=128, optimizer="sgd", precision="bf16-amp")

A product of its own beside the Loader: `import coloader` does not import it, and it imports
nothing of the Loader side. The planner (`coloader plan`, `launch`) runs it as a subprocess for
jobs whose memory is "auto". core.py puts the estimate together and is the command line;
memtrace.py traces a step on the meta device, workspaces.py adds the GPU libraries' workspaces
(from conv_workspaces_h200.csv.gz), activity.py the step time and SM activity, zoo.py (and
lm.py) build the models it knows by name. docs/ESTIMATOR.md says how and how well.

Importing this package does not import torch; estimating does.
"""

from .core import CALIBRATION, OPTIMIZERS, PRECISIONS, Estimate, EstimateError, estimate, estimate_module

__all__ = ["CALIBRATION", "OPTIMIZERS", "PRECISIONS", "Estimate", "EstimateError", "estimate", "estimate_module"]
