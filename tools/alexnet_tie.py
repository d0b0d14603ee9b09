#!/usr/bin/env python3
"""Why AlexNet (TorchScript, 224, batch 2) misses on `features.0.weight` on ONNX Runtime:
runs the sweep's converted grad.onnx with conv1's output, its gradient, and the first
MaxPool's indices as extra outputs, and compares them with PyTorch's float64 forward and
backward. It prints where ONNX Runtime's max-pool argmax differs from float64's, and
conv1's weight gradient in float64 routed by float64's and by ONNX Runtime's argmax.

    python3 tools/zoo_sweep.py --out runs/alex224 --batch 2 --side 224 --models alexnet --exporters ts
    python3 tools/alexnet_tie.py          # reads runs/alex224/alexnet.ts/converted

Diagnostic only (docs/coverage.md, "The five large models"); AlexNet's layer geometry is
written in (conv1: 11x11 stride 4 padding 2 to 55x55; pool 3x3 stride 2).
"""
import sys, os, numpy as np, torch, onnx, onnxruntime as ort
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_sweep as zs
zs.BATCH, zs.SIDE = 2, 224
model, x = zs.build("alexnet"); zs.zero_stochastic(model)
rs = np.random.RandomState(zs.DATA_SEED + 1)
y = torch.from_numpy(rs.randint(0, 10, size=(x.shape[0],)).astype(np.int64))
conv = "runs/alex224/alexnet.ts/converted"
m = onnx.load(os.path.join(conv, "grad.onnx"))
extra = ["/features/features.0/Conv_output_0", "grad//features/features.1/Relu/where", "/features/features.2/MaxPool/indices",
         "grad//features/features.2/MaxPool/reshape_3"]
for e in extra:
    m.graph.output.append(onnx.helper.make_empty_tensor_value_info(e))
opts = ort.SessionOptions()
sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
feeds, mapping = zs.grad_feeds([i.name for i in sess.get_inputs()], os.path.join(conv, "../model.onnx"), model, x, y)
outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
# PyTorch float64 weight gradient (the in-place ReLU is fine for parameter gradients)
m64 = zs.copy.deepcopy(model).double()
acts = {}
conv1 = m64.features[0]
def hook(mod, inp, out):
    out.retain_grad(); acts["y"] = out
conv1.register_forward_hook(hook)
m64.train()
x64 = x.double()
loss = torch.nn.functional.cross_entropy(m64(x64), y)
loss.backward()
y64 = acts["y"].detach().numpy(); dy64 = acts["y"].grad.numpy()
dw64 = conv1.weight.grad.numpy()
yo = outs[extra[0]]; dyo = outs[extra[1]]
def rel(a, b): return np.linalg.norm((a.astype(np.float64) - b).ravel()) / np.linalg.norm(b.ravel())
print("loss", outs["loss"], loss.item())
gw = outs["grad.features.0.weight"]
print("dW ORT rel", rel(gw, dw64), "dB rel", rel(outs["grad.features.0.bias"], conv1.bias.grad.numpy()))
# float64 dW from ORT's dY
w = torch.nn.grad.conv2d_weight(x64, dw64.shape, torch.from_numpy(dyo.astype(np.float64)), stride=4, padding=2).numpy()
print("dW float64 from ORT's dY rel", rel(w, dw64))
w32 = torch.nn.grad.conv2d_weight(x, dw64.shape, torch.from_numpy(dyo), stride=4, padding=2).numpy()
print("dW torch f32 from ORT's dY rel", rel(w32, dw64))
pre = outs[extra[3]]
print("---- float64 reference without in-place ReLU (its retained gradients are those of the conv output)")
m64 = zs.copy.deepcopy(model).double()
for mod in m64.modules():
    if isinstance(mod, torch.nn.ReLU): mod.inplace = False
acts = {}
def hook2(mod, inp, out):
    out.retain_grad(); acts[mod] = out
m64.features[0].register_forward_hook(hook2); m64.features[1].register_forward_hook(hook2)
loss = torch.nn.functional.cross_entropy(m64(x64), y); loss.backward()
yc = acts[m64.features[0]]; yr = acts[m64.features[1]]
print("conv1 out rel", rel(yo, yc.detach().numpy()))
print("dY(conv) rel", rel(dyo, yc.grad.numpy()))
print("dRelu-out rel", rel(pre, yr.grad.numpy()))
# indices: torch's maxpool on ORT's relu output vs ORT's indices
r_o = np.maximum(yo, 0)
_, idx_t = torch.nn.functional.max_pool2d(torch.from_numpy(r_o), 3, 2, return_indices=True)
idx_o = outs[extra[2]] % (55 * 55)
print("indices differ (torch maxpool on ORT's relu output vs ORT's):", int((idx_t.numpy() != idx_o).sum()), "of", idx_o.size)
_, idx_64 = torch.nn.functional.max_pool2d(yr.detach(), 3, 2, return_indices=True)
d = idx_64.numpy() != idx_o
print("indices differ (float64 truth vs ORT):", int(d.sum()))
if d.sum():
    flat = r_o.reshape(2, 64, -1)
    ii = np.argwhere(d)[:5]
    for n, c, i, j in ii:
        a, b = idx_o[n, c, i, j], idx_64.numpy()[n, c, i, j]
        print(n, c, i, j, "ORT", a, flat[n, c, a], "truth", b, flat[n, c, b], "f64 vals", yr.detach().numpy().reshape(2,64,-1)[n,c,a], yr.detach().numpy().reshape(2,64,-1)[n,c,b])
print("---- float64 with ORT's routing")
m64 = zs.copy.deepcopy(model).double()
for mod in m64.modules():
    if isinstance(mod, torch.nn.ReLU): mod.inplace = False
acts = {}
m64.features[0].register_forward_hook(hook2); m64.features[2].register_forward_hook(hook2)
loss = torch.nn.functional.cross_entropy(m64(x64), y); loss.backward()
yc = acts[m64.features[0]].detach().numpy(); dpool = acts[m64.features[2]].grad.numpy()
def route(idx):
    d = np.zeros((2, 64, 55 * 55))
    for n in range(2):
        for c in range(64):
            np.add.at(d[n, c], idx[n, c].ravel(), dpool[n, c].ravel())
    return d.reshape(2, 64, 55, 55) * (yc > 0)
for label, idx in (("truth's", idx_64.numpy()), ("ORT's", idx_o)):
    dyc = route(idx)
    w = torch.nn.grad.conv2d_weight(x64, dw64.shape, torch.from_numpy(dyc), stride=4, padding=2).numpy()
    print(f"float64 dW with {label} argmax: vs truth {rel(w, dw64):.3e}, ORT vs it {rel(gw, w):.3e}")
# torch float32 forward values at the tie
m32 = zs.copy.deepcopy(model)
for mod in m32.modules():
    if isinstance(mod, torch.nn.ReLU): mod.inplace = False
y32 = m32.features[0](x).detach().numpy().reshape(2, 64, -1)
print("torch f32 conv1 at the two positions", repr(y32[0, 48, 2434]), repr(y32[0, 48, 2542]), "ORT", repr(yo.reshape(2,64,-1)[0,48,2434]), repr(yo.reshape(2,64,-1)[0,48,2542]))
