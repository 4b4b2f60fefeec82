"""A sentence-transformers model directory an operator supplies, checked before it is loaded.

``ENGRAM_SHARD_EMBEDDER`` may name a directory (mounted from a volume, never downloaded)
holding a BERT-family sentence encoder as sentence-transformers saves it: ``config.json``
(``model_type`` bert), ``model.safetensors``, ``tokenizer.json``, and the pooling module's
``1_Pooling/config.json`` (mean or CLS token). BGE, E5 and GTE in their BERT sizes, and the
packaged all-MiniLM-L6-v2, are such directories. The shard refuses to start (exit 2) when
one of these files is missing or does not describe a model it can run, naming what is wrong.

A model's identity (:attr:`ModelSpec.identity`) is its name and a digest of every file
that decides its vectors, so two different models, or two versions of one, never share
stored vectors: the index keeps vectors per identity and re-embeds when it changes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# record_vectors.model holds the identity: at most 64 characters.
IDENTITY_MAX = 64
_DIGEST_HEX = 12
_SUPPORTED_TYPES = ("bert",)
_MAX_TOKENS_CAP = 512


class ModelDirError(ValueError):
    """The model directory is missing a file or describes a model the shard cannot run."""


@dataclass(frozen=True)
class ModelSpec:
    """What the shard needs to build a BERT-family encoder from a directory."""

    directory: Path
    name: str
    hidden: int
    heads: int
    layers: int
    intermediate: int
    layer_norm_eps: float
    pooling: str  # "mean" or "cls"
    max_tokens: int
    digest: str  # SHA-256 over the files that decide the vectors

    def identity(self, *, int8: bool) -> str:
        """``name@digest`` (and ``-int8``), at most 64 characters: the key of stored vectors."""
        suffix = f"@{self.digest[:_DIGEST_HEX]}" + ("-int8" if int8 else "")
        return self.name[: IDENTITY_MAX - len(suffix)] + suffix

    @property
    def weights_file(self) -> Path:
        return self.directory / "model.safetensors"

    @property
    def tokenizer_file(self) -> Path:
        return self.directory / "tokenizer.json"


def _read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise ModelDirError(f"{path} is missing ({what})")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelDirError(f"{path} is not readable JSON: {error}") from None
    if not isinstance(value, dict):
        raise ModelDirError(f"{path} must hold a JSON object")
    return value


def _positive_int(config: dict[str, Any], key: str, path: Path) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelDirError(f"{path}: {key} must be a positive integer, found {value!r}")
    return value


def _pooling(directory: Path) -> str:
    path = directory / "1_Pooling" / "config.json"
    config = _read_json(path, "the sentence-transformers pooling config")
    modes = [mode for mode in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
                               "weightedmean_tokens", "lasttoken")
             if config.get(f"pooling_mode_{mode}")]
    if modes == ["mean_tokens"]:
        return "mean"
    if modes == ["cls_token"]:
        return "cls"
    raise ModelDirError(
        f"{path}: pooling {modes or 'none'} is not supported (mean tokens or the CLS token)")


def _digest(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


def inspect_model_dir(directory: Path, *, name: str | None = None,
                      max_tokens: int | None = None) -> ModelSpec:
    """The spec of the model in ``directory``, or :class:`ModelDirError` naming what is wrong.

    Reads the configs and hashes the files (the weights streamed, ~0.3 s for 90 MB); the
    weights themselves are checked when they are loaded (:func:`load_bert_weights`).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ModelDirError(f"model directory {directory} does not exist or is not a directory")
    config_path = directory / "config.json"
    config = _read_json(config_path, "the model's config")
    model_type = config.get("model_type")
    if model_type not in _SUPPORTED_TYPES:
        raise ModelDirError(
            f"{config_path}: model_type {model_type!r} is not supported "
            f"(BERT-family encoders: {', '.join(_SUPPORTED_TYPES)})")
    act = config.get("hidden_act", "gelu")
    if act != "gelu":
        raise ModelDirError(f"{config_path}: hidden_act {act!r} is not supported (gelu)")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ModelDirError(f"{config_path}: only absolute position embeddings are supported")
    hidden = _positive_int(config, "hidden_size", config_path)
    heads = _positive_int(config, "num_attention_heads", config_path)
    if hidden % heads:
        raise ModelDirError(f"{config_path}: hidden_size {hidden} is not a multiple of "
                            f"num_attention_heads {heads}")
    layers = _positive_int(config, "num_hidden_layers", config_path)
    intermediate = _positive_int(config, "intermediate_size", config_path)
    positions = _positive_int(config, "max_position_embeddings", config_path)
    eps = config.get("layer_norm_eps", 1e-12)
    if not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise ModelDirError(f"{config_path}: layer_norm_eps must be in (0, 1), found {eps!r}")
    pooling = _pooling(directory)
    for required, what in (("tokenizer.json", "the tokenizer (a Hugging Face tokenizers file)"),
                           ("model.safetensors", "the weights (safetensors)")):
        if not (directory / required).is_file():
            raise ModelDirError(f"{directory / required} is missing ({what})")
    st_config_path = directory / "sentence_bert_config.json"
    st_config = _read_json(st_config_path, "") if st_config_path.is_file() else {}
    if max_tokens is None:
        declared = st_config.get("max_seq_length", _MAX_TOKENS_CAP)
        max_tokens = declared if isinstance(declared, int) and declared > 0 else _MAX_TOKENS_CAP
    max_tokens = min(max_tokens, positions, _MAX_TOKENS_CAP)
    files = [config_path, directory / "1_Pooling" / "config.json", directory / "tokenizer.json",
             directory / "model.safetensors"]
    if st_config_path.is_file():
        files.append(st_config_path)
    if name is None:
        declared_name = config.get("_name_or_path")
        name = (str(declared_name).rstrip("/").rsplit("/", 1)[-1]
                if isinstance(declared_name, str) and declared_name else directory.name)
    digest = _digest(files) + f"/{max_tokens}"
    return ModelSpec(directory=directory, name=name or "model", hidden=hidden, heads=heads,
                     layers=layers, intermediate=intermediate, layer_norm_eps=float(eps),
                     pooling=pooling, max_tokens=max_tokens,
                     digest=hashlib.sha256(digest.encode()).hexdigest())


