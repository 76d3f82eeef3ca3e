"""The literature's benchmarks as presets, plus ``folder`` for any train/test ImageFolder tree of your own.

Splits are TOSCA's (official configs ``exps/tosca_*.json``: CIFAR-100 B0 Inc5, CUB-200 B0 Inc10, ImageNet-R and
ImageNet-A B0 Inc20, OmniBenchmark B0 Inc30, VTAB B0 Inc10); class counts and folder layouts are PILOT's
(LAMDA-PILOT ``utils/data.py``). The class order is the literature's ``np.random.seed(1993);
np.random.permutation(n)`` over the sorted class names (ImageFolder order), applied by ``build_benchmark``.

Transforms are the reference code's: train RandomResizedCrop(224, scale 0.05-1) + horizontal flip, eval
Resize(256, bicubic) + CenterCrop(224), ToTensor only, no mean/std normalisation (``--normalize`` applies the
backbone's). The default backbone is TOSCA's ViT-B/16 IN-21k.

Choices not fixed by TOSCA (deviations to state in results):
- ObjectNet (200 classes in PILOT) is not in TOSCA's experiments: B0 Inc20 (10 tasks), the split TOSCA uses for the
  other 200-class ImageFolder sets (ImageNet-R/A).
- EuroSAT (10 classes, the paper's out-of-distribution set): no published split or class-incremental config; B0 Inc2
  (5 tasks, as many as VTAB's); B0 Inc5 would leave a single incremental step.
- ``folder``: classes discovered; B0 Inc10 by default, so a tree with fewer than 10 classes needs ``--init-cls``.

Torch-free: importing this module only builds specs.
"""

from __future__ import annotations

from typing import Any

from clbench.benchmarks.base import BenchmarkSpec
from clbench.benchmarks.folder import LAYOUT, TreeLoader
from clbench.benchmarks.registry import register

PAPER_BACKBONE = "vit_base_patch16_224.augreg_in21k"  # TOSCA's vit_base_patch16_224_in21k
REFERENCE_TF = {"img_size": 224, "resize": 256, "normalize": False}  # Resize 256 + CenterCrop 224, no mean/std
PILOT_DATASETS = "the LAMDA-PILOT README (section 'Datasets')"
PILOT_LICENCE = (
    "the original data set's terms; PILOT's README: the subsets are sampled from the original data sets and its "
    "author has no right to redistribute them"
)


def _tree_layout(n: int, pilot_dir: str) -> str:
    return (
        f"unpack it so that DIR/train/<class>/<image> and DIR/test/<class>/<image> hold the same {n} class "
        f"folders (PILOT reads {pilot_dir}/train and {pilot_dir}/test); pass --data-root DIR"
    )


def register_preset(
    module: str,
    name: str,
    summary: str,
    n: int,
    init_cls: int,
    source_info: str,
    licence: str,
    transform: dict[str, Any],
    domains: tuple[str, ...] = (),
    shared_test: bool = False,
) -> None:
    """Register a literature benchmark read from a data root (``--data-root`` or ``CLBENCH_<NAME>``) on the papers'
    backbone: its loader is ``module:load_<name>``, its tasks B0 with ``init_cls`` classes each, ``transform`` the
    reference's evaluation transform (``img_size``, ``resize``, ``normalize``)."""
    register(
        BenchmarkSpec(
            name=name,
            summary=summary,
            load=f"{module}:load_{name.replace('-', '_')}",
            init_cls=init_cls,
            increment=init_cls,
            backbone=PAPER_BACKBONE,
            n_classes=n,
            data_env="CLBENCH_" + name.replace("-", "_").upper(),
            needs_data_root=True,
            source_info=source_info,
            licence=licence,
            domains=domains,
            shared_test=shared_test,
            **transform,
        )
    )


def _tree_preset(name: str, summary: str, n: int, init_cls: int, source_info: str, licence: str = PILOT_LICENCE):
    register_preset(__name__, name, summary, n, init_cls, source_info, licence, REFERENCE_TF)


# ------------------------------------------------------------------------------------------------ CIFAR-100
register(
    BenchmarkSpec(
        name="cifar100",
        summary="CIFAR-100, official 50k/10k split, 100 classes, 32 px upsampled (TOSCA: B0 Inc5, 20 tasks)",
        load="clbench.benchmarks.cifar:load",
        init_cls=5,  # TOSCA exps/tosca_cifar.json; PILOT's SimpleCIL/L2P configs use B0 Inc10 (--init-cls/--increment)
        increment=5,
        backbone=PAPER_BACKBONE,
        n_classes=100,
        data_env="CLBENCH_CIFAR100",
        source_info=(
            "CIFAR-100 (Krizhevsky 2009, https://www.cs.toronto.edu/~kriz/cifar.html); "
            "the LAMDA-PILOT README: 'will be "
            "automatically downloaded by the code'. clbench downloads nothing: with --data-root DIR it reads "
            "torchvision's format DIR/cifar-100-python/{train,test,meta} (without it, $CLBENCH_CACHE/data/cifar100)"
        ),
        licence="no licence stated by the authors (see https://www.cs.toronto.edu/~kriz/cifar.html)",
        **REFERENCE_TF,
    )
)

