#!/usr/bin/env python3
# The ResNet-18 step memory on ONNX Runtime with the state as the engine keeps it (outputs
# allocated by ONNX Runtime each step, the old state alive until the step ends: "ortalloc")
# and with the outputs written into a second, preallocated set of state buffers ("double",
# allocated before the measurement starts). Usage (a folder from `edgefreeze convert`):
#   python3 ort_state_memory.py GRAPHS_FOLDER ortalloc|double BATCH
import sys, os, time, statistics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tools"))
import numpy as np, onnx, onnxruntime as ort
from profile_ort import read_state, synthetic_feeds
folder, mode, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
model_path = os.path.join(folder, "train_step.onnx")
model = onnx.load(model_path, load_external_data=False)
state = read_state(os.path.join(folder, "state.safetensors"))
data = {n: v for n, v in synthetic_feeds(model, state, batch).items() if n not in state}
so = ort.SessionOptions(); so.intra_op_num_threads = 2; so.enable_mem_pattern = False
s = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
outs = [o.name for o in s.get_outputs()]
keep = []
def ov(a):
    keep.append(a); return ort.OrtValue.ortvalue_from_numpy(a)
store = {n: ov(np.array(a, copy=True)) for n, a in state.items()}
spare = {n: ov(np.empty_like(a)) for n, a in state.items()} if mode == "double" else None
b = s.io_binding()
def rss():
    d = dict(l.split(":", 1) for l in open("/proc/self/status"))
    return int(d["VmRSS"].split()[0]) / 1024, int(d["VmHWM"].split()[0]) / 1024
open("/proc/self/clear_refs", "w").write("5")
base = rss()[0]
t = []
for i in range(8):
    a = time.perf_counter()
    for n, v in store.items(): b.bind_ortvalue_input(n, v)
    for n, v in data.items(): b.bind_cpu_input(n, v)
    b.clear_binding_outputs()
    for o in outs:
        st = o[len("updated."):] if o.startswith("updated.") else None
        if mode == "double" and st in spare: b.bind_ortvalue_output(o, spare[st])
        else: b.bind_output(o, "cpu")
    s.run_with_iobinding(b)
    got = b.get_outputs()
    new = {}
    for o, v in zip(outs, got):
        st = o[len("updated."):] if o.startswith("updated.") else None
        if st in store: new[st] = v
    if mode == "double":
        spare = {n: store[n] for n in new}
    store.update(new)
    t.append(time.perf_counter() - a)
print(f"{mode}: step peak above loaded {rss()[1]-base:.0f} MiB, median step {1e3*statistics.median(t[2:]):.0f} ms, rss now {rss()[0]-base:.0f}")
