"""Runs an ONNX model with the ONNX reference evaluator on many input sets at once.

usage: evaluate.py MODEL.onnx INPUTS.onnx OUTPUTS.onnx

INPUTS.onnx is a bundle: a model whose graph initializers are named "SET:INPUT" (SET a
number). For every set, the model runs on its inputs with onnx.reference, and every
output is written to OUTPUTS.onnx as an initializer "SET:OUTPUT". Used by the Rust tests
as an independent third engine, in f64 where the native engines lack kernels.
"""
import sys
from collections import defaultdict

import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator


def main(model_path, inputs_path, outputs_path):
    model = onnx.load(model_path)
    evaluator = ReferenceEvaluator(model)
    names = [o.name for o in model.graph.output]
    sets = defaultdict(dict)
    for t in onnx.load(inputs_path).graph.initializer:
        key, name = t.name.split(":", 1)
        sets[int(key)][name] = numpy_helper.to_array(t)
    results = []
    for key in sorted(sets):
        outputs = evaluator.run(None, sets[key])
        for name, value in zip(names, outputs):
            results.append(numpy_helper.from_array(value, f"{key}:{name}"))
    graph = helper.make_graph([], "results", [], [], initializer=results)
    onnx.save(helper.make_model(graph), outputs_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