# ------------------------------------------------------------------------------------------------ PILOT's trees
_tree_preset(
    "cub200",
    "CUB-200-2011 birds, PILOT's pre-sampled split, 200 classes (TOSCA: B0 Inc10, 20 tasks)",
    200,
    10,
    f"CUB-200: {PILOT_DATASETS} links a Google Drive / OneDrive copy; {_tree_layout(200, './data/cub')}",
)
_tree_preset(
    "imagenet-r",
    "ImageNet-R renditions, PILOT's pre-sampled split, 200 classes (TOSCA: B0 Inc20, 10 tasks)",
    200,
    20,
    f"ImageNet-R: {PILOT_DATASETS} links a Google Drive / OneDrive copy; {_tree_layout(200, './data/imagenet-r')}",
)
_tree_preset(
    "imagenet-a",
    "ImageNet-A adversarial photos, PILOT's split, 200 classes (TOSCA: B0 Inc20, 10 tasks)",
    200,
    20,
    f"ImageNet-A: {PILOT_DATASETS} links a Google Drive / OneDrive copy; {_tree_layout(200, './data/imagenet-a')}",
)
_tree_preset(
    "objectnet",
    "ObjectNet, PILOT's 200-class subset (not in TOSCA; B0 Inc20 as ImageNet-R/A, 10 tasks)",
    200,
    20,
    f"ObjectNet: {PILOT_DATASETS} links a OneDrive copy only, plus a Google Drive file list for rebuilding the "
    f"subset from the original ObjectNet release when the archive is too large to download; "
    f"{_tree_layout(200, './data/objectnet')}",
)
_tree_preset(
    "omnibenchmark",
    "OmniBenchmark, PILOT's 300-class subset (TOSCA: B0 Inc30, 10 tasks)",
    300,
    30,
    f"OmniBenchmark: {PILOT_DATASETS} links a Google Drive / OneDrive copy; "
    f"{_tree_layout(300, './data/omnibenchmark')}",
)
_tree_preset(
    "vtab",
    "VTAB, PILOT's 50-class CIL subset of 5 VTAB tasks (TOSCA: B0 Inc10, 5 tasks)",
    50,
    10,
    f"VTAB: {PILOT_DATASETS} links a Google Drive / OneDrive copy; {_tree_layout(50, './data/vtab-cil/vtab')}, "
    "i.e. --data-root .../vtab-cil/vtab",
)
_tree_preset(
    "eurosat",
    "EuroSAT RGB satellite scenes, 10 classes, out-of-distribution set (B0 Inc2, 5 tasks; chosen here)",
    10,
    2,
    "EuroSAT RGB (Helber et al. 2019, https://github.com/phelber/EuroSAT; torchvision.datasets.EuroSAT downloads its "
    "27,000 64x64 images as eurosat/2750/<class>/*.jpg with no train/test split). Neither PILOT nor the TOSCA code "
    "publishes a split: divide each class folder into DIR/train/<class> and DIR/test/<class> (10 class folders in "
    "each), pass --data-root DIR, and report the split you made",
    licence="see https://github.com/phelber/EuroSAT",
)

# ------------------------------------------------------------------------------------------------ your own data
register(
    BenchmarkSpec(
        name="folder",
        summary="your own images: a train/ + test/ ImageFolder tree under --data-root, classes discovered (B0 Inc10)",
        load=f"{__name__}:load_folder",
        init_cls=10,  # B0 Inc10 by default; set --init-cls/--increment for other class counts
        increment=10,
        backbone=PAPER_BACKBONE,
        n_classes=None,  # discovered: the sorted sub-folders of train/
        needs_data_root=True,
        source_info=f"your own data: {LAYOUT}; class names are the sorted folder names",
        **REFERENCE_TF,
    )
)

load_cub200 = TreeLoader("cub200")
load_imagenet_r = TreeLoader("imagenet-r")
load_imagenet_a = TreeLoader("imagenet-a")
load_objectnet = TreeLoader("objectnet")
load_omnibenchmark = TreeLoader("omnibenchmark")
load_vtab = TreeLoader("vtab")
load_eurosat = TreeLoader("eurosat")
load_folder = TreeLoader("folder")
