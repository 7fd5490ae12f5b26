"""The embedding model (ONNX, shipped with the package) and the batching of calls to it."""

from memgate.embedding.batching import Batcher
from memgate.embedding.model import OnnxEmbedder

__all__ = ["Batcher", "OnnxEmbedder"]