def bert_weight_names(spec: ModelSpec) -> list[str]:
    """Every tensor the encoder uses, as BertModel names them (without a ``bert.`` prefix)."""
    names = [f"embeddings.{n}" for n in ("word_embeddings.weight", "position_embeddings.weight",
                                         "token_type_embeddings.weight", "LayerNorm.weight",
                                         "LayerNorm.bias")]
    for i in range(spec.layers):
        p = f"encoder.layer.{i}."
        for part in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense", "intermediate.dense", "output.dense"):
            names += [p + part + ".weight", p + part + ".bias"]
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            names += [p + norm + ".weight", p + norm + ".bias"]
    return names


def load_bert_weights(spec: ModelSpec) -> dict[str, npt.NDArray[np.float32]]:
    """The encoder's tensors as float32 numpy arrays, checked against the config.

    A checkpoint saved from ``BertForX`` prefixes its encoder with ``bert.``: accepted.
    """
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        raw = load_file(str(spec.weights_file))
    except (OSError, SafetensorError) as error:
        raise ModelDirError(f"{spec.weights_file} is not a readable safetensors file: {error}") \
            from None
    if not any(key.startswith("embeddings.") for key in raw):
        raw = {key.removeprefix("bert."): value for key, value in raw.items()}
    missing = [name for name in bert_weight_names(spec) if name not in raw]
    if missing:
        raise ModelDirError(f"{spec.weights_file} lacks {len(missing)} tensor(s) the config "
                            f"needs, first {missing[0]!r}")
    weights = {name: np.asarray(raw[name], dtype=np.float32) for name in bert_weight_names(spec)}
    expected = {
        "embeddings.word_embeddings.weight": (None, spec.hidden),
        "encoder.layer.0.attention.self.query.weight": (spec.hidden, spec.hidden),
        "encoder.layer.0.intermediate.dense.weight": (spec.intermediate, spec.hidden),
    }
    for name, shape in expected.items():
        actual = weights[name].shape
        if len(actual) != 2 or any(want is not None and want != got
                                   for want, got in zip(shape, actual, strict=True)):
            raise ModelDirError(f"{spec.weights_file}: {name} has shape {actual}, the config "
                                f"says {shape}")
    positions = weights["embeddings.position_embeddings.weight"].shape[0]
    if positions < spec.max_tokens:
        raise ModelDirError(f"{spec.weights_file}: {positions} position embeddings, fewer than "
                            f"max_tokens {spec.max_tokens}")
    return weights
