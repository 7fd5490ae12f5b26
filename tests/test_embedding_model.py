"""The shipped embedding model as the actors run it: int8 compute built once into a cache, each
text embedded alone (real ONNX model, real quantizer)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from memgate.app.settings import BUNDLED_TOKENIZER, Settings, default_model
from memgate.embedding import OnnxEmbedder
from memgate.embedding.quantized import compute_model, write_unpadded

TEXTS = [
    "Caroline: I went to the LGBTQ support group yesterday and it was so powerful.",
    "The quarterly report is due on Friday; finance wants the numbers by Thursday noon.",
    "Melanie: We finally took the kids camping by the lake last weekend!",
    "Deploy the staging cluster after the database migration finishes.",
    "会議は明日の午後三時に変更されました。",
    "ok",
]


@pytest.fixture(scope="module")
def int8_file() -> Path:
    return Settings().compute_model()


def test_int8_compute_gives_nearly_the_float_vectors(int8_file: Path) -> None:
    floats = OnnxEmbedder(default_model(), BUNDLED_TOKENIZER, threads=1).embed(TEXTS)
    int8 = OnnxEmbedder(int8_file, BUNDLED_TOKENIZER, threads=1).embed(TEXTS)
    assert int8_file != default_model()
    assert int8.shape == floats.shape == (len(TEXTS), 384)
    assert np.allclose(np.linalg.norm(int8, axis=1), 1.0, atol=1e-5)
    agreement = (int8 * floats).sum(axis=1)
    # onnxruntime's int8 kernels differ by CPU: on an AVX2-only AMD EPYC the one-word "ok"
    # agrees 0.968, the sentences 0.976-0.993
    assert agreement.min() > 0.96, agreement
    assert agreement.mean() > 0.98, agreement
    # every text stays nearest to its own float vector
    assert ((int8 @ floats.T).argmax(axis=1) == np.arange(len(TEXTS))).all()


def test_a_texts_vector_does_not_depend_on_the_texts_embedded_with_it(int8_file: Path) -> None:
    model = OnnxEmbedder(int8_file, BUNDLED_TOKENIZER, threads=1)
    alone = model.embed([TEXTS[0]])
    together = model.embed([TEXTS[5], TEXTS[0], TEXTS[1] * 8])
    assert np.array_equal(alone[0], together[1])
    assert model.embed([]).shape == (0, 384)


def test_the_int8_file_is_built_once_then_reused(tmp_path: Path) -> None:
    first = compute_model(default_model(), compute="int8", cache=tmp_path)
    built = first.stat().st_mtime_ns
    again = compute_model(default_model(), compute="int8", cache=tmp_path)
    assert again == first and again.stat().st_mtime_ns == built
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no leftovers of the build
    assert compute_model(default_model(), compute="float", cache=tmp_path) == default_model()


def test_a_model_that_cannot_be_quantized_runs_as_it_is(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx file")
    with caplog.at_level(logging.WARNING, logger="memgate.embedding"):
        assert compute_model(broken, compute="int8", cache=tmp_path / "cache") == broken
    assert "kept in float compute" in caplog.text
    assert not list((tmp_path / "cache").glob("*.onnx"))


def test_what_only_padding_needs_leaves_the_graph_with_the_same_bits_out(tmp_path: Path,
                                                                  int8_file: Path) -> None:
    import onnx

    unpadded = tmp_path / "unpadded.onnx"
    assert write_unpadded(default_model(), unpadded)
    ops = [node.op_type for node in onnx.load(str(unpadded)).graph.node]
    before_ops = [node.op_type for node in onnx.load(str(default_model())).graph.node]
    assert "Softmax" in ops and "IsNaN" not in ops
    assert ops.count("Reshape") < before_ops.count("Reshape")  # one transpose per key
    before = OnnxEmbedder(default_model(), BUNDLED_TOKENIZER, threads=1).embed(TEXTS)
    after = OnnxEmbedder(unpadded, BUNDLED_TOKENIZER, threads=1).embed(TEXTS)
    assert np.array_equal(before, after)
    # the file the actors run was built that way
    built = onnx.load(str(int8_file)).graph
    assert "IsNaN" not in {node.op_type for node in built.node}
    assert "attention_mask" not in {name for node in built.node for name in node.input}


def test_a_graph_of_another_layout_keeps_its_mask(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 4])
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 4])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Add", ["scores", "mask"], ["masked"]),
                               helper.make_node("Softmax", ["masked"], ["out"])],
                              "plain", [scores, mask], [out])
    source = tmp_path / "plain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source))
    assert not write_unpadded(source, tmp_path / "unpadded.onnx")


def test_a_failed_rewrite_keeps_the_quantized_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    import onnx

    from memgate.embedding import quantized

    def broken(source: Path, target: Path) -> bool:
        raise RuntimeError("injected")

    monkeypatch.setattr(quantized, "write_unpadded", broken)
    with caplog.at_level(logging.WARNING, logger="memgate.embedding"):
        built = compute_model(default_model(), compute="int8", cache=tmp_path)
    assert built != default_model()
    assert "IsNaN" in {node.op_type for node in onnx.load(str(built)).graph.node}
    assert "kept with its padding mask (RuntimeError)" in caplog.text
