"""torchvision's classification reference recipe for ResNet-50 (references/classification:
--auto-augment ta_wide --random-erase 0.1 --train-crop-size 176), as a Python recipe file:

    python -m coloader serve --data /data/imagenet/train --name imagenet --device cuda:0 \
        --transform examples/recipes/reference.py

coloader runs its translation natively (python -c "import coloader.transforms as t, runpy;
print(t.to_json(runpy.run_path('examples/recipes/reference.py')['transform'], indent=1))").
"""
import torch
import torchvision.transforms as T

transform = T.Compose([
    T.RandomResizedCrop(176, interpolation=T.InterpolationMode.BILINEAR),
    T.RandomHorizontalFlip(0.5),
    T.TrivialAugmentWide(interpolation=T.InterpolationMode.NEAREST),
    T.PILToTensor(),
    T.ConvertImageDtype(torch.float),
    T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    T.RandomErasing(p=0.1),
])
