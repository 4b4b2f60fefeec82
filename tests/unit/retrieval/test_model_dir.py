"""An operator's model directory: checked before it loads, run by the same graph as MiniLM,
and identified by what decides its vectors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from services.shard.retrieval.embedding import (
    BertEmbedder,
    default_minilm_dir,
    minilm_spec,
    provider_name,
)
from services.shard.retrieval.embedding_onnx import OnnxBertEmbedder
from services.shard.retrieval.model_dir import (
    IDENTITY_MAX,
    ModelDirError,
    ModelSpec,
    bert_weight_names,
    inspect_model_dir,
)
from services.shard.server import embedder_spec
from services.shard.settings import ShardSettings

TEXTS = [
    "Caroline went to a support group yesterday.",
    "Deploy the shard with two replicas, then run the migrations.",
    "ok",
    "a longer sentence with quite a few more tokens in it, so that a batch needs padding and "
    "the mask has to keep padded positions out of every layer and out of the pooling",
]


def _tiny_bert(directory: Path, *, pooling: str = "cls", prefix: str = "",
               mpnet: bool = False) -> Path:
    """A random 2-layer BERT (hidden 32) with MiniLM's tokenizer, saved as sentence-transformers
    saves a model: small enough to build in a test, shaped like BGE (CLS pooling), or like
    all-mpnet-base-v2 (MPNet's tensor names, relative-position bias, positions offset)."""
    directory.mkdir(parents=True)
    hidden, heads, layers, inter, vocab, positions = 32, 4, 2, 64, 30522, 64
    config = {"model_type": "mpnet" if mpnet else "bert", "hidden_size": hidden,
              "num_attention_heads": heads,
              "num_hidden_layers": layers, "intermediate_size": inter, "hidden_act": "gelu",
              "layer_norm_eps": 1e-12, "max_position_embeddings": positions,
              "vocab_size": vocab, "type_vocab_size": 2, "_name_or_path": "acme/tiny-bge"}
    if mpnet:
        config.update(relative_attention_num_buckets=32, pad_token_id=1,
                      max_position_embeddings=positions + 2, layer_norm_eps=1e-5)
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": hidden, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean"}))
    shutil.copyfile(default_minilm_dir() / "tokenizer.json", directory / "tokenizer.json")
    rng = np.random.default_rng(7)
    shapes = {"embeddings.word_embeddings.weight": (vocab, hidden),
              "embeddings.position_embeddings.weight": (positions, hidden),
              "embeddings.token_type_embeddings.weight": (2, hidden)}
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for part in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            shapes[p + part + ".weight"] = (hidden, hidden)
        shapes[p + "intermediate.dense.weight"] = (inter, hidden)
        shapes[p + "output.dense.weight"] = (hidden, inter)
    spec = ModelSpec(directory=directory, name="t", hidden=hidden, heads=heads, layers=layers,
                     intermediate=inter, layer_norm_eps=1e-12, pooling=pooling, max_tokens=64,
                     digest="")
    tensors = {}
    for name in bert_weight_names(spec):
        if name in shapes:
            tensors[name] = rng.normal(0, 0.2, shapes[name]).astype(np.float32)
        elif "LayerNorm.weight" in name:
            tensors[name] = (1 + rng.normal(0, 0.05, hidden)).astype(np.float32)
        else:  # biases: the output size of their layer
            size = inter if "intermediate" in name else hidden
            tensors[name] = rng.normal(0, 0.05, size).astype(np.float32)
    if mpnet:
        tensors = _as_mpnet(tensors, rng, heads)
    save_file({prefix + k: v for k, v in tensors.items()}, str(directory / "model.safetensors"))
    return directory


def _as_mpnet(tensors: dict[str, np.ndarray], rng: np.random.Generator,
              heads: int) -> dict[str, np.ndarray]:
    renames = {"attention.self.query": "attention.attn.q", "attention.self.key": "attention.attn.k",
               "attention.self.value": "attention.attn.v",
               "attention.output.dense": "attention.attn.o",
               "attention.output.LayerNorm": "attention.LayerNorm"}
    out = {}
    for name, value in tensors.items():
        for bert, mpnet in renames.items():
            name = name.replace(bert, mpnet)
        out[name] = value
    del out["embeddings.token_type_embeddings.weight"]
    positions = out["embeddings.position_embeddings.weight"]
    out["embeddings.position_embeddings.weight"] = np.vstack(
        [rng.normal(0, 0.2, (2, positions.shape[1])).astype(np.float32), positions])
    out["encoder.relative_attention_bias.weight"] = rng.normal(0, 1.0, (32, heads)).astype(
        np.float32)
    return out


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return _tiny_bert(tmp_path / "tiny")


