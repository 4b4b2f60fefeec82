"""The token embedding table is fed to the encoder from the weights file, mapped read-only,
not held in the ONNX session's memory: the same vectors, bit for bit, and 30-50 MB less
resident memory in the embedder process (MiniLM's table is 47 MB, mpnet's 94 MB)."""

from __future__ import annotations

from pathlib import Path

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


def test_a_table_whose_header_lies_about_its_size_is_not_mapped(tmp_path: Path) -> None:
    """Offsets that do not fit the shape are read through safetensors, which refuses them."""
    directory = _tiny_bert(tmp_path / "tiny")
    path = directory / "model.safetensors"
    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[:8], "little")
    header = bytes(data[8 : 8 + size])
    # The table's shape grown by one row (same digit count, so the header keeps its length).
    lying = header.replace(b'"shape":[30522,32]', b'"shape":[30523,32]', 1)
    assert lying != header
    data[8 : 8 + size] = lying
    path.write_bytes(bytes(data))
    with pytest.raises(ModelDirError, match="not a readable safetensors file"):
        word_table(inspect_model_dir(directory))


def test_a_weights_file_that_is_not_safetensors_is_refused(tmp_path: Path) -> None:
    directory = _tiny_bert(tmp_path / "tiny")
    spec = inspect_model_dir(directory)
    (directory / "model.safetensors").write_bytes(b"\xff" * 8 + b"not json")
    with pytest.raises(ModelDirError, match="not a readable safetensors file"):
        word_table(spec)
