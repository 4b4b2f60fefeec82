"""The model folder `engram bench chroma` writes for Chroma's default embedder: the files
Chroma looks for, and a graph that, fed the way Chroma feeds it, gives the shard's vectors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from engram.bench._chroma_model import TOKENIZER_FILES, write_chroma_minilm
from services.shard.retrieval.embedding_onnx import OnnxBertEmbedder

TEXTS = [
    "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.",
    "ok",
    "Deploy the shard with two replicas behind the load balancer, then run the migrations.",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chroma_minilm(tmp_path_factory.mktemp("chroma-model"))


def test_folder_holds_every_file_chromas_download_check_looks_for(folder: Path) -> None:
    assert {p.name for p in folder.iterdir()} == {*TOKENIZER_FILES, "model.onnx"}


def test_fed_as_chroma_feeds_it_the_graph_gives_the_shards_vectors(folder: Path) -> None:
    # Chroma's ONNXMiniLM_L6_V2._forward: pad to 256, int64 inputs, zero token types,
    # mean pooling over the attention mask on the first output, then L2 normalisation.
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=256)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", length=256)
    encoded = [tokenizer.encode(text) for text in TEXTS]
    ids = np.array([e.ids for e in encoded], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    hidden = session.run(
        None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    )[0]
    assert hidden.shape == (len(TEXTS), 256, 384)
    pooled = (hidden * mask[..., None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)

    shard = np.asarray(OnnxBertEmbedder(threads=1).embed(TEXTS))
    assert np.all((pooled * shard).sum(axis=1) > 0.9999)