def test_a_cls_pooled_model_runs_the_same_on_onnx_as_on_the_numpy_reference(tiny: Path) -> None:
    spec = inspect_model_dir(tiny)
    assert (spec.pooling, spec.hidden, spec.layers, spec.max_tokens) == ("cls", 32, 2, 64)
    onnx_vectors = OnnxBertEmbedder(spec).embed(TEXTS)
    reference = BertEmbedder(spec).embed(TEXTS)
    assert onnx_vectors.shape == (len(TEXTS), 32)
    assert np.allclose(np.linalg.norm(onnx_vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(onnx_vectors, reference, atol=1e-4)


def test_an_mpnet_model_runs_the_same_on_onnx_as_on_the_numpy_reference(tmp_path: Path) -> None:
    spec = inspect_model_dir(_tiny_bert(tmp_path / "tiny-mpnet", pooling="mean", mpnet=True))
    assert (spec.architecture, spec.position_offset, spec.relative_buckets, spec.max_tokens) == \
        ("mpnet", 2, 32, 64)
    reference = BertEmbedder(spec).embed(TEXTS)
    assert np.allclose(OnnxBertEmbedder(spec).embed(TEXTS), reference, atol=1e-4)
    # The relative bias matters: without it the vectors differ.
    flat = BertEmbedder(spec)
    flat._relative = None
    assert not np.allclose(flat.embed(TEXTS), reference, atol=1e-3)


def test_mean_pooling_and_a_bert_prefixed_checkpoint_load_alike(tmp_path: Path) -> None:
    plain = inspect_model_dir(_tiny_bert(tmp_path / "plain", pooling="mean"))
    prefixed = inspect_model_dir(_tiny_bert(tmp_path / "prefixed", pooling="mean",
                                            prefix="bert."))
    a, b = BertEmbedder(plain).embed(TEXTS), BertEmbedder(prefixed).embed(TEXTS)
    assert np.allclose(a, b, atol=1e-6)
    assert np.allclose(OnnxBertEmbedder(prefixed).embed(TEXTS), a, atol=1e-4)
    # Same tensors, different file bytes (the prefix): a different identity, so vectors
    # stored by one are never served as the other's.
    assert plain.identity(int8=False) != prefixed.identity(int8=False)


def test_the_packaged_minilm_as_an_operator_directory_gives_minilm_vectors(
    tmp_path: Path,
) -> None:
    copy = tmp_path / "minilm"
    shutil.copytree(default_minilm_dir(), copy)
    spec = inspect_model_dir(copy)
    assert spec.name == "minilm" and spec.max_tokens == 256
    short = TEXTS[:3]  # under 128 tokens, where the packaged model's truncation does not bite
    assert np.allclose(OnnxBertEmbedder(spec).embed(short),
                       OnnxBertEmbedder().embed(short), atol=1e-5)
    # The packaged model keeps its historical name; the copy is name@digest.
    assert provider_name(minilm_spec(), int8=True) == "all-MiniLM-L6-v2-int8"
    assert provider_name(spec, int8=True) == spec.identity(int8=True)
    assert "@" in spec.identity(int8=True)


def test_identity_fits_the_vector_table_and_follows_every_file(tiny: Path) -> None:
    tiny = tiny.rename(tiny.parent / ("bge-" + "x" * 200))  # named by its directory
    first = inspect_model_dir(tiny)
    assert first.name.startswith("bge-x")
    assert len(first.identity(int8=True)) <= IDENTITY_MAX
    assert first.identity(int8=True).endswith("-int8")
    assert first.identity(int8=True) != first.identity(int8=False)
    weights = (tiny / "model.safetensors").read_bytes()
    (tiny / "model.safetensors").write_bytes(weights[:-1] + bytes([weights[-1] ^ 1]))
    assert inspect_model_dir(tiny).digest != first.digest
    assert inspect_model_dir(tiny, max_tokens=32).digest != inspect_model_dir(tiny).digest


@pytest.mark.parametrize(("damage", "named"), [
    (lambda d: (d / "tokenizer.json").unlink(), "tokenizer.json"),
    (lambda d: (d / "model.safetensors").unlink(), "model.safetensors"),
    (lambda d: (d / "config.json").unlink(), "config.json"),
    (lambda d: shutil.rmtree(d / "1_Pooling"), "1_Pooling"),
    (lambda d: (d / "config.json").write_text("{not json"), "not readable JSON"),
    (lambda d: _edit(d / "config.json", model_type="xlm-roberta"), "xlm-roberta"),
    (lambda d: _edit(d / "config.json", hidden_act="relu"), "hidden_act"),
    (lambda d: _edit(d / "config.json", num_attention_heads=5), "multiple"),
    (lambda d: _edit(d / "config.json", num_hidden_layers=0), "num_hidden_layers"),
    (lambda d: _edit(d / "1_Pooling" / "config.json", pooling_mode_cls_token=False,
                     pooling_mode_max_tokens=True), "pooling"),
])
def test_a_malformed_directory_is_refused_naming_what_is_wrong(
    tiny: Path, damage: object, named: str
) -> None:
    damage(tiny)  # type: ignore[operator]
    with pytest.raises(ModelDirError, match=named):
        inspect_model_dir(tiny)


def test_weights_that_do_not_match_the_config_are_refused_when_loaded(tiny: Path) -> None:
    _edit(tiny / "config.json", num_hidden_layers=3)  # the file holds two layers
    with pytest.raises(ModelDirError, match=r"encoder\.layer\.2"):
        BertEmbedder(inspect_model_dir(tiny))
    _edit(tiny / "config.json", num_hidden_layers=2, intermediate_size=48)
    with pytest.raises(ModelDirError, match="intermediate"):
        BertEmbedder(inspect_model_dir(tiny))
    (tiny / "model.safetensors").write_bytes(b"not safetensors")
    _edit(tiny / "config.json", intermediate_size=64)
    with pytest.raises(ModelDirError, match="not a readable safetensors"):
        BertEmbedder(inspect_model_dir(tiny))


def test_the_setting_names_a_model_or_a_directory(tiny: Path) -> None:
    chosen = embedder_spec(ShardSettings(embedder=str(tiny), embed_int8=False))
    assert chosen is not None and chosen[0].directory == tiny and chosen[1] is False
    assert embedder_spec(ShardSettings(embedder="none")) is None
    with pytest.raises(ValueError, match="model directory"):
        embedder_spec(ShardSettings(embedder="bge-small"))
    with pytest.raises(ModelDirError, match="does not exist"):
        embedder_spec(ShardSettings(embedder=str(tiny / "absent")))


def _edit(path: Path, **changes: object) -> None:
    value = json.loads(path.read_text())
    value.update(changes)
    path.write_text(json.dumps(value))


def test_an_operator_model_quantized_too_far_from_float32_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.shard.retrieval import embedding_onnx

    copy = tmp_path / "minilm"
    shutil.copytree(default_minilm_dir(), copy)
    spec = inspect_model_dir(copy)
    OnnxBertEmbedder(spec, int8=True)  # MiniLM's int8 passes the check (mean cosine 0.99)
    monkeypatch.setattr(embedding_onnx, "INT8_MIN_COSINE", 1.01)  # nothing can pass this
    with pytest.raises(ModelDirError, match="ENGRAM_SHARD_EMBED_INT8=false"):
        OnnxBertEmbedder(spec, int8=True)


def test_the_float32_reference_session_is_gone_before_the_heap_is_trimmed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The int8 check's float32 session was kept until the constructor returned, after the
    heap trim, so the embedder process held ~60 MB more; the packaged model needs no check."""
    import gc
    import weakref

    import onnxruntime

    from services.shard.retrieval import embedding_onnx

    made: list[int] = []
    live: weakref.WeakSet[object] = weakref.WeakSet()

    class Counted(onnxruntime.InferenceSession):  # type: ignore[misc]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            made.append(1)
            live.add(self)

    at_trim: list[int] = []

    def trim() -> bool:
        gc.collect()
        at_trim.append(len(live))
        return True

    monkeypatch.setattr(onnxruntime, "InferenceSession", Counted)
    monkeypatch.setattr(embedding_onnx, "trim_heap", trim)
    OnnxBertEmbedder(int8=True)  # the packaged MiniLM: its int8 graph is tested, not checked
    assert len(made) == 1 and at_trim == [1]
    copy = tmp_path / "minilm"
    shutil.copytree(default_minilm_dir(), copy)
    made.clear()
    OnnxBertEmbedder(inspect_model_dir(copy), int8=True)  # an operator's: checked
    assert len(made) == 3, "the operator's int8 graph is compared with a float32 session"
    assert at_trim == [1, 1], "only the embedder's own session is alive at the trim"


def test_an_encoder_built_apart_gives_the_same_vectors(tmp_path: Path) -> None:
    """The embedder process builds its graph in a child process (encoder_build) and loads
    only the file: the vectors are those of a graph built in place."""
    texts = ["Caroline went to a support group.", "ok", "Deploy the shard with two replicas."]
    here = OnnxBertEmbedder(int8=True).embed(texts)
    apart = OnnxBertEmbedder(int8=True, build_apart=True).embed(texts)
    assert np.array_equal(here, apart)


def test_a_model_the_builder_refuses_is_refused_with_its_message(tmp_path: Path) -> None:
    copy = tmp_path / "minilm"
    shutil.copytree(default_minilm_dir(), copy)
    spec = inspect_model_dir(copy)
    (copy / "model.safetensors").write_bytes(b"not safetensors")  # after inspection
    with pytest.raises(ModelDirError, match="not a readable safetensors"):
        OnnxBertEmbedder(spec, int8=True, build_apart=True)
