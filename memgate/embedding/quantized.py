"""The embedding model with its matrix products computed in int8 (`embedding_compute=int8`).

The shipped all-MiniLM-L6-v2 file stores its weights as int8 with per-row scales, but its graph
multiplies them back to float32 (Cast, Mul), which onnxruntime folds at load: every run then
streams ~42 MB of float weights through the cache, and a 5-token query costs ~3.4 ms, a LoCoMo
turn ~10 ms of CPU (measured, docs/DECISIONS.md). Here the folded graph is quantized again with
onnxruntime's own dynamic quantization (per output channel, int8 weights, only products by a
constant weight, activations quantized per run): ~1.4 ms and ~4.7 ms, vectors at cosine 0.993 on
average to the float ones, the same recall on the development half.

Before quantizing, each layer's self-attention becomes one `MultiHeadAttention` node
(onnxruntime's contrib operator): as exported, it took ~25 nodes per layer (reshapes, transposes,
slices, the padding mask's Where/IsNaN), and for a short text their dispatch cost more than its
products. The mask goes: `OnnxEmbedder` runs each text alone, never padded, so every position
counts. The fused graph is kept only when it gives the exported graph's output on a probe input
(a model of another layout runs as exported). Query 1.96 -> 1.54 ms, a note 3.42 -> 2.85 ms of
CPU (measured), the same vectors.

Built once per model file, recipe and onnxruntime version, in a cache directory, and reused.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import onnxruntime as ort

if TYPE_CHECKING:
    import onnx

RECIPE = "fold, attention fused, int8 per channel (2)"  # part of the cache key
# Hugging Face's names for a BERT layer's attention biases: where each projection is added.
QUERY_BIAS = re.compile(r"(.*)attention\.self\.query\.bias$")
PROJECTIONS = ("attention.self.query.bias", "attention.self.key.bias",
               "attention.self.value.bias", "attention.output.dense.bias")
HEADS = (12, 16, 8, 6, 4, 2, 1)  # tried in turn, kept if the output agrees

log = logging.getLogger("memgate.embedding")


def int8_model(source: Path, cache: Path) -> Path:
    """The int8-compute version of `source`, built into `cache` unless already there. Several
    processes may build it at once: each writes its own file and renames it into place."""
    stat = source.stat()
    key = hashlib.sha256(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|"
                         f"{ort.__version__}|{RECIPE}".encode()).hexdigest()[:16]
    target = cache / f"{source.stem}-{key}.int8.onnx"
    if target.exists():
        return target
    import onnx  # slow to import: only when building
    from onnxruntime.quantization import QuantType, quantize_dynamic

    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".building-") as tmp:
        folded, built = Path(tmp) / "folded.onnx", Path(tmp) / "int8.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)  # the weights folded back to float
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        exported = onnx.load(str(folded))
        fused = next((m for heads in HEADS
                      if (m := fused_attention(exported, heads)) is not None
                      and agrees(m, exported)), None)
        if fused is not None:
            onnx.save(fused, str(folded))
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # quantize_dynamic advises pre-processing on the root log
        try:
            quantize_dynamic(folded, built, weight_type=QuantType.QInt8, per_channel=True,
                             extra_options={"MatMulConstBOnly": True})
        finally:
            root.setLevel(level)
        os.replace(built, target)
    log.info("embedding model quantized for int8 compute: %s", target.name)
    return target


def fused_attention(model: onnx.ModelProto, heads: int) -> onnx.ModelProto | None:
    """`model` with each layer's self-attention computed by one `MultiHeadAttention` node of
    `heads` heads, without the padding mask; None when its layers are not laid out as
    expected. From the projections (the Adds of the query, key and value biases) to the input
    of the output projection, every node is replaced."""
    import onnx
    from onnx import helper

    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    initializers = {i.name for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)

    def added(bias: str) -> str | None:  # the output of the one Add of this bias
        nodes = users.get(bias, [])
        return nodes[0].output[0] if len(nodes) == 1 and nodes[0].op_type == "Add" else None

    attention, replaced = [], set()
    for name in sorted(initializers):
        if (hit := QUERY_BIAS.match(name)) is None:
            continue
        q, k, v, out = (added(hit.group(1) + suffix) for suffix in PROJECTIONS)
        if q is None or k is None or v is None or out is None:
            return None
        products = [producer[i] for i in producer[out].input
                    if i in producer and producer[i].op_type == "MatMul"]
        if len(products) != 1 or products[0].input[0] not in producer:
            return None
        context = products[0].input[0]  # what the output projection multiplies
        replaced.add(id(producer[context]))
        attention.append(helper.make_node("MultiHeadAttention", [q, k, v], [context],
                                          name=f"{hit.group(1)}attention", num_heads=heads,
                                          domain="com.microsoft"))
    if not attention:
        return None
    nodes = [n for n in graph.node if id(n) not in replaced] + attention
    made = {out: node for node in nodes for out in node.output}
    needed: list[onnx.NodeProto] = []  # what the outputs still depend on
    seen: set[int] = set()
    wanted = [o.name for o in graph.output]
    while wanted:
        node = made.get(wanted.pop())
        if node is not None and id(node) not in seen:
            seen.add(id(node))
            needed.append(node)
            wanted.extend(i for i in node.input if i)
    ordered: list[onnx.NodeProto] = []  # topologically, as ONNX wants them
    known = {i.name for i in graph.input} | initializers | {""}
    while needed:
        ready = [n for n in needed if all(i in known for i in n.input)]
        if not ready:
            return None
        ordered += ready
        known.update(out for n in ready for out in n.output)
        needed = [n for n in needed if all(n is not r for r in ready)]
    del graph.node[:]
    graph.node.extend(ordered)
    if all(o.domain != "com.microsoft" for o in result.opset_import):
        result.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return result


def agrees(model: onnx.ModelProto, reference: onnx.ModelProto) -> bool:
    """Whether `model` gives `reference`'s output on a probe input (one unpadded text)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    outputs = []
    for candidate in (model, reference):
        try:
            session = ort.InferenceSession(candidate.SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
        except Exception:  # an operator or shape onnxruntime refuses
            return False
        ids = np.arange(1, 10, dtype=np.int64)[None, :]
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                 "token_type_ids": np.zeros_like(ids)}
        names = {i.name for i in session.get_inputs()}
        outputs.append(np.asarray(session.run(None, {k: v for k, v in feeds.items()
                                                     if k in names})[0]))
    fused, exported = outputs
    return fused.shape == exported.shape and bool(np.allclose(fused, exported, atol=1e-4))


def compute_model(source: Path, *, compute: Literal["int8", "float"], cache: Path) -> Path:
    """The model file to run: `source` itself for float compute, else its int8 version (or
    `source` when it cannot be quantized, with a warning)."""
    if compute == "float":
        return source
    try:
        return int8_model(source, cache)
    except Exception as exc:  # any model onnxruntime cannot quantize runs as it is
        log.warning("embedding model kept in float compute: quantizing failed (%s)",
                    type(exc).__name__)
        return source
