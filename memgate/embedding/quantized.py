"""The embedding model with its matrix products computed in int8 (`embedding_compute=int8`).

The shipped all-MiniLM-L6-v2 file stores its weights as int8 with per-row scales, but its graph
multiplies them back to float32 (Cast, Mul), which onnxruntime folds at load: every run then
streams all its float weights through the cache. Here the folded graph is quantized again with
onnxruntime's own dynamic quantization (per output channel, int8 weights, only products by a
constant weight, activations quantized per run): a fraction of the CPU, vectors close to the
float ones, the same recall on the development half (docs/DECISIONS.md, "Embedding compute in
int8, one text per run").

Then what only padding needs leaves the graph: `OnnxEmbedder` runs each text alone, never
padded, so the attention mask added to every layer's scores is all zeros and the guard that
replaces a NaN in their softmax never fires (it only matters for a row that is all padding); and
the shapes that a padded batch would need are not computed per layer: each key's chain of
transposes and reshapes (with the shape arithmetic feeding it) is one transpose: fewer nodes
and less CPU per run (docs/DECISIONS.md, "What only padding needs leaves the int8 graph"), the
same bits out: nothing
that computes a value changes. The result is kept only when it gives exactly the quantized
graph's output on probe inputs; a model of another layout runs as quantized.

Built once per model file, recipe and onnxruntime version, in a cache directory, and reused.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import onnxruntime as ort

from memgate.embedding.model import unpadded_feeds

if TYPE_CHECKING:
    import onnx

log = logging.getLogger("memgate.embedding")
RECIPE = "fold, int8 per channel, unpadded"  # part of the cache key
# Token ids the rewritten graph must answer exactly as the quantized one: [CLS] … [SEP], 2 to 64
PROBES = [[101, 102], [101, 7592, 102], [101, *range(2000, 2010), 102],
          [101, *range(3000, 3062), 102]]


def int8_model(source: Path, cache: Path) -> Path:
    """The int8-compute version of `source`, built into `cache` unless already there. Several
    processes may build it at once: each writes its own file and renames it into place."""
    stat = source.stat()
    key = hashlib.sha256(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|"
                         f"{ort.__version__}|{RECIPE}".encode()).hexdigest()[:16]
    target = cache / f"{source.stem}-{key}.int8.onnx"
    if target.exists():
        return target
    from onnxruntime.quantization import QuantType, quantize_dynamic  # imports onnx: slow

    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".building-") as tmp:
        folded, built = Path(tmp) / "folded.onnx", Path(tmp) / "int8.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)  # the weights folded back to float
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # quantize_dynamic advises pre-processing on the root log
        try:
            quantize_dynamic(folded, built, weight_type=QuantType.QInt8, per_channel=True,
                             extra_options={"MatMulConstBOnly": True})
        finally:
            root.setLevel(level)
        unpadded = Path(tmp) / "unpadded.onnx"
        try:
            if write_unpadded(built, unpadded):
                built = unpadded
        except Exception as exc:  # an optimisation only: the quantized graph runs as it is
            log.warning("embedding model kept with its padding mask (%s)", type(exc).__name__)
        os.replace(built, target)
    log.info("embedding model quantized for int8 compute: %s", target.name)
    return target


def write_unpadded(source: Path, target: Path) -> bool:
    """Write `source` to `target` without what only padding needs (`without_padding`) when
    that gives the same output bits on every probe input; whether it did."""
    import onnx

    model = onnx.load(str(source))
    if not without_padding(model):
        return False
    onnx.save(model, str(target))
    return all(np.array_equal(a, b) for a, b in zip(_outputs(source), _outputs(target),
                                                    strict=True))


def without_padding(model: onnx.ModelProto) -> bool:
    """Rewrite `model` in place for texts run alone, unpadded: each softmax takes the scores
    without the (all-zero) mask added and loses its NaN guard; each key's chain of transposes
    and reshapes becomes one transpose; then every node and constant the outputs no longer
    need goes. Whether the softmaxes were laid out so (else `model` is left as it was)."""
    from onnx import helper

    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)

    def made_by(name: str, op: str, perm: list[int] | None = None) -> onnx.NodeProto | None:
        node = producer.get(name)
        if node is None or node.op_type != op:
            return None
        perms = [list(helper.get_attribute_value(a)) for a in node.attribute if a.name == "perm"]
        return node if perm is None or perms == [perm] else None

    unmasked: list[tuple[onnx.NodeProto, str, str]] = []  # softmax, scores, guarded output
    for softmax in (n for n in graph.node if n.op_type == "Softmax"):
        added = made_by(softmax.input[0], "Add")
        guards = users.get(softmax.output[0], [])
        nan = next((n for n in guards if n.op_type == "IsNaN"), None)
        where = next((n for n in guards if n.op_type == "Where"), None)
        if (added is None or nan is None or where is None or len(guards) != 2
                or list(where.input[::2]) != [nan.output[0], softmax.output[0]]):
            return False
        unmasked.append((softmax, added.input[0], where.output[0]))
    if not unmasked:
        return False
    # [B,S,H,D] -(0 2 1 3)-> [B,H,S,D] -> [B*H,S,D] -(0 2 1)-> [B*H,D,S] -> [B,H,D,S]: (0 2 3 1)
    keys: dict[int, onnx.NodeProto] = {}
    for node in (n for n in graph.node if n.op_type == "Reshape"):
        second = made_by(node.input[0], "Transpose", [0, 2, 1])
        merged = second and made_by(second.input[0], "Reshape")
        first = merged and made_by(merged.input[0], "Transpose", [0, 2, 1, 3])
        if first:
            keys[id(node)] = helper.make_node("Transpose", [first.input[0]], list(node.output),
                                              name=f"{node.name}.key", perm=[0, 2, 3, 1])
    renamed = {guarded: softmax.output[0] for softmax, _, guarded in unmasked}
    for softmax, scores, _ in unmasked:
        softmax.input[0] = scores
    nodes = [keys.get(id(node), node) for node in graph.node]
    for node in nodes:
        node.input[:] = [renamed.get(name, name) for name in node.input]
    made = {out: node for node in nodes for out in node.output}
    needed: set[int] = set()
    wanted = [o.name for o in graph.output]
    while wanted:
        node = made.get(wanted.pop())
        if node is not None and id(node) not in needed:
            needed.add(id(node))
            wanted.extend(name for name in node.input if name)
    kept = [node for node in nodes if id(node) in needed]  # still in topological order
    del graph.node[:]
    graph.node.extend(kept)
    used = {name for node in kept for name in node.input}
    constants = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(constants)
    return True


def _outputs(model: Path) -> list[np.ndarray]:
    """The model's first output for each probe (one thread, as the actors run it)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    inputs = {i.name for i in session.get_inputs()}
    return [np.asarray(session.run(None, unpadded_feeds(probe, inputs))[0]) for probe in PROBES]


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
