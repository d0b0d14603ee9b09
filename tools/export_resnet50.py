"""Exports torchvision's ResNet-50 (random weights) for the graph-building benchmark.

usage: python3 tools/export_resnet50.py OUT.onnx

The file (~100 MB) is not committed; `cargo bench -p edgefreeze-autodiff` reads it from
target/bench/resnet50.onnx when present. Same exporter settings as export_models.py:
TorchScript exporter, opset 17, BatchNorm kept (no constant folding), dynamic batch.
"""
import sys

import torch
import torchvision


def main(out):
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    torch.onnx.export(
        model, (x,), out, dynamo=False, opset_version=17, do_constant_folding=False,
        input_names=["input"], output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
    )
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {out}: ResNet-50, {params} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
