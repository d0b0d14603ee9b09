#!/usr/bin/env python3
"""Write the seed corpus of the `convert_model` fuzz target from the bundled models.

Usage:
    python3 tools/fuzz_seeds.py            # writes fuzz/seeds_convert/

Each seed is one settings byte (bits 0-1 the loss, 2-3 the optimizer, 4-7 the layers
to freeze; see fuzz/fuzz_targets/convert_model.rs) followed by a bundled model whose
float weights of more than 64 elements are stored without data (and whose nodes lose
their exporter's provenance notes). The fuzz target fills
those with small numbers before loading, so the seeds stay a few KiB and the mutations
go to the graph's structure. Small tensors (shapes, scales, biases of a few elements)
keep their values: constant folding and shape inference read them.
Needs only the `onnx` package.
"""

import argparse
import os

import onnx
from onnx import TensorProto

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (model, settings byte): one of each exporter and architecture family, with the loss,
# optimizer and freezing choices spread over them.
SEEDS = [
    ("mlp", 0x00),  # cross-entropy, plain SGD
    ("lenet5", 0x04),  # SGD momentum and weight decay
    ("lenet5_dynamo", 0x19),  # label smoothing, Nesterov, first layer frozen
    ("resnet20_28", 0x2C),  # AdamW, two layers frozen
    ("resnet20_28_dynamo", 0x05),  # label smoothing, SGD momentum
    ("mobilenetv2_05", 0x00),
    ("transformer_text", 0x0C),  # AdamW
    ("transformer_text_dynamo", 0x11),  # label smoothing, first layer frozen
    ("kws_m5", 0x04),
]


def strip(model: onnx.ModelProto) -> None:
    # The dynamo exporter's per-node provenance (stack traces, FX nodes) is most of a
    # stripped file and nothing edgefreeze reads.
    for node in model.graph.node:
        node.ClearField("metadata_props")
        node.ClearField("doc_string")
    for t in model.graph.initializer:
        n = 1
        for d in t.dims:
            n *= d
        if t.data_type == TensorProto.FLOAT and n > 64:
            t.ClearField("raw_data")
            t.ClearField("float_data")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=os.path.join(ROOT, "models"))
    parser.add_argument("--out", default=os.path.join(ROOT, "fuzz", "seeds_convert"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name, settings in SEEDS:
        model = onnx.load(os.path.join(args.models, f"{name}.onnx"))
        strip(model)
        path = os.path.join(args.out, f"{name}.bin")
        with open(path, "wb") as f:
            f.write(bytes([settings]) + model.SerializeToString())
        print(f"{path}: {os.path.getsize(path)} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
