"""The embedding model with its matrix products computed in int8 (`embedding_compute=int8`).

The shipped all-MiniLM-L6-v2 file stores its weights as int8 with per-row scales, but its graph
multiplies them back to float32 (Cast, Mul), which onnxruntime folds at load: every run then
streams ~42 MB of float weights through the cache, and a 5-token query costs ~3.4 ms, a LoCoMo
turn ~10 ms of CPU (measured, docs/DECISIONS.md). Here the folded graph is quantized again with
onnxruntime's own dynamic quantization (per output channel, int8 weights, only products by a
constant weight, activations quantized per run): ~1.4 ms and ~4.7 ms, vectors at cosine 0.993 on
average to the float ones, the same recall on the development half.

Built once per model file and onnxruntime version, in a cache directory, and reused.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Literal

import onnxruntime as ort

log = logging.getLogger("memgate.embedding")


def int8_model(source: Path, cache: Path) -> Path:
    """The int8-compute version of `source`, built into `cache` unless already there. Several
    processes may build it at once: each writes its own file and renames it into place."""
    stat = source.stat()
    key = hashlib.sha256(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|"
                         f"{ort.__version__}".encode()).hexdigest()[:16]
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
        os.replace(built, target)
    log.info("embedding model quantized for int8 compute: %s", target.name)
    return target


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
