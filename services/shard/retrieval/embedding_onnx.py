"""A BERT-family sentence encoder on ONNX Runtime, its graph built at start-up from its weights.

The default is the packaged all-MiniLM-L6-v2; any model directory that
``model_dir.inspect_model_dir`` accepts (mean or CLS pooling) builds the same way, sized by
its config.

Why: indexing needs ~300 texts/s and a query a few ms on two shared cores; the numpy forward
pass (``embedding.BertEmbedder``, kept as the reference) gives ~50 texts/s and ~15 ms.
The graph uses ONNX Runtime's fused CPU kernels from the ``com.microsoft`` domain
(EmbedLayerNormalization, Attention, BiasGelu, SkipLayerNormalization); in float32 it is
compute-bound at ~85 texts/s a core, so the default is its int8 dynamic quantization (VNNI
integer matmuls, ~180 texts/s a core). ORT releases the GIL while it runs. The graph is
written with ``onnx.helper`` straight from ``model.safetensors``: no torch, no export step,
no model file kept on disk (the session reads it from a temporary directory, removed once
it is loaded).
"""

from __future__ import annotations

import logging
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from services.common.memory import trim_heap
from services.common.priority import lower_this_thread
from services.shard.retrieval.embedding import (
    MINILM_NAME,
    Batch,
    PooledEncoder,
    SentenceTokenizer,
    minilm_spec,
    padded,
    provider_name,
)
from services.shard.retrieval.model_dir import (
    RELATIVE_BIAS,
    WORD_TABLE,
    ModelDirError,
    ModelSpec,
    load_encoder_weights,
    relative_position_bias,
    weights_stamp,
    word_table,
)

if TYPE_CHECKING:
    from onnx import ModelProto

_IR_VERSION = 10  # readable by every onnxruntime >= 1.20
_OPSET = 17


