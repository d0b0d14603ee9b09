#!/usr/bin/env python3
"""A Keras model converted by tf2onnx, the usual way TensorFlow users get ONNX, for
crates/cli/tests/exported.rs: images channels last (`[N, 28, 28, 1]`, a batch axis named
`unk__<n>`), BatchNorm folded into the convolution and Dropout dropped by the converter,
zero biases left out.

Usage (TensorFlow is not in tools/requirements.txt; a virtual environment keeps it apart):
    python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install tensorflow-cpu tf2onnx onnx
    /tmp/tfenv/bin/python tools/export_keras.py --out tests/fixtures/exported
(written with tensorflow-cpu 2.21.0, tf2onnx 1.17.0, opset 13).
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import onnx  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/exported")
    args = ap.parse_args()
    keras = tf.keras
    tf.random.set_seed(0)
    inp = keras.Input((28, 28, 1))
    x = keras.layers.Conv2D(8, 3, padding="same")(inp)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.2)(x)
    out = keras.layers.Dense(10)(x)
    model = keras.Model(inp, out)
    spec = (tf.TensorSpec((None, 28, 28, 1), tf.float32, name="input"),)
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=13)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "keras_cnn.tf2onnx.onnx")
    onnx.save(proto, path)
    print(f"{path}: {os.path.getsize(path)} bytes, ops {[n.op_type for n in proto.graph.node]}")


if __name__ == "__main__":
    main()
