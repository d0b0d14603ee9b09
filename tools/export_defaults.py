#!/usr/bin/env python3
"""Fixtures of models exported the way PyTorch's exporters do by default, for
tests/exporter_defaults.rs and crates/cli/tests/exported.rs: one sample and no dynamic
batch axis, and (with the exporters' default settings) each BatchNorm folded into the
convolution before it.

Usage (needs torch, onnx, onnxscript):
    python3 tools/export_defaults.py --out tests/fixtures/exported

Writes, for a small CNN (two Conv-BatchNorm-ReLU blocks, flatten, Linear; 28x28, 1 channel)
with fixed random weights:
- cnn.dynamic.onnx: the reference, as edgefreeze asks for: TorchScript in training mode,
  no constant folding, a dynamic batch axis;
- cnn.ts_b1.onnx, cnn.dynamo_b1.onnx: the same model in training mode (dynamo with
  optimize=False) but at batch 1 without a dynamic axis;
- cnn.ts_default.onnx, cnn.dynamo_default.onnx: torch.onnx.export(model, (x,), path) with
  nothing else but dynamo=False / the default dynamo=True: batch 1 and BatchNorm folded;
cnn_nhwc.dynamic.onnx: the reference model taking its images channels last (`[N, 28, 28,
1]`, a Permute in front), as Keras and TensorFlow models do; and cls.dynamo_b1.onnx: a model with a class token expanded to the batch
(`cls.expand(n, -1, -1)`), at batch 1 from dynamo, whose batch no constant rewrite can free.
"""

import argparse
import copy
import os

import onnx
import torch
import torch.nn as nn


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4)
        self.c2, self.b2 = nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 7 * 7, 10)

    def forward(self, x):
        x = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(self.b2(self.c2(x)))
        return self.fc(torch.flatten(x, 1))


class ClassToken(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(1, 8, 7, stride=7)
        self.cls = nn.Parameter(torch.randn(1, 1, 8))
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], dim=1)
        return self.head(t.mean(dim=1))


class ChannelsLast(nn.Module):
    """The CNN taking images channels last, as Keras and TensorFlow models do."""

    def __init__(self, cnn):
        super().__init__()
        self.cnn = cnn

    def forward(self, x):
        return self.cnn(x.permute(0, 3, 1, 2))


def strip(proto):
    """dynamo's node metadata is most of a small model's bytes; the fold marker stays."""
    for node in proto.graph.node:
        keep = [p for p in node.metadata_props if p.key == "pkg.onnxscript.rewriter.rule_name"]
        del node.metadata_props[:]
        node.metadata_props.extend(keep)
        node.doc_string = ""
    return proto


def dynamo(model, x, path, **kw):
    program = torch.onnx.export(model, (x,), dynamo=True, verify=False, report=False, **kw)
    onnx.save_model(strip(program.model_proto), path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/exported")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    out = lambda name: os.path.join(args.out, name)
    torch.manual_seed(0)
    model = Cnn()
    # Running statistics and affine parameters away from their defaults (which hide bugs).
    for bn in (model.b1, model.b2):
        bn.weight.data.uniform_(0.5, 1.5)
        bn.bias.data.uniform_(-0.5, 0.5)
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
    x1 = torch.randn(1, 1, 28, 28)
    train = torch.onnx.TrainingMode.TRAINING
    # Exporting runs the model, and in training mode that moves the BatchNorm running
    # statistics: each export gets a copy of the same state, so that all hold the same.
    fresh = lambda: copy.deepcopy(model).train()  # noqa: E731
    torch.onnx.export(fresh(), (x1,), out("cnn.dynamic.onnx"), dynamo=False, training=train, do_constant_folding=False,
                      input_names=["input"], dynamic_axes={"input": {0: "batch"}})
    torch.onnx.export(fresh(), (x1,), out("cnn.ts_b1.onnx"), dynamo=False, training=train, do_constant_folding=False,
                      input_names=["input"])
    dynamo(fresh(), x1, out("cnn.dynamo_b1.onnx"), optimize=False)
    # The same weights taking [N, 28, 28, 1]: train must batch the images channels last.
    torch.onnx.export(ChannelsLast(fresh()), (x1.permute(0, 2, 3, 1),), out("cnn_nhwc.dynamic.onnx"), dynamo=False,
                      training=train, do_constant_folding=False, input_names=["input"],
                      dynamic_axes={"input": {0: "batch"}})
    # The defaults: nothing but the model, the example and the path.
    torch.onnx.export(fresh(), (x1,), out("cnn.ts_default.onnx"), dynamo=False)
    dynamo(fresh(), x1, out("cnn.dynamo_default.onnx"))
    torch.manual_seed(1)
    dynamo(ClassToken().train(), x1, out("cls.dynamo_b1.onnx"), optimize=False)
    for name in sorted(os.listdir(args.out)):
        if name.endswith(".onnx"):
            print(f"{name}: {os.path.getsize(out(name))} bytes")


if __name__ == "__main__":
    main()