def bert_graph(weights: dict[str, npt.NDArray[np.float32]], spec: ModelSpec, *,
               pool: bool = True, word_input: bool = False) -> ModelProto:
    """The ONNX model: ``input_ids``, ``mask`` (int32, batch x length) in, pooled (mean or
    CLS token, as ``spec`` says; not normalised) float32 rows out; with ``pool=False`` the
    last hidden states (batch x length x hidden, ``last_hidden_state``) instead, as an
    exported transformer gives them. With ``word_input`` the token embedding table is an
    input (``word``, fed on every run: :func:`model_dir.word_table` maps it from the weights
    file) instead of a weight the session holds in its own memory; the output is the same,
    bit for bit.

    Token type 0 is folded into the position embeddings (a sentence encoder has one segment),
    so EmbedLayerNormalization needs no segment input. Attention takes the mask as per-row
    lengths (EmbedLayerNormalization's ``mask_index``): the tokenizer pads on the right only.
    """
    from onnx import ModelProto, TensorProto, helper, numpy_helper

    # Filled in place: helper.make_graph / make_model would each copy every weight once more.
    model = ModelProto(ir_version=_IR_VERSION, producer_name="engram")
    model.opset_import.extend(
        [helper.make_opsetid("", _OPSET), helper.make_opsetid("com.microsoft", 1)]
    )
    graph = model.graph
    graph.name = spec.name
    epsilon = spec.layer_norm_eps

    def const(name: str, array: npt.NDArray[Any]) -> str:
        graph.initializer.add().CopyFrom(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    w = weights
    nodes = [
        helper.make_node(
            "EmbedLayerNormalization",
            [
                "input_ids",
                "",
                "word" if word_input else const("word", w[WORD_TABLE]),
                const(
                    "position",
                    w["embeddings.position_embeddings.weight"]
                    + w["embeddings.token_type_embeddings.weight"][0],
                ),
                "",
                const("emb_gamma", w["embeddings.LayerNorm.weight"]),
                const("emb_beta", w["embeddings.LayerNorm.bias"]),
                "mask",
            ],
            ["x0", "lengths"],
            domain="com.microsoft",
            epsilon=epsilon,
        )
    ]
    x = "x0"
    attention_bias = ""
    if spec.relative_buckets:
        # MPNet: every layer adds the same (1, heads, length, length) relative-position bias,
        # cut from a table over max_tokens by the batch's length.
        table = relative_position_bias(spec, w[RELATIVE_BIAS])[None]
        nodes += [
            helper.make_node("Shape", ["input_ids"], ["ids_shape"]),
            helper.make_node("Slice", ["ids_shape", const("one", np.array([1])),
                                       const("two", np.array([2]))], ["length"]),
            helper.make_node("Concat", ["length", "length"], ["length2"], axis=0),
            helper.make_node("Slice", [const("relative_table", table),
                                       const("zeros2", np.array([0, 0])), "length2",
                                       const("axes23", np.array([2, 3]))], ["relative_bias"]),
        ]
        attention_bias = "relative_bias"
    for i in range(spec.layers):
        p, n = f"encoder.layer.{i}.", f"l{i}_"
        qkv_w = np.concatenate(
            [w[p + f"attention.self.{k}.weight"].T for k in ("query", "key", "value")], axis=1
        )
        qkv_b = np.concatenate(
            [w[p + f"attention.self.{k}.bias"] for k in ("query", "key", "value")]
        )
        if attention_bias:
            # The fused Attention op takes the bias, but its int8 form (QAttention) has no
            # input for it: the projection is a MatMul the quantizer handles, the attention
            # itself MultiHeadAttention (which adds the projection's bias).
            nodes += [
                helper.make_node("MatMul", [x, const(n + "qkv_w", qkv_w)], [n + "qkv"]),
                helper.make_node("Split", [n + "qkv", const(n + "thirds", np.array(
                    [spec.hidden] * 3))], [n + "q", n + "k", n + "v"], axis=2),
                helper.make_node(
                    "MultiHeadAttention",
                    [n + "q", n + "k", n + "v", const(n + "qkv_b", qkv_b), "lengths",
                     attention_bias],
                    [n + "context"],
                    domain="com.microsoft",
                    num_heads=spec.heads,
                ),
            ]
        else:
            nodes.append(helper.make_node(
                "Attention",
                [x, const(n + "qkv_w", qkv_w), const(n + "qkv_b", qkv_b), "lengths"],
                [n + "context"],
                domain="com.microsoft",
                num_heads=spec.heads,
            ))
        nodes += [
            helper.make_node(
                "MatMul",
                [n + "context", const(n + "out_w", w[p + "attention.output.dense.weight"].T)],
                [n + "attended"],
            ),
            helper.make_node(
                "SkipLayerNormalization",
                [
                    n + "attended",
                    x,
                    const(n + "ln1_gamma", w[p + "attention.output.LayerNorm.weight"]),
                    const(n + "ln1_beta", w[p + "attention.output.LayerNorm.bias"]),
                    const(n + "out_b", w[p + "attention.output.dense.bias"]),
                ],
                [n + "h"],
                domain="com.microsoft",
                epsilon=epsilon,
            ),
            helper.make_node(
                "MatMul",
                [n + "h", const(n + "up_w", w[p + "intermediate.dense.weight"].T)],
                [n + "up"],
            ),
            # BiasGelu is the exact (erf) GELU; FastGelu's tanh form would drift from BERT.
            helper.make_node(
                "BiasGelu",
                [n + "up", const(n + "up_b", w[p + "intermediate.dense.bias"])],
                [n + "act"],
                domain="com.microsoft",
            ),
            helper.make_node(
                "MatMul",
                [n + "act", const(n + "down_w", w[p + "output.dense.weight"].T)],
                [n + "down"],
            ),
            helper.make_node(
                "SkipLayerNormalization",
                [
                    n + "down",
                    n + "h",
                    const(n + "ln2_gamma", w[p + "output.LayerNorm.weight"]),
                    const(n + "ln2_beta", w[p + "output.LayerNorm.bias"]),
                    const(n + "down_b", w[p + "output.dense.bias"]),
                ],
                [n + "out"],
                domain="com.microsoft",
                epsilon=epsilon,
            ),
        ]
        x = n + "out"
    if not pool:
        nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    elif spec.pooling == "cls":
        # A 0-d index drops the length axis (np.ascontiguousarray in const() would make it 1-d).
        graph.initializer.add().CopyFrom(numpy_helper.from_array(np.array(0, np.int64), "first"))
        nodes.append(helper.make_node("Gather", [x, "first"], ["pooled"], axis=1))
    else:
        # Mean pooling over the mask (padding rows carry values; they must not count).
        nodes += [
            helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["mask_f", const("axis2", np.array([2]))],
                             ["mask_3d"]),
            helper.make_node("Mul", [x, "mask_3d"], ["masked"]),
            helper.make_node(
                "ReduceSum", ["masked", const("axis1", np.array([1]))], ["summed"], keepdims=0
            ),
            helper.make_node("ReduceSum", ["mask_f", "axis1"], ["counts"], keepdims=1),
            helper.make_node("Div", ["summed", "counts"], ["pooled"]),
        ]
    for node in nodes:
        node.name = node.output[0]  # named, so quantization can include or exclude nodes
    batch_by_length = ["batch", "length"]
    graph.node.extend(nodes)
    graph.input.extend(
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT32, batch_by_length),
            helper.make_tensor_value_info("mask", TensorProto.INT32, batch_by_length),
        ]
    )
    if word_input:
        graph.input.append(helper.make_tensor_value_info(
            "word", TensorProto.FLOAT, list(w[WORD_TABLE].shape)))
    graph.output.append(
        helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", spec.hidden])
        if pool else helper.make_tensor_value_info(
            "last_hidden_state", TensorProto.FLOAT, [*batch_by_length, spec.hidden]))
    return model


