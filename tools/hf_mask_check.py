#!/usr/bin/env python3
"""Hugging Face classifiers exported the usual way (token ids, attention mask, and token
types where the model takes them; logits out), by both exporters, and their gradients
against PyTorch's float64 ones on ONNX Runtime (`edgefreeze convert` keeps the mask
inputs; `edgefreeze train` computes them from the token ids).

    python3 tools/hf_mask_check.py --out /tmp/hfm --bin target/release/edgefreeze hf_bert hf_gpt2 ...
"""
import argparse, copy, os, subprocess, sys
import numpy as np, onnx, onnxruntime as ort, torch, torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_sweep as z


class Wrap(torch.nn.Module):
    """model(input_ids, attention_mask[, token_type_ids]).logits"""

    def __init__(self, m, types):
        super().__init__()
        self.m, self.types = m, types

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        kw = dict(input_ids=input_ids, attention_mask=attention_mask)
        if self.types:
            kw["token_type_ids"] = token_type_ids
        return self.m(**kw).logits


def build(name):
    torch.manual_seed(0)
    types = name in ("hf_bert", "hf_albert", "hf_electra")
    w = Wrap(z.huggingface(name).train(), types)
    z.zero_stochastic(w)
    rs = np.random.RandomState(3)
    ids = torch.from_numpy(rs.randint(2, z.VOCAB, size=(4, z.SEQ)).astype(np.int64))
    ids[1:, -2:] = 0  # padded tails
    mask, tt = (ids != 0).long(), torch.zeros_like(ids)
    args = (ids, mask, tt) if types else (ids, mask)
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if types else [])
    y = torch.from_numpy(rs.randint(0, z.NUM_CLASSES, size=(4,)).astype(np.int64))
    return w, args, names, y


def export(w, args, names, path, exporter):
    if exporter == "ts":
        torch.onnx.export(w, args, path, dynamo=False, opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=names, output_names=["logits"],
                          dynamic_axes={n: {0: "batch"} for n in names} | {"logits": {0: "batch"}})
    else:
        b = torch.export.Dim("batch", min=2)
        torch.onnx.export(w, args, path, dynamo=True, input_names=names, output_names=["logits"],
                          dynamic_shapes=tuple({0: b} for _ in names), optimize=False, verify=False, report=False)


def grads(model, args, y, dtype):
    m = copy.deepcopy(model).to(dtype).train()
    loss = F.cross_entropy(m(*args), y)
    loss.backward()
    return float(loss), {n: p.grad.double().numpy() for n, p in m.named_parameters() if p.grad is not None}


def check(name, exporter, out_dir, binary):
    w, args, names, y = build(name)
    path = os.path.join(out_dir, f"{name}.mask.{exporter}.onnx")
    export(w, args, names, path, exporter)
    conv = os.path.join(out_dir, f"{name}.mask.{exporter}.converted")
    subprocess.run([binary, "convert", path, "--out", conv], check=True, capture_output=True)
    sess = ort.InferenceSession(os.path.join(conv, "grad.onnx"), providers=["CPUExecutionProvider"])
    params = dict(w.named_parameters())
    by_onnx = {v: k for k, v in z.onnx_param_names(path, params).items()}
    inits = {t.name: t for t in onnx.load(path).graph.initializer}
    given = dict(zip(names, (a.numpy() for a in args)), labels=y.numpy(), dropout_seed=np.array(7, dtype=np.int64))
    feeds = {}
    for i in sess.get_inputs():
        n = i.name
        if n in given:
            feeds[n] = given[n]
        elif n in by_onnx:
            feeds[n] = params[by_onnx[n]].detach().numpy().astype(np.float32)
        else:
            feeds[n] = onnx.numpy_helper.to_array(inits[n])
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    loss64, g64 = grads(w, args, y, torch.float64)
    _, g32 = grads(w, args, y, torch.float32)
    got = {by_onnx[k[5:]]: v for k, v in out.items() if k.startswith("grad.") and k[5:] in by_onnx}
    gmax = max(np.linalg.norm(g) for g in g64.values())
    worst, off = 0.0, []
    for n, ref in g64.items():
        err, e32 = z.rel_l2(got[n], ref)[0], z.rel_l2(g32[n], ref)[0]
        tol = max(16 * e32, 7.63e-6 * gmax / max(np.linalg.norm(ref), 1e-30))
        worst = max(worst, err / tol)
        if err > tol:
            off.append(n)
    print(f"{name} {exporter}: inputs {names}; loss {float(out['loss']):.6f} (PyTorch float64 {loss64:.6f}); "
          f"{len(g64)} tensors, worst error/tolerance {worst:.3f}; off: {off or 'none'}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/hf_mask")
    ap.add_argument("--bin", default="target/release/edgefreeze")
    ap.add_argument("models", nargs="+")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name in args.models:
        for exporter in ("ts", "dynamo"):
            check(name, exporter, args.out, args.bin)


if __name__ == "__main__":
    main()
