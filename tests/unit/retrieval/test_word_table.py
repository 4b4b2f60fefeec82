"""The token embedding table is fed to the encoder from the weights file, mapped read-only,
not held in the ONNX session's memory: the same vectors, bit for bit, and 30-50 MB less
resident memory in the embedder process (MiniLM's table is 47 MB, mpnet's 94 MB)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from safetensors.numpy import load_file, save_file

from services.shard.retrieval.embedding import SentenceTokenizer, minilm_spec, padded
from services.shard.retrieval.embedding_onnx import (
    OnnxBertEmbedder,
    bert_graph,
    session_options,
)
from services.shard.retrieval.model_dir import (
    WORD_TABLE,
    ModelDirError,
    inspect_model_dir,
    load_encoder_weights,
    word_table,
)
from tests.unit.retrieval.test_model_dir import TEXTS, _tiny_bert


def test_the_packaged_table_is_mapped_from_its_file_and_equals_the_weights() -> None:
    spec = minilm_spec()
    table = word_table(spec)
    assert isinstance(table, np.memmap) and not table.flags.writeable
    assert table.shape == (30522, 384) and table.dtype == np.float32
    assert np.array_equal(table, load_encoder_weights(spec)[WORD_TABLE])


@pytest.mark.parametrize("int8", [False, True])
def test_the_session_is_fed_the_table_and_gives_the_vectors_of_the_graph_holding_it(
    tmp_path: Path, int8: bool
) -> None:
    spec = minilm_spec()
    encoder = OnnxBertEmbedder(spec, int8=int8)
    assert "word" in [i.name for i in encoder._session.get_inputs()]  # not a weight it holds
    # The graph as it was (the table a weight of the session), built and quantized alike.
    model = bert_graph(load_encoder_weights(spec), spec)
    path = tmp_path / "holding.onnx"
    if int8:
        from services.shard.retrieval.embedding_onnx import quantize_int8

        quantize_int8(model, path, spec)
    else:
        onnx.save(model, path)
    holding = ort.InferenceSession(str(path), sess_options=session_options(),
                                   providers=["CPUExecutionProvider"])
    for row in SentenceTokenizer(spec.directory, spec.max_tokens).encode(TEXTS):
        token_ids, mask = padded([row], np.int32, np.int32)
        (expected,) = holding.run(["pooled"], {"input_ids": token_ids, "mask": mask})
        assert np.array_equal(encoder._forward([row]), expected)


def test_a_table_stored_in_float16_is_read_into_memory(tmp_path: Path) -> None:
    directory = _tiny_bert(tmp_path / "tiny")
    weights = load_file(str(directory / "model.safetensors"))
    weights[WORD_TABLE] = weights[WORD_TABLE].astype(np.float16)
    save_file(weights, str(directory / "model.safetensors"))
    spec = inspect_model_dir(directory)
    table = word_table(spec)
    assert not isinstance(table, np.memmap) and table.dtype == np.float32
    assert np.array_equal(table, weights[WORD_TABLE].astype(np.float32))
    vectors = OnnxBertEmbedder(spec).embed(TEXTS)
    assert vectors.shape == (len(TEXTS), 32) and np.isfinite(vectors).all()


def _header_edited(directory: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    """Rewrite model.safetensors with ``edit`` applied to its header (the data kept)."""
    path = directory / "model.safetensors"
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    replaced = edit(header)
    encoded = json.dumps(header if replaced is None else replaced, separators=(",", ":")).encode()
    encoded += b" " * max(0, size - len(encoded))  # the data stays where the offsets say
    assert len(encoded) == size, "the edit made the header longer"
    path.write_bytes(data[:8] + encoded + data[8 + size :])


def test_a_table_whose_header_lies_about_its_size_is_not_mapped(tmp_path: Path) -> None:
    """Offsets that do not fit the shape are read through safetensors, which refuses them."""
    directory = _tiny_bert(tmp_path / "tiny")
    # The table's shape grown by one row (same digit count, so the header keeps its length).
    _header_edited(directory, lambda h: h[WORD_TABLE].update(shape=[30523, 32]))
    with pytest.raises(ModelDirError, match="not a readable safetensors file"):
        word_table(inspect_model_dir(directory))


def test_a_weights_file_that_is_not_safetensors_is_refused(tmp_path: Path) -> None:
    directory = _tiny_bert(tmp_path / "tiny")
    spec = inspect_model_dir(directory)
    (directory / "model.safetensors").write_bytes(b"\xff" * 8 + b"not json")
    with pytest.raises(ModelDirError, match="not a readable safetensors file"):
        word_table(spec)


@pytest.mark.parametrize("edit, message", [
    (lambda h: h[WORD_TABLE].update(data_offsets=[-8, h[WORD_TABLE]["data_offsets"][1]]),
     "data offsets"),  # would map the header itself as floats
    (lambda h: h[WORD_TABLE].update(data_offsets=["0", "1"]), "data offsets"),
    (lambda h: h[WORD_TABLE].update(shape=[30522.0, 32]), "has shape"),
    (lambda h: h[WORD_TABLE].update(shape=[30522, 31]), "has shape"),
    (lambda h: h.pop(WORD_TABLE) and None, "has no embeddings.word_embeddings.weight"),
    (lambda h: [1, 2, 3], "not a JSON object"),
])
def test_a_header_that_does_not_describe_the_table_is_refused_by_name(
        tmp_path: Path, edit: Callable[[dict[str, Any]], object], message: str) -> None:
    directory = _tiny_bert(tmp_path / "tiny")
    spec = inspect_model_dir(directory)
    _header_edited(directory, edit)
    with pytest.raises(ModelDirError, match=message):
        word_table(spec)


def test_a_weights_file_rewritten_in_place_is_refused_not_mixed_in(tmp_path: Path) -> None:
    """Mapped, a file overwritten in place would feed another model's table to the loaded
    layers and store its vectors under the old identity: each batch checks the file."""
    directory = _tiny_bert(tmp_path / "tiny")
    encoder = OnnxBertEmbedder(inspect_model_dir(directory))
    before = encoder.embed(TEXTS)
    path = directory / "model.safetensors"
    weights = load_file(str(path))
    weights[WORD_TABLE] = weights[WORD_TABLE][::-1].copy()  # another table, the same size
    with open(path, "r+b") as handle:  # in place: the same inode, as `cp` over it does
        replacement = Path(tmp_path / "other.safetensors")
        save_file(weights, str(replacement))
        handle.write(replacement.read_bytes())
    with pytest.raises(ModelDirError, match="restart the shard"):
        encoder.embed(TEXTS)
    assert before.shape == (len(TEXTS), 32)