def quantize_int8(model: ModelProto, out: Path, spec: ModelSpec) -> None:
    """Int8 dynamic quantization of the Attention and MatMul weights, per output channel,
    written to ``out``.

    Per-channel weights keep MiniLM's mean cosine to the fp32 model at 0.993 (per-tensor:
    0.955); the embedding table stays fp32 (quantizing it saves memory, not time).
    Activations are quantized at run time with one scale per tensor, so a text's vector
    depends on the other rows of its batch: the int8 embedder runs one text at a time.

    MPNet's feed-forward outputs see activations of 55-100 where 99.9% stay under 3 (layers
    6-10), and signed int8 weights saturate AVX2's 16-bit pair sums: quantized like MiniLM
    its vectors are noise (cosine ~0 to fp32). Unsigned weights with the feed-forward
    down-projections kept in fp32 give 0.992 at about half the fp32 cost.
    """
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The quantizer logs through the root logger: one line per tensor at INFO and a generic
    # "consider pre-processing" WARNING (not applicable: the graph is built fused). Kept out
    # of the service's log; its errors still pass.
    root = logging.getLogger()
    chatter = _QuantizerChatter()
    root.addFilter(chatter)
    try:
        relative = spec.relative_buckets > 0
        quantize_dynamic(
            model,
            out,
            op_types_to_quantize=["Attention", "MatMul"],
            per_channel=True,
            weight_type=QuantType.QUInt8 if relative else QuantType.QInt8,
            nodes_to_exclude=[node.name for node in model.graph.node
                              if relative and node.name.endswith("_down")],
            # ONNX shape inference knows no com.microsoft op, so it cannot type their outputs.
            extra_options={"DefaultTensorType": TensorProto.FLOAT},
        )
    finally:
        root.removeFilter(chatter)


class _QuantizerChatter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or "onnxruntime" not in record.pathname


INT8_MIN_COSINE = 0.98
INT8_CHECK_TEXTS = [
    "Caroline: I went to a support group yesterday and it was so powerful.",
    "The stock market fell sharply after the central bank raised interest rates.",
    "Deploy the shard with two replicas behind the load balancer, then run the migrations.",
    "ok",
    "[shares a photo of a dog sitting on a wooden porch next to a red bicycle]",
    "What did Melanie paint last summer, and who was it for?",
]


