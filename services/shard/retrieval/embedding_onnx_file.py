"""A sentence encoder an operator supplies as an exported ONNX file, run as supplied.

A model directory may hold ``onnx/model.onnx`` (sentence-transformers' ONNX backend) or
``model.onnx`` (an optimum export) instead of ``model.safetensors``
(``model_dir.ONNX_FILES``). Its graph comes with it, so any encoder architecture runs
(BERT, RoBERTa/XLM-R, MPNet, ...), as long as it takes the tokenizer's ``input_ids`` and
``attention_mask`` (and, if it asks, ``token_type_ids``, fed zeros: one segment) and gives
either token states (``last_hidden_state`` or ``token_embeddings``: batch x length x hidden),
pooled here as its ``1_Pooling/config.json`` says, or a pooled ``sentence_embedding``. Rows
are L2-normalised like every encoder's. The file is not quantized here (quantize it before
mounting it for int8); ``ENGRAM_SHARD_EMBED_INT8`` does not apply to it.

Everything is checked at start, before the shard serves: a file ONNX Runtime cannot load, an
input the encoder cannot feed, no usable output, or rows whose width is not the config's
``hidden_size`` stop the shard (exit 2) naming the file and what is wrong.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from services.shard.retrieval.embedding import Batch, PooledEncoder, padded, provider_name
from services.shard.retrieval.model_dir import ModelDirError, ModelSpec

TOKEN_OUTPUTS = ("last_hidden_state", "token_embeddings")
POOLED_OUTPUT = "sentence_embedding"
_DTYPES: dict[str, type[np.integer]] = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}
_PROBE = "Engram checks the model before it serves."


class OnnxFileEmbedder(PooledEncoder):
    """The encoder in ``spec.onnx_file``; ``threads`` ONNX Runtime intra-op threads."""

    def __init__(self, spec: ModelSpec, *, threads: int = 1, batch_size: int = 32) -> None:
        import onnxruntime as ort

        if spec.onnx_file is None:
            raise ValueError("OnnxFileEmbedder needs a model directory holding an ONNX file")
        self._configure(spec, provider_name(spec, int8=False), batch_size)
        self._pooling = spec.pooling
        path = spec.onnx_file
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = max(1, threads)
        options.inter_op_num_threads = 1
        options.enable_cpu_mem_arena = False
        try:
            self._session = ort.InferenceSession(str(path), sess_options=options,
                                                 providers=["CPUExecutionProvider"])
        except Exception as error:  # ORT raises its own Fail/InvalidGraph/... types
            raise ModelDirError(f"{path} is not an ONNX model ONNX Runtime can load: "
                                f"{str(error).splitlines()[0][:300]}") from None
        self._inputs = self._feeds(path)
        self._output, self._pooled = self._chosen_output(path)
        width = self._forward(self._tokenizer.encode([_PROBE])).shape
        if width != (1, spec.hidden):
            raise ModelDirError(f"{path} gives rows of shape {width[1:]} for a text, but "
                                f"config.json says hidden_size {spec.hidden}")

    def _feeds(self, path: Any) -> dict[str, tuple[str, type[np.integer]]]:
        """Each graph input: what it is fed (ids, mask or zeros) and its integer type."""
        feeds = {}
        for item in self._session.get_inputs():
            kind = {"input_ids": "ids", "attention_mask": "mask",
                    "token_type_ids": "zeros"}.get(item.name)
            dtype = _DTYPES.get(item.type)
            if kind is None or dtype is None:
                raise ModelDirError(
                    f"{path}: input {item.name!r} ({item.type}) is not one a sentence encoder "
                    "is fed here (input_ids, attention_mask, token_type_ids; int64 or int32)")
            feeds[item.name] = (kind, dtype)
        for needed in ("input_ids", "attention_mask"):
            if needed not in feeds:
                raise ModelDirError(f"{path}: the graph has no {needed!r} input")
        return feeds

    def _chosen_output(self, path: Any) -> tuple[str, bool]:
        outputs = {item.name: item for item in self._session.get_outputs()}
        if POOLED_OUTPUT in outputs:
            return POOLED_OUTPUT, True
        for name in TOKEN_OUTPUTS:
            if name in outputs:
                return name, False
        raise ModelDirError(
            f"{path}: no output named {', '.join((*TOKEN_OUTPUTS, POOLED_OUTPUT))} (it has "
            f"{', '.join(outputs) or 'none'})")

    def _forward(self, batch: Batch) -> npt.NDArray[np.float32]:
        ids, mask = padded(batch, np.int64, np.int64)
        arrays = {"ids": ids, "mask": mask, "zeros": np.zeros_like(ids)}
        feed = {name: arrays[kind].astype(dtype, copy=False)
                for name, (kind, dtype) in self._inputs.items()}
        (out,) = self._session.run([self._output], feed)
        states = np.asarray(out, dtype=np.float32)
        if self._pooled:
            return states
        if states.ndim != 3:
            raise ModelDirError(f"output {self._output!r} has {states.ndim} dimensions, not "
                                "3 (batch, tokens, hidden)")
        if self._pooling == "cls":
            return np.ascontiguousarray(states[:, 0, :])
        weights = mask[:, :, None].astype(np.float32)
        pooled: npt.NDArray[np.float32] = (states * weights).sum(axis=1) / np.maximum(
            weights.sum(axis=1), 1e-9)
        return pooled
