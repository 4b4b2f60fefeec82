"""Which encoder a setting names (ENGRAM_SHARD_EMBEDDER, ENGRAM_EMBEDDER_EMBEDDER).

The shard and the embedding service read the same names, so a shard moved to a shared
embedding service that runs the same model keeps its stored vectors (same identity).
"""

from __future__ import annotations

from pathlib import Path

from services.shard.retrieval.embedding import minilm_spec
from services.shard.retrieval.model_dir import ModelSpec, inspect_model_dir
from services.shard.retrieval.packaged_models import MPNET, mpnet_dir

NAMED_EMBEDDERS = ("minilm", "minilm-fp32", "mpnet", "hash", "none")


def encoder_spec(embedder: str, home: Path, int8: bool,
                 setting: str) -> tuple[ModelSpec, bool] | None:
    """The encoder ``embedder`` names and whether it runs int8, or None for the hash and no
    embedder. A directory is checked here, before anything starts: :class:`ModelDirError`
    (exit 2) names what is missing or malformed; an unknown name is a ``ValueError`` naming
    ``setting``."""
    if embedder in ("none", "hash"):
        return None
    if embedder in ("minilm", "minilm-fp32"):
        return minilm_spec(), embedder == "minilm"
    if embedder == "mpnet":
        return inspect_model_dir(mpnet_dir(home), name=MPNET), int8
    if "/" in embedder or embedder.startswith("."):
        return inspect_model_dir(Path(embedder)), int8
    raise ValueError(
        f"unknown {setting} {embedder!r}: one of {', '.join(NAMED_EMBEDDERS)}, or the path of "
        "a sentence-transformers model directory"
    )