def session_options() -> Any:
    """One ORT thread a session (the embedder runs sessions side by side), no arena."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    # Activations are allocated per run: an arena would keep the largest batch's buffers.
    options.enable_cpu_mem_arena = False
    return options


def build_encoder_file(spec: ModelSpec, int8: bool, path: Path) -> None:
    """Write ``spec``'s encoder graph to ``path``: float32, or int8-quantized (an operator's
    int8 model compared with its float32 graph first: :func:`check_int8`)."""
    import onnx
    import onnxruntime as ort

    model = bert_graph(load_encoder_weights(spec), spec, word_input=True)
    onnx.save(model, path)
    if not int8:
        return
    # The packaged model's int8 graph is tested, not checked at each start.
    reference = (None if provider_name(spec, int8=True) == MINILM_NAME + "-int8" else
                 ort.InferenceSession(str(path), sess_options=session_options(),
                                      providers=["CPUExecutionProvider"]))
    quantize_int8(model, path, spec)
    del model
    if reference is not None:
        quantized = ort.InferenceSession(str(path), sess_options=session_options(),
                                         providers=["CPUExecutionProvider"])
        check_int8(reference, quantized, spec)


def check_int8(reference: Any, quantized: Any, spec: ModelSpec) -> None:
    """An operator's model quantized badly gives vectors that look fine and rank noise:
    compare with float32 on a few sentences and refuse it below :data:`INT8_MIN_COSINE`."""
    ids = SentenceTokenizer(spec.directory, spec.max_tokens).encode(INT8_CHECK_TEXTS)
    table = word_table(spec)
    cosines = []
    for row in ids:
        token_ids, mask = padded([row], np.int32, np.int32)
        feed = {"input_ids": token_ids, "mask": mask, "word": table}
        (exact,) = reference.run(["pooled"], feed)
        (int8,) = quantized.run(["pooled"], feed)
        a, b = exact[0], int8[0]
        cosines.append(float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12)))
    mean = sum(cosines) / len(cosines)
    if mean < INT8_MIN_COSINE:
        raise ModelDirError(
            f"{spec.directory}: int8 vectors are too far from float32 (mean cosine "
            f"{mean:.3f} < {INT8_MIN_COSINE}); set ENGRAM_SHARD_EMBED_INT8=false")


class OnnxBertEmbedder(PooledEncoder):
    """A BERT-family encoder (normalised rows) on ONNX Runtime; default all-MiniLM-L6-v2.

    ``threads`` is how many batches run at once, each on one ORT thread: the int8 model runs
    one text per batch, and a single short text does not split well across intra-op threads
    (int8: 178 texts/s with one thread, 185 with two intra-op threads, ~380 with two
    concurrent runs). The calling thread runs its share itself, so a one-text query never
    waits behind another call's batches in the pool.
    """

    def __init__(
        self,
        spec: ModelSpec | None = None,
        *,
        threads: int = 1,
        int8: bool = False,
        batch_size: int = 32,
        pool_niceness: int = 0,
        build_apart: bool = False,
    ) -> None:
        import onnxruntime as ort

        spec = spec or minilm_spec()
        # Dynamic int8 quantization scales activations per tensor, i.e. per batch; one text
        # per run keeps a vector a function of its text alone, at the same throughput.
        self._configure(spec, provider_name(spec, int8=int8), 1 if int8 else batch_size)
        self._threads = max(1, threads)
        self._pool = (
            ThreadPoolExecutor(self._threads - 1, thread_name_prefix="encoder",
                               initializer=lower_this_thread, initargs=(pool_niceness,))
            if self._threads > 1
            else None
        )
        # Loaded from a file read once: a session made from bytes keeps them for its lifetime.
        with tempfile.TemporaryDirectory(prefix="engram-encoder-") as scratch:
            path = Path(scratch) / "encoder.onnx"
            if build_apart:
                from services.shard.retrieval.encoder_build import build_apart as build

                build(spec, int8, path)
            else:
                build_encoder_file(spec, int8, path)
            self._session = ort.InferenceSession(
                str(path), sess_options=session_options(), providers=["CPUExecutionProvider"]
            )
        # The token table is not in the graph: mapped from the weights file, fed on each run.
        # A file rewritten in place would feed another model's table to these layers: each
        # call checks it is the file mapped (one stat) and refuses otherwise.
        self._weights = spec.weights_file
        self._stamp = weights_stamp(self._weights)
        self._word = word_table(spec)
        trim_heap()  # the float graph, the quantizer's copies and the float session are gone

    def _run(self, batches: list[Batch]) -> list[npt.NDArray[np.float32]]:
        """Batches in ``threads`` interleaved stripes; ORT releases the GIL while it runs."""
        self._require_weights_unchanged()  # once a call, not once a batch (a text, in int8)
        serial = super()._run
        if self._pool is None or len(batches) < 2:
            return serial(batches)
        stripes = [batches[i :: self._threads] for i in range(self._threads)]
        others = [self._pool.submit(serial, stripe) for stripe in stripes[1:]]
        done = [serial(stripes[0]), *(future.result() for future in others)]
        return [done[k % self._threads][k // self._threads] for k in range(len(batches))]

    def _require_weights_unchanged(self) -> None:
        try:
            same = weights_stamp(self._weights) == self._stamp
        except OSError:
            same = False
        if not same:
            raise ModelDirError(f"{self._weights} changed (or went) under the running embedder; "
                                "restart the shard to load the model anew")

    def _forward(self, batch: Batch) -> npt.NDArray[np.float32]:
        token_ids, mask = padded(batch, np.int32, np.int32)
        (pooled,) = self._session.run(["pooled"], {"input_ids": token_ids, "mask": mask,
                                                   "word": self._word})
        out: npt.NDArray[np.float32] = pooled
        return out


def onnx_encoder(spec: ModelSpec | None, *, threads: int = 1, int8: bool = False,
                 pool_niceness: int = 0, build_apart: bool = False) -> PooledEncoder:
    """The encoder for ``spec``: its exported ONNX file as supplied when it has one
    (``embedding_onnx_file``; ``int8`` does not apply), else the graph built from its weights
    (with ``build_apart``, in a process of its own: :mod:`encoder_build`)."""
    if spec is not None and spec.onnx_file is not None:
        from services.shard.retrieval.embedding_onnx_file import OnnxFileEmbedder

        return OnnxFileEmbedder(spec, threads=threads)
    return OnnxBertEmbedder(spec, threads=threads, int8=int8, pool_niceness=pool_niceness,
                            build_apart=build_apart)
