#!/usr/bin/env python3
"""Checks edgefreeze's gradient graph of a Keras model converted by tf2onnx against
TensorFlow's own autodiff in float64: the fixture tests/fixtures/exported/keras_cnn.tf2onnx.onnx
(tools/export_keras.py), rebuilt in TensorFlow from the ONNX file's own weights (Conv,
ReLU, MaxPool, Conv, ReLU, global mean, MatMul; channels last), one batch of 4, the mean
softmax cross-entropy; our grad.onnx on ONNX Runtime and on tract.

With `--fixture DIR` it also writes the CI fixture `keras_cnn.tf2onnx.{onnx,json,safetensors}`
in the format of tools/zoo_sweep.py's (the batch, TensorFlow's float64 gradients, its own
float32 error per tensor), which tests/zoo_golden.rs checks on both engines.

Usage (TensorFlow in its own environment, as for tools/export_keras.py):
    /tmp/tfenv/bin/pip install tensorflow-cpu onnx onnxruntime==1.31.1 safetensors
    cargo build --release -p edgefreeze -p edgefreeze-engine --example run_graph
    target/release/edgefreeze convert tests/fixtures/exported/keras_cnn.tf2onnx.onnx --out /tmp/keras-conv
    /tmp/tfenv/bin/python tools/keras_gradients.py /tmp/keras-conv [--fixture tests/fixtures/zoo]
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import tensorflow as tf  # noqa: E402
from onnx import numpy_helper  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

MODEL = "tests/fixtures/exported/keras_cnn.tf2onnx.onnx"
RUN_GRAPH = "target/release/examples/run_graph"
CONV1 = "functional_1/conv2d_1/convolution/merged_input:0"
CONV2 = "functional_1/conv2d_1_2/convolution/ReadVariableOp:0"
DENSE = "functional_1/dense_1/Cast/ReadVariableOp:0"


def tensorflow(weights, x, y, dtype=np.float64):
    """Loss, gradients (ONNX layouts) and logits of the model rebuilt in TensorFlow."""
    hwio = lambda w: tf.Variable(w.transpose(2, 3, 1, 0).astype(dtype))  # noqa: E731
    k1, k2, d = hwio(weights[CONV1]), hwio(weights[CONV2]), tf.Variable(weights[DENSE].astype(dtype))
    with tf.GradientTape() as tape:
        h = tf.nn.relu(tf.nn.conv2d(x.astype(dtype), k1, 1, "SAME"))
        h = tf.nn.max_pool2d(h, 2, 2, "VALID")
        h = tf.nn.relu(tf.nn.conv2d(h, k2, 1, "SAME"))
        logits = tf.matmul(tf.reduce_mean(h, axis=[1, 2]), d)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    g1, g2, gd = tape.gradient(loss, [k1, k2, d])
    oihw = lambda g: g.numpy().transpose(3, 2, 0, 1).astype(np.float64)  # noqa: E731
    grads = {CONV1: oihw(g1), CONV2: oihw(g2), DENSE: gd.numpy().astype(np.float64)}
    return float(loss.numpy()), grads, logits.numpy().astype(np.float64)


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def write_fixture(out_dir, x, y, loss64, g64, logits64, weights):
    """The zoo-fixture files: the model, the batch with TensorFlow's float64 gradients
    rounded to float32, and TensorFlow's own float32 errors."""
    loss32, g32, logits32 = tensorflow(weights, x, y, np.float32)
    stem = "keras_cnn.tf2onnx"
    shutil.copyfile(MODEL, os.path.join(out_dir, stem + ".onnx"))
    tensors = {"input": x, "labels": y}
    tensors.update({f"grad/{n}": np.ascontiguousarray(g, dtype=np.float32) for n, g in g64.items()})
    save_file(tensors, os.path.join(out_dir, stem + ".safetensors"))
    os.chmod(os.path.join(out_dir, stem + ".safetensors"), 0o644)
    meta = {
        "model": "keras_cnn", "exporter": "tf2onnx", "file": stem + ".onnx", "batch": int(x.shape[0]),
        "input_shape": list(x.shape), "loss": loss64, "loss_float32_error": abs(loss32 - loss64) / abs(loss64),
        "logits_float32_error": rel(logits32, logits64),
        "float32_error_per_tensor": {n: rel(g32[n], g) for n, g in g64.items()},
        "gradient_norms": {n: float(np.linalg.norm(g)) for n, g in g64.items()},
        "parameters": list(g64), "reference": "TensorFlow float64 autodiff of the model rebuilt from the file's weights",
        "versions": {"tensorflow": tf.__version__, "onnx": onnx.__version__},
        "command": "/tmp/tfenv/bin/python tools/keras_gradients.py <converted> --fixture tests/fixtures/zoo",
    }
    with open(os.path.join(out_dir, stem + ".json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)


def main():
    conv = sys.argv[1]
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(MODEL).graph.initializer}
    rs = np.random.RandomState(3)
    x = rs.randn(4, 28, 28, 1).astype(np.float32)
    y = np.array([3, 1, 4, 1], dtype=np.int64)
    loss64, g64, logits64 = tensorflow(weights, x, y)
    grad = os.path.join(conv, "grad.onnx")
    feeds = {}
    for i in onnx.load(grad).graph.input:
        feeds[i.name] = y if i.name == "labels" else weights.get(i.name, x)
    session = ort.InferenceSession(grad, providers=["CPUExecutionProvider"])
    results = {"ort": dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))}
    with tempfile.TemporaryDirectory() as tmp:
        feeds_path, out_path = os.path.join(tmp, "feeds.safetensors"), os.path.join(tmp, "out.safetensors")
        save_file({k: np.ascontiguousarray(v) for k, v in feeds.items()}, feeds_path)
        subprocess.run([RUN_GRAPH, "tract", grad, feeds_path, out_path], check=True)
        results["tract"] = load_file(out_path)
    worst = 0.0
    for engine, got in results.items():
        err = abs(float(got["loss"]) - loss64) / abs(loss64)
        print(f"{engine}: loss {float(got['loss']):.7f} (TensorFlow float64 {loss64:.7f}, rel {err:.1e})")
        for name, ref in g64.items():
            ours = got["grad." + name].astype(np.float64)
            rel = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
            worst = max(worst, rel)
            print(f"  {name}: relative L2 error {rel:.2e}")
    print(f"worst {worst:.2e}")
    if "--fixture" in sys.argv:
        write_fixture(sys.argv[sys.argv.index("--fixture") + 1], x, y, loss64, g64, logits64, weights)


if __name__ == "__main__":
    main()
