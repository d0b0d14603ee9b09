"""Independent validation of ONNX files written by edgefreeze.

usage: check_model.py MODEL.onnx [MODEL.onnx ...]

Runs onnx.checker.check_model(full_check=True) (which includes ONNX's own shape
inference) on each file and exits non-zero on the first failure.
"""
import sys

import onnx


def main(paths):
    for path in paths:
        model = onnx.load(path)
        onnx.checker.check_model(model, full_check=True)
        print(f"ok {path}: opset {model.opset_import[0].version}, {len(model.graph.node)} nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
