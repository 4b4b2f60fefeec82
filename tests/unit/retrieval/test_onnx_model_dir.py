"""A model directory holding an exported ONNX encoder instead of safetensors (issue 19): run as
supplied, pooled as its pooling config says, the same vectors as the weights it was exported
from, identified by its file, and refused at start, naming what is wrong, when it cannot run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from services.shard.retrieval.embedding import default_minilm_dir, provider_name
from services.shard.retrieval.embedding_onnx import OnnxBertEmbedder, bert_graph
from services.shard.retrieval.embedding_onnx_file import OnnxFileEmbedder
from services.shard.retrieval.embedding_process import ProcessEmbedder
from services.shard.retrieval.model_dir import (
    ModelDirError,
    inspect_model_dir,
    load_encoder_weights,
)
from services.shard.server import embedder_spec, embedding_provider
from services.shard.settings import ShardSettings
from tests.unit.retrieval.test_model_dir import TEXTS, _edit, _tiny_bert


def exported(source: Path, target: Path, *, where: str = "onnx/model.onnx",
             output: str = "last_hidden_state", extra_input: str = "") -> Path:
    """``source`` (a safetensors directory) as an exporter leaves it: the same configs and
    tokenizer, and an ONNX graph taking int64 ``input_ids``, ``attention_mask`` and
    ``token_type_ids`` and giving the token states, no safetensors."""
    spec = inspect_model_dir(source)
    model = bert_graph(load_encoder_weights(spec), spec, pool=False)
    graph = model.graph
    for node in graph.node:
        node.input[:] = [{"input_ids": "ids32", "mask": "mask32"}.get(i, i) for i in node.input]
    if output != "last_hidden_state":
        graph.node.append(helper.make_node("Identity", ["last_hidden_state"], [output]))
        graph.output[0].name = output
    del graph.input[:]
    names = ["input_ids", "attention_mask", "token_type_ids", *([extra_input] if extra_input
                                                                  else [])]
    graph.input.extend(helper.make_tensor_value_info(name, TensorProto.INT64,
                                                     ["batch", "length"]) for name in names)
    casts = [helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
             helper.make_node("Cast", ["attention_mask"], ["mask32"], to=TensorProto.INT32)]
    nodes = [*casts, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    shutil.copytree(source, target)
    (target / "model.safetensors").unlink()
    (target / where).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, target / where)
    return target


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_an_exported_encoder_gives_the_vectors_of_the_weights_it_came_from(
        tmp_path: Path, pooling: str) -> None:
    source = _tiny_bert(tmp_path / "tiny", pooling=pooling)
    directory = exported(source, tmp_path / "tiny-onnx")
    spec = inspect_model_dir(directory)
    assert spec.onnx_file == directory / "onnx" / "model.onnx"
    assert (spec.pooling, spec.hidden, spec.max_tokens) == (pooling, 32, 64)
    vectors = OnnxFileEmbedder(spec).embed(TEXTS)
    assert vectors.shape == (len(TEXTS), 32)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(vectors, OnnxBertEmbedder(inspect_model_dir(source)).embed(TEXTS),
                       atol=1e-4)


def test_the_packaged_minilm_exported_by_optimum_gives_minilm_vectors(tmp_path: Path) -> None:
    source = tmp_path / "minilm"
    shutil.copytree(default_minilm_dir(), source)
    directory = exported(source, tmp_path / "minilm-onnx", where="model.onnx")
    spec = inspect_model_dir(directory)
    assert spec.onnx_file == directory / "model.onnx"
    assert np.allclose(OnnxFileEmbedder(spec, threads=2).embed(TEXTS),
                       OnnxBertEmbedder(inspect_model_dir(source)).embed(TEXTS), atol=1e-4)


def test_the_identity_is_the_exported_file_s_and_never_int8(tmp_path: Path) -> None:
    source = _tiny_bert(tmp_path / "tiny")
    directory = exported(source, tmp_path / "tiny-onnx")
    spec = inspect_model_dir(directory)
    assert spec.digest != inspect_model_dir(source).digest
    assert provider_name(spec, int8=False) == spec.identity(int8=False)
    assert OnnxFileEmbedder(spec).name == spec.identity(int8=False)
    graph = spec.onnx_file.read_bytes()  # type: ignore[union-attr]
    spec.onnx_file.write_bytes(graph + b"\0")  # type: ignore[union-attr]
    assert inspect_model_dir(directory).digest != spec.digest


def test_the_setting_runs_it_in_process_and_in_the_embedder_process(tmp_path: Path) -> None:
    directory = exported(_tiny_bert(tmp_path / "tiny"), tmp_path / "tiny-onnx")
    chosen = embedder_spec(ShardSettings(embedder=str(directory)))
    assert chosen is not None and chosen[0].onnx_file is not None
    expected = OnnxFileEmbedder(chosen[0]).embed(TEXTS)
    in_process = embedding_provider(ShardSettings(embedder=str(directory), embed_process=False))
    assert isinstance(in_process, OnnxFileEmbedder)
    assert np.allclose(in_process.embed(TEXTS), expected, atol=1e-6)
    child = ProcessEmbedder(chosen[0], threads=1, int8=True)
    try:
        assert child.name == chosen[0].identity(int8=False)  # run as supplied: never int8
        assert np.allclose(child.embed(TEXTS), expected, atol=1e-6)
    finally:
        child.close()


@pytest.mark.parametrize(("damage", "named"), [
    (lambda d: (d / "onnx" / "model.onnx").write_bytes(b"not a graph"), "not an ONNX model"),
    (lambda d: _edit(d / "config.json", hidden_size=48), "hidden_size 48"),
    (lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json"),
    (lambda d: shutil.rmtree(d / "1_Pooling"), "1_Pooling"),
])
def test_an_exported_encoder_that_cannot_run_is_refused_naming_what_is_wrong(
        tmp_path: Path, damage: object, named: str) -> None:
    directory = exported(_tiny_bert(tmp_path / "tiny"), tmp_path / "tiny-onnx")
    damage(directory)  # type: ignore[operator]
    with pytest.raises(ModelDirError, match=named):
        OnnxFileEmbedder(inspect_model_dir(directory))


@pytest.mark.parametrize(("change", "named"), [
    ({"extra_input": "pixel_values"}, "input 'pixel_values'"),
    ({"output": "logits"}, "no output named"),
])
def test_a_graph_that_is_not_a_sentence_encoder_is_refused(
        tmp_path: Path, change: dict[str, str], named: str) -> None:
    directory = exported(_tiny_bert(tmp_path / "tiny"), tmp_path / "tiny-onnx", **change)
    with pytest.raises(ModelDirError, match=named):
        OnnxFileEmbedder(inspect_model_dir(directory))


def test_a_directory_with_neither_weights_nor_an_export_names_both(tmp_path: Path) -> None:
    directory = exported(_tiny_bert(tmp_path / "tiny"), tmp_path / "tiny-onnx")
    (directory / "onnx" / "model.onnx").unlink()
    with pytest.raises(ModelDirError, match=r"model\.safetensors is missing.*onnx/model\.onnx"):
        inspect_model_dir(directory)
    assert json.loads((directory / "config.json").read_text())["hidden_size"] == 32
