"""The offline domain-incremental benchmark ``emoji-domains``: the same emoji subcategories in four artwork styles.

Why: the domain-incremental scenario needs one label space seen in several domains, offline. Four emoji artwork
sets with redistributable licences (Noto, Twemoji, EmojiOne 2.2.7, OpenMoji 17.0.0) draw the same emoji; each set is
a domain and the label is the emoji's Unicode subcategory. Built by :mod:`clbench.benchmarks.build_emoji_domains`
and shipped as ``clbench/data/emoji_domains.npz`` (licences in ``clbench/data/NOTICE``). Every domain holds exactly
the same emoji, split train/test by base emoji as the embedded benchmark is (no skin-tone variant on both sides):
806 train and 339 test images per domain. The styles differ measurably (on the shipped file, train and test): an
image has on average 593 distinct colours in Noto, 335 in Twemoji, 104 in OpenMoji and 91 in EmojiOne, and
OpenMoji's black outlines make 7.8 % of its pixels dark (every channel below 60), against 1.2 to 1.8 % in the others.

The loader checks the arrays against the digest the build printed (:data:`CONTENT_SHA256`), so a truncated or
hand-edited file is refused rather than measured. Every image carries its domain (``ImageSource.domains``), so the
same sources serve the class-incremental scenario (all domains' images together) and the domain-incremental one.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np

from clbench.benchmarks.base import ArraySource, BenchmarkSpec
from clbench.benchmarks.registry import register
from clbench.errors import ClbenchError

DOMAINS: tuple[str, ...] = ("noto", "twemoji", "emojione", "openmoji")  # arrival order: the build's domain order
N_CLASSES = 50
FILE_NAME = "emoji_domains.npz"
# printed by `python -m clbench.benchmarks.build_emoji_domains` (content_digest: over the arrays, not the zip bytes)
CONTENT_SHA256 = "b84a14221949ae6b400f6881d72226748c79c1c1b1221817db5ca32cddaeccaa"
REBUILD = "rebuild it with: python -m clbench.benchmarks.build_emoji_domains (needs npm and resvg-cli==0.44.0)"


def data_file() -> Path:
    return Path(str(resources.files("clbench") / "data" / FILE_NAME))


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of the file, checked against :data:`CONTENT_SHA256`."""
    # deferred: loads PIL, which importing this module does not
    from clbench.benchmarks.build_emoji_domains import content_digest

    if not path.is_file():
        raise ClbenchError(f"the emoji-domains benchmark file {path} is missing", f"reinstall clbench, or {REBUILD}")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:  # a damaged zip raises zipfile, OSError or ValueError
        raise ClbenchError(
            f"cannot read {path} ({type(e).__name__}: {e})", f"reinstall clbench, or {REBUILD}"
        ) from None
    digest = content_digest(arrays)
    if digest != CONTENT_SHA256:
        raise ClbenchError(
            f"{path} has content digest {digest[:16]}..., expected {CONTENT_SHA256[:16]}... (damaged or rebuilt "
            "with other inputs)",
            f"reinstall clbench, or {REBUILD} and put the digest it prints into emoji_domains.CONTENT_SHA256",
        )
    names = tuple(str(n) for n in arrays["domain_names"])
    if names != DOMAINS:
        raise ClbenchError(f"{path} has domains {names}, expected {DOMAINS}", REBUILD)
    return arrays


def load(data_root: Path | None) -> tuple[ArraySource, ArraySource, list[str]]:
    """Train and test sources over all four domains, each image's domain in ``.domains``."""
    path = (data_root / FILE_NAME) if data_root is not None else data_file()
    arrays = read_arrays(path)
    sources = []
    for split in ("train", "test"):
        source = ArraySource(arrays[f"{split}_x"], arrays[f"{split}_y"], f"emoji-domains/{split}")
        source.domains = arrays[f"{split}_domain"].astype(np.int64)
        sources.append(source)
    return sources[0], sources[1], [str(n) for n in arrays["class_names"]]


register(
    BenchmarkSpec(
        name="emoji-domains",
        summary=(
            f"Embedded, domain-incremental: {N_CLASSES} emoji subcategories x {len(DOMAINS)} artwork styles "
            "(Noto, Twemoji, EmojiOne 2, OpenMoji), grouped split (ships with clbench)"
        ),
        load=f"{__name__}:load",
        init_cls=10,  # class-incremental scenario over all domains: B0 Inc10, 5 tasks
        increment=10,
        backbone="vit_small_patch14_dinov2",  # as the embedded emoji benchmark (64 px images)
        n_classes=N_CLASSES,
        img_size=112,
        licence=(
            "Noto Emoji Apache-2.0; Twemoji CC-BY-4.0; EmojiOne 2.2.7 artwork CC-BY-4.0; OpenMoji CC-BY-SA-4.0 "
            "(see clbench/data/NOTICE)"
        ),
        source_info=(
            "npm emoji-datasource-google@16.0.0, emoji-datasource-twitter@16.0.0, emojione@2.2.7, openmoji@17.0.0 "
            "(labels: emoji-datasource emoji.json); " + REBUILD
        ),
        domains=DOMAINS,
    )
)
