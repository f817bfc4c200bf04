#!/usr/bin/env python3
"""Writes the tiny ONNX model the onnxruntime image serves (images/onnx-image.sh runs it).

y = relu(x @ W1 + b1) @ W2 + b2, x: float32 [N, 4], y: float32 [N, 3].

The weights come from a fixed seed and are multiples of 1/8 in [-1, 1]: with inputs that are
multiples of 1/8 in [-4, 4] every product and sum is exact in float32, so the answer does
not depend on which SIMD kernel (or summation order) a CPU's onnxruntime picks. That is what
lets a test demand an exact match between the guest's answer and the host's.

Usage: make-model.py OUT.onnx
"""

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IN, HIDDEN, OUT = 4, 16, 3


def eighths(rng, shape):
    return (rng.integers(-8, 9, size=shape) / 8.0).astype(np.float32)


def main(path):
    rng = np.random.default_rng(16)
    inits = [
        numpy_helper.from_array(eighths(rng, (IN, HIDDEN)), "W1"),
        numpy_helper.from_array(eighths(rng, (HIDDEN,)), "b1"),
        numpy_helper.from_array(eighths(rng, (HIDDEN, OUT)), "W2"),
        numpy_helper.from_array(eighths(rng, (OUT,)), "b2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "W2"], ["y0"]),
        helper.make_node("Add", ["y0", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", OUT])],
        inits,
    )
    # Opset 17 / IR 8: old enough for any onnxruntime of the last years.
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="vm-images"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make-model.py OUT.onnx")
    main(sys.argv[1])
