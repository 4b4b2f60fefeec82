"""A sentence-transformers model directory an operator supplies, checked before it is loaded.

``ENGRAM_SHARD_EMBEDDER`` may name a directory (mounted from a volume, never downloaded)
holding a sentence encoder as sentence-transformers saves it: ``config.json`` (``model_type``
bert or mpnet), ``model.safetensors``, ``tokenizer.json``, and the pooling module's
``1_Pooling/config.json`` (mean or CLS token). BGE, E5 and GTE in their BERT sizes, the
packaged all-MiniLM-L6-v2 and all-mpnet-base-v2 are such directories. MPNet is BERT's
encoder with absolute positions counted from ``pad_token_id + 1``, no token types, and a
relative-position bias (T5's buckets) added to every layer's attention scores:
:func:`load_encoder_weights` gives both in BERT's tensor names, plus that bias. The shard
refuses to start (exit 2) when one of these files is missing or does not describe a model it
can run, naming what is wrong.

A model's identity (:attr:`ModelSpec.identity`) is its name and a digest of every file
that decides its vectors, so two different models, or two versions of one, never share
stored vectors: the index keeps vectors per identity and re-embeds when it changes.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# record_vectors.model holds the identity: at most 64 characters.
IDENTITY_MAX = 64
_DIGEST_HEX = 12
_SUPPORTED_TYPES = ("bert", "mpnet")
RELATIVE_BIAS = "encoder.relative_attention_bias.weight"
WORD_TABLE = "embeddings.word_embeddings.weight"
"""The token embedding table: the encoder's largest tensor (MiniLM 47 MB, mpnet 94 MB in
float32), fed to the graph from the weights file mapped read-only (:func:`word_table`)."""
_MAX_TOKENS_CAP = 512
ONNX_FILES = ("onnx/model.onnx", "model.onnx")
"""Where a directory may hold an exported encoder instead of ``model.safetensors`` (the
first as sentence-transformers saves its ONNX backend, the second as optimum exports)."""


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
    architecture: str = "bert"  # or "mpnet"
    position_offset: int = 0  # MPNet: positions start at pad_token_id + 1
    relative_buckets: int = 0  # MPNet: relative-position buckets (0: none)
    relative_max_distance: int = 128
    onnx_file: Path | None = None
    """An exported ONNX encoder run as supplied (no safetensors): :data:`ONNX_FILES`."""

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
    weights themselves are checked when they are loaded (:func:`load_encoder_weights`).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ModelDirError(f"model directory {directory} does not exist or is not a directory")
    config_path = directory / "config.json"
    config = _read_json(config_path, "the model's config")
    if not (directory / "model.safetensors").is_file():
        exported = next((directory / f for f in ONNX_FILES if (directory / f).is_file()), None)
        if exported is not None:
            return _onnx_spec(directory, config, exported, name=name, max_tokens=max_tokens)
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
    position_offset = relative_buckets = 0
    if model_type == "mpnet":
        pad = config.get("pad_token_id", 1)
        position_offset = (pad if isinstance(pad, int) and pad >= 0 else 1) + 1
        relative_buckets = _positive_int(config, "relative_attention_num_buckets", config_path)
        positions -= position_offset
    eps = config.get("layer_norm_eps", 1e-12)
    if not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise ModelDirError(f"{config_path}: layer_norm_eps must be in (0, 1), found {eps!r}")
    pooling = _pooling(directory)
    for required, what in (("tokenizer.json", "the tokenizer (a Hugging Face tokenizers file)"),
                           ("model.safetensors", "the weights (safetensors; or an exported "
                            f"encoder as {' or '.join(ONNX_FILES)})")):
        if not (directory / required).is_file():
            raise ModelDirError(f"{directory / required} is missing ({what})")
    max_tokens, files = _token_limit(directory, max_tokens, positions)
    return ModelSpec(directory=directory, name=_name(directory, name), hidden=hidden,
                     heads=heads, layers=layers, intermediate=intermediate,
                     layer_norm_eps=float(eps), pooling=pooling, max_tokens=max_tokens,
                     digest=_identity_digest(directory, directory / "model.safetensors",
                                             files, max_tokens),
                     architecture=str(model_type), position_offset=position_offset,
                     relative_buckets=relative_buckets)


def _onnx_spec(directory: Path, config: dict[str, Any], exported: Path, *, name: str | None,
               max_tokens: int | None) -> ModelSpec:
    """An exported encoder: any architecture, since its graph comes with it; the config gives
    its width and positions, the pooling config how its token states become a sentence's.
    Whether the file runs, and what it takes and gives, is checked when it is loaded
    (``embedding_onnx_file``)."""
    config_path = directory / "config.json"
    hidden = _positive_int(config, "hidden_size", config_path)
    declared = config.get("max_position_embeddings", _MAX_TOKENS_CAP)
    positions = declared if isinstance(declared, int) and declared > 0 else _MAX_TOKENS_CAP
    if config.get("model_type") in ("roberta", "xlm-roberta", "mpnet"):
        # Their positions start after the padding id: two fewer usable ones.
        pad = config.get("pad_token_id", 1)
        positions -= (pad if isinstance(pad, int) and pad >= 0 else 1) + 1
    pooling = _pooling(directory)
    if not (directory / "tokenizer.json").is_file():
        raise ModelDirError(f"{directory / 'tokenizer.json'} is missing (the tokenizer, a "
                            "Hugging Face tokenizers file)")
    max_tokens, files = _token_limit(directory, max_tokens, positions)
    return ModelSpec(directory=directory, name=_name(directory, name), hidden=hidden, heads=0,
                     layers=0, intermediate=0, layer_norm_eps=1e-12, pooling=pooling,
                     max_tokens=max_tokens,
                     digest=_identity_digest(directory, exported, files, max_tokens),
                     architecture=str(config.get("model_type", "onnx")), onnx_file=exported)


def _token_limit(directory: Path, max_tokens: int | None,
                 positions: int) -> tuple[int, list[Path]]:
    """Tokens a text keeps (sentence_bert_config.json's ``max_seq_length`` unless given,
    within the model's positions and 512), and that file when there is one."""
    st_config_path = directory / "sentence_bert_config.json"
    st_config = _read_json(st_config_path, "") if st_config_path.is_file() else {}
    if max_tokens is None:
        declared = st_config.get("max_seq_length", _MAX_TOKENS_CAP)
        max_tokens = declared if isinstance(declared, int) and declared > 0 else _MAX_TOKENS_CAP
    return (min(max_tokens, positions, _MAX_TOKENS_CAP),
            [st_config_path] if st_config_path.is_file() else [])


def _name(directory: Path, name: str | None) -> str:
    # The directory's name (/models/bge-small-en-v1.5): config.json's _name_or_path is often
    # the base model the sentence encoder was trained from (microsoft/mpnet-base).
    return name or directory.resolve().name or "model"


def _identity_digest(directory: Path, weights: Path, extra: list[Path], max_tokens: int) -> str:
    """SHA-256 over every file that decides the vectors, in a fixed order (a change of order
    would change every stored vector's key), and the token limit."""
    files = [directory / "config.json", directory / "1_Pooling" / "config.json",
             directory / "tokenizer.json", weights, *extra]
    return hashlib.sha256((_digest(files) + f"/{max_tokens}").encode()).hexdigest()


def bert_weight_names(spec: ModelSpec) -> list[str]:
    """Every tensor the encoder uses, as BertModel names them (without a ``bert.`` prefix).

    An MPNet checkpoint's names are mapped onto these (:data:`_MPNET_NAMES`)."""
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


# MPNet's names for BERT's tensors, per layer (the rest are named alike).
_MPNET_NAMES = {
    "attention.self.query": "attention.attn.q",
    "attention.self.key": "attention.attn.k",
    "attention.self.value": "attention.attn.v",
    "attention.output.dense": "attention.attn.o",
    "attention.output.LayerNorm": "attention.LayerNorm",
}


def _from_mpnet(raw: dict[str, npt.NDArray[Any]], spec: ModelSpec) -> dict[str, npt.NDArray[Any]]:
    """An MPNet checkpoint in BERT's names: positions from the offset on, a zero token type."""
    raw = {key.removeprefix("mpnet."): value for key, value in raw.items()}
    out = dict(raw)
    for i in range(spec.layers):
        p = f"encoder.layer.{i}."
        for bert, mpnet in _MPNET_NAMES.items():
            for leaf in (".weight", ".bias"):
                if p + mpnet + leaf in raw:
                    out[p + bert + leaf] = raw[p + mpnet + leaf]
    if "embeddings.position_embeddings.weight" in raw:
        out["embeddings.position_embeddings.weight"] = \
            raw["embeddings.position_embeddings.weight"][spec.position_offset:]
    out["embeddings.token_type_embeddings.weight"] = np.zeros((1, spec.hidden), np.float32)
    return out


def relative_position_bias(spec: ModelSpec,
                           table: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """MPNet's attention bias for every query/key position pair: (heads, max_tokens,
    max_tokens), from its (buckets, heads) ``table`` and T5's bidirectional buckets."""
    positions = np.arange(spec.max_tokens)
    relative = positions[None, :] - positions[:, None]  # key position - query position
    half = spec.relative_buckets // 2
    n = -relative
    bucket = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    exact = half // 2
    with np.errstate(divide="ignore"):
        large = exact + (np.log(np.maximum(n, 1) / exact)
                         / np.log(spec.relative_max_distance / exact)
                         * (half - exact)).astype(np.int64)
    large = np.minimum(large, half - 1)
    bucket += np.where(n < exact, n, large)
    bias: npt.NDArray[np.float32] = np.ascontiguousarray(
        table[bucket].transpose(2, 0, 1), dtype=np.float32)
    return bias


def load_encoder_weights(spec: ModelSpec) -> dict[str, npt.NDArray[np.float32]]:
    """The encoder's tensors as float32 numpy arrays in BERT's names, checked against the
    config (an MPNet model adds :data:`RELATIVE_BIAS`, its (buckets, heads) table).

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
    names = bert_weight_names(spec)
    if spec.architecture == "mpnet":
        raw = _from_mpnet(raw, spec)
        names.append(RELATIVE_BIAS)
    missing = [name for name in names if name not in raw]
    if missing:
        raise ModelDirError(f"{spec.weights_file} lacks {len(missing)} tensor(s) the config "
                            f"needs, first {missing[0]!r}")
    weights = {name: np.asarray(raw[name], dtype=np.float32) for name in names}
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
    if spec.architecture == "mpnet" and \
            weights[RELATIVE_BIAS].shape != (spec.relative_buckets, spec.heads):
        raise ModelDirError(f"{spec.weights_file}: {RELATIVE_BIAS} has shape "
                            f"{weights[RELATIVE_BIAS].shape}, the config says "
                            f"{(spec.relative_buckets, spec.heads)}")
    positions = weights["embeddings.position_embeddings.weight"].shape[0]
    if positions < spec.max_tokens:
        raise ModelDirError(f"{spec.weights_file}: {positions} position embeddings, fewer than "
                            f"max_tokens {spec.max_tokens}")
    return weights


def weights_stamp(path: Path) -> tuple[int, int, int, int]:
    """What tells a file rewritten in place from the one mapped: device, inode, size, mtime."""
    status = path.stat()
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


def word_table(spec: ModelSpec) -> npt.NDArray[np.float32]:
    """``spec``'s token embedding table, (vocabulary, hidden) float32.

    Mapped read-only from ``model.safetensors`` where the file stores it as float32: only the
    pages of tokens a text uses become resident, and they are the page cache's, shared and
    reclaimable, not the process's own heap (the table is 60-70% of MiniLM's weights). A file
    that stores it otherwise (float16, bfloat16) has that one tensor read and converted. The
    caller keeps :func:`weights_stamp` of the file to notice it rewritten under the mapping."""
    unreadable = f"{spec.weights_file} is not a readable safetensors file"
    try:
        with spec.weights_file.open("rb") as handle:
            (header_size,) = struct.unpack("<Q", handle.read(8))
            if header_size > 100_000_000:
                raise ValueError(f"a header of {header_size} bytes")
            header = json.loads(handle.read(header_size))
        size = spec.weights_file.stat().st_size
    except (OSError, ValueError, struct.error) as error:
        raise ModelDirError(f"{unreadable}: {error}") from None
    if not isinstance(header, dict):
        raise ModelDirError(f"{unreadable}: its header is not a JSON object")
    key = next((k for k in (WORD_TABLE, f"bert.{WORD_TABLE}", f"mpnet.{WORD_TABLE}")
                if isinstance(header.get(k), dict)), None)
    if key is None:
        raise ModelDirError(f"{spec.weights_file} has no {WORD_TABLE}")
    entry = header[key]
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not (isinstance(shape, list) and len(shape) == 2
            and all(type(n) is int for n in shape) and shape[0] > 0 and shape[1] == spec.hidden):
        raise ModelDirError(f"{spec.weights_file}: {key} has shape {shape}, the config says "
                            f"(vocabulary, {spec.hidden})")
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(type(n) is int for n in offsets)
            and 0 <= offsets[0] < offsets[1] <= size - 8 - header_size):
        raise ModelDirError(f"{unreadable}: {key} has data offsets {offsets}")
    if entry.get("dtype") == "F32" and offsets[1] - offsets[0] == shape[0] * shape[1] * 4:
        mapped: npt.NDArray[np.float32] = np.memmap(
            spec.weights_file, dtype="<f4", mode="r", offset=8 + header_size + offsets[0],
            shape=(shape[0], shape[1]))
        return mapped
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(spec.weights_file), framework="numpy") as weights:
            table: npt.NDArray[np.float32] = np.ascontiguousarray(weights.get_tensor(key),
                                                                  dtype=np.float32)
    except (OSError, SafetensorError) as error:
        raise ModelDirError(f"{unreadable}: {error}") from None
    return table
