"""Image transforms, each with a stable identity string used in feature-cache keys and run records.

torchvision's transforms are imported without ``torchvision/__init__`` (:mod:`clbench.imports`): that would import
``torchvision.ops`` and through it ``torch._dynamo``, seconds a run never uses (the first other use of
``torchvision`` completes the package)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from clbench.imports import submodule

submodule("torchvision.transforms", defer=("torchvision",))
from torchvision import transforms as T  # noqa: E402  (after the package is registered uninitialised)


@dataclass(frozen=True)
class TransformSpec:
    """What a transform does, as data. ``train`` adds the reference augmentation."""

    img_size: int
    resize: int | None  # Resize(resize) then CenterCrop(img_size); None: Resize to img_size directly
    mean: tuple[float, ...] | None  # None: no normalisation (the TOSCA/PILOT reference code)
    std: tuple[float, ...] | None
    train: bool = False
    rrc_scale: tuple[float, float] = (0.05, 1.0)  # TOSCA reference RandomResizedCrop scale

    def identity(self) -> str:
        norm = (
            "none"
            if self.mean is None
            else "mean" + ",".join(f"{m:.4f}" for m in self.mean) + "std" + ",".join(f"{s:.4f}" for s in self.std or ())
        )
        if self.train:
            return f"train-rrc{self.img_size}-s{self.rrc_scale[0]}-{self.rrc_scale[1]}-hflip-{norm}"
        crop = f"resize{self.resize}-crop{self.img_size}" if self.resize else f"resize{self.img_size}"
        return f"eval-{crop}-bicubic-{norm}"

    def build(self) -> T.Compose:
        steps: list = []
        if self.train:
            steps += [
                T.RandomResizedCrop(self.img_size, scale=self.rrc_scale, interpolation=T.InterpolationMode.BICUBIC),
                T.RandomHorizontalFlip(),
            ]
        elif self.resize:
            steps += [T.Resize(self.resize, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(self.img_size)]
        else:
            steps += [T.Resize((self.img_size, self.img_size), interpolation=T.InterpolationMode.BICUBIC)]
        steps.append(T.ToTensor())
        if self.mean is not None:
            steps.append(T.Normalize(self.mean, self.std))
        return T.Compose(steps)


def to_tensor_batch(images: list, transform) -> torch.Tensor:
    return torch.stack([transform(im) for im in images])
