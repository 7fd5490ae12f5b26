"""The embedding model (ONNX, shipped with the package), the batching of calls to it, and the
lanes that put a waiting recall's versions before the background's."""

from memgate.embedding.batching import Batcher
from memgate.embedding.lanes import Lanes
from memgate.embedding.model import OnnxEmbedder

__all__ = ["Batcher", "Lanes", "OnnxEmbedder"]
