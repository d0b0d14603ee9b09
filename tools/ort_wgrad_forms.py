#!/usr/bin/env python3
"""Forms of a convolution's weight gradient in standard ONNX, timed on ONNX Runtime.

The training graphs compute dW of a 3x3 convolution per kernel offset (a strided Slice of
the padded input and a MatMul, crates/autodiff/src/rules/spatial.rs). This times that form
beside others one could write in standard ONNX ops, on ResNet-20's layer shapes, to see
whether ONNX Runtime runs any of them faster (docs/results.md, 6 December).
usage: python3 tools/ort_wgrad_forms.py   (needs numpy, onnx, onnxruntime)
"""
import sys, time

import numpy as np
import onnxruntime as ort

from onnx import helper as h, TensorProto as T
F=T.FLOAT
def ints(name, v): return h.make_tensor(name, T.INT64, [len(v)], v)
class G:
    def __init__(s): s.nodes=[]; s.inits=[]; s.i=0
    def c(s, v):
        s.i+=1; n=f"c{s.i}"; s.inits.append(ints(n, v)); return n
    def op(s, t, ins, **a):
        s.i+=1; o=f"t{s.i}"; s.nodes.append(h.make_node(t, ins, [o], **a)); return o
def pad(g, x, b, e):
    return g.op("Pad", [x, g.c([0,0,b,b,0,0,e,e])])
def cur(g, X, dY, N, C, M, H, W, k=3, p=1):
    Hp, Wp = H+2*p, W+2*p
    P=H*W
    xp = pad(g, X, p, p)
    d = g.op("Reshape", [dY, g.c([-1, M, P])])
    parts=[]
    for kh in range(k):
        for kw in range(k):
            sl = g.op("Slice", [xp, g.c([kh,kw]), g.c([kh+H, kw+W]), g.c([2,3])])
            sl = g.op("Reshape", [sl, g.c([-1, C, P])])
            sl = g.op("Transpose", [sl], perm=[0,2,1])
            pr = g.op("MatMul", [d, sl])
            pr = g.op("ReduceSum", [pr, g.c([0])], keepdims=0)
            parts.append(g.op("Unsqueeze", [pr, g.c([2])]))
    st = g.op("Concat", parts, axis=2)
    return g.op("Reshape", [st, g.c([M, C, k, k])])
def grid_common(g, X, dY, N, C, M, H, W, k, p):
    """X channels-last with its padding, flattened to rows [N*Hp*Wp, C], so that each
    kernel offset's window is one contiguous run of L rows; dY laid on the padded grid
    [M, N*Hp*Wp]. Returns (X rows, dY grid, Wp, L)."""
    Hp, Wp = H+2*p, W+2*p
    xt = g.op("Transpose", [X], perm=[0,2,3,1])
    xtp = g.op("Pad", [xt, g.c([0,p,p,0,0,p,p,0])])
    xcl = g.op("Reshape", [xtp, g.c([-1, C])])
    dg = g.op("Pad", [dY, g.c([0,0,0,0,0,0,k-1,k-1])])   # [N,M,Hp,Wp]
    dg = g.op("Transpose", [dg], perm=[1,0,2,3])
    dg = g.op("Reshape", [dg, g.c([M, -1])])
    L = N*Hp*Wp - ((k-1)*Wp + k-1)
    return xcl, dg, Wp, L
def grid_windows(g, rows, Wp, L, k):
    """Each kernel offset's window of `rows`: L contiguous rows from the offset."""
    return [g.op("Slice", [rows, g.c([kh*Wp+kw]), g.c([kh*Wp+kw+L]), g.c([0])]) for kh in range(k) for kw in range(k)]
def grid(g, X, dY, N, C, M, H, W, k=3, p=1):
    xcl, dg, Wp, L = grid_common(g, X, dY, N, C, M, H, W, k, p)
    dl = g.op("Slice", [dg, g.c([0]), g.c([L]), g.c([1])])
    parts = [g.op("Unsqueeze", [g.op("MatMul", [dl, sl]), g.c([2])]) for sl in grid_windows(g, xcl, Wp, L, k)]
    st = g.op("Concat", parts, axis=2)
    return g.op("Reshape", [st, g.c([M, C, k, k])])
def grid_one(g, X, dY, N, C, M, H, W, k=3, p=1):
    xcl, dg, Wp, L = grid_common(g, X, dY, N, C, M, H, W, k, p)
    dl = g.op("Slice", [dg, g.c([0]), g.c([L]), g.c([1])])
    parts = [g.op("Unsqueeze", [sl, g.c([0])]) for sl in grid_windows(g, xcl, Wp, L, k)]
    cols = g.op("Concat", parts, axis=0)  # [K, L, C]
    pr = g.op("MatMul", [dl, cols])   # [K, M, C]
    pr = g.op("Transpose", [pr], perm=[1,2,0])
    return g.op("Reshape", [pr, g.c([M, C, k, k])])
def grid_chunk(g, X, dY, N, C, M, H, W, k=3, p=1, B=4):
    # split rows into B chunks of the batch-free grid: pad Xcl rows so each offset slice reshapes to [B, L/B, C]
    xcl, dg, Wp, L = grid_common(g, X, dY, N, C, M, H, W, k, p)
    Lb = -(-L//B); L2 = Lb*B
    extra = L2 - L
    # pad xcl with extra rows at end, dg cols
    xcl2 = g.op("Pad", [xcl, g.c([0,0,extra,0])])
    dl = g.op("Slice", [dg, g.c([0]), g.c([L]), g.c([1])])
    dl = g.op("Pad", [dl, g.c([0,0,0,extra])])
    dl = g.op("Reshape", [dl, g.c([M, B, Lb])])
    dl = g.op("Transpose", [dl], perm=[1,0,2])  # [B, M, Lb]
    parts=[]
    for sl in grid_windows(g, xcl2, Wp, L2, k):
        sl = g.op("Reshape", [sl, g.c([B, Lb, C])])
        pr = g.op("MatMul", [dl, sl])
        pr = g.op("ReduceSum", [pr, g.c([0])], keepdims=0)
        parts.append(g.op("Unsqueeze", [pr, g.c([2])]))
    st = g.op("Concat", parts, axis=2)
    return g.op("Reshape", [st, g.c([M, C, k, k])])

def build(form, N, C, M, H, W, **kw):
    g=G()
    out = form(g, "X", "dY", N, C, M, H, W, **kw)
    graph = h.make_graph(g.nodes, "g", [h.make_tensor_value_info("X", F, ["N",C,H,W]), h.make_tensor_value_info("dY", F, ["N",M,H,W])],
                         [h.make_tensor_value_info(out, F, None)], g.inits)
    m = h.make_model(graph, opset_imports=[h.make_opsetid("",17)]); m.ir_version=8
    return m.SerializeToString()
def run(model, X, dY, threads, reps=20):
    so = ort.SessionOptions(); so.intra_op_num_threads=threads; so.graph_optimization_level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    for _ in range(3): r = s.run(None, {"X":X, "dY":dY})[0]
    ts=[]
    for _ in range(reps):
        t=time.perf_counter(); s.run(None, {"X":X, "dY":dY}); ts.append(time.perf_counter()-t)
    return r, np.median(ts)*1e3
def ref(X, dY, k=3, p=1):
    N,C,H,W = X.shape; M=dY.shape[1]
    xp = np.pad(X.astype(np.float64), ((0,0),(0,0),(p,p),(p,p)))
    out = np.zeros((M,C,k,k))
    for kh in range(k):
        for kw in range(k):
            out[:,:,kh,kw] = np.einsum("nmhw,nchw->mc", dY, xp[:,:,kh:kh+H,kw:kw+W])
    return out

def im2(g, X, dY, N, C, M, H, W, k=3, p=1):
    P=H*W; K=k*k
    E=np.zeros((C*K,1,k,k),np.float32)
    for c in range(C):
        for j in range(K): E[c*K+j,0,j//k,j%k]=1
    g.i+=1; en=f"E{g.i}"; g.inits.append(h.make_tensor(en,T.FLOAT,list(E.shape),E.ravel()))
    cols = g.op("Conv",[X,en],kernel_shape=[k,k],pads=[p,p,p,p],group=C)  # [N, C*K, H, W]
    cols = g.op("Reshape",[cols,g.c([-1,C*K,P])])
    d = g.op("Reshape",[dY,g.c([-1,M,P])])
    ctt = g.op("Transpose",[cols],perm=[0,2,1])
    pr = g.op("MatMul",[d,ctt])
    pr = g.op("ReduceSum",[pr,g.c([0])],keepdims=0)
    return g.op("Reshape",[pr,g.c([M,C,k,k])])

def bac(g, X, dY, N, C, M, H, W, k=3, p=1):
    xt = g.op("Transpose",[X],perm=[1,0,2,3])
    dt = g.op("Transpose",[dY],perm=[1,0,2,3])
    o = g.op("Conv",[xt,dt],pads=[p,p,p,p])   # [C, M, k, k]
    return g.op("Transpose",[o],perm=[1,0,2,3])

def cl_cat(g, X, dY, N, C, M, H, W, k=3, p=1):
    K=k*k
    xt = g.op("Transpose",[X],perm=[0,2,3,1])
    xtp = g.op("Pad",[xt,g.c([0,p,p,0,0,p,p,0])])
    parts=[]
    for kh in range(k):
        for kw in range(k):
            parts.append(g.op("Slice",[xtp,g.c([kh,kw]),g.c([kh+H,kw+W]),g.c([1,2])]))
    cols = g.op("Concat",parts,axis=3)  # [N,H,W,KC]
    cols = g.op("Reshape",[cols,g.c([-1,K*C])])
    d = g.op("Transpose",[dY],perm=[1,0,2,3]); d=g.op("Reshape",[d,g.c([M,-1])])
    pr = g.op("MatMul",[d,cols])
    pr = g.op("Reshape",[pr,g.c([M,k,k,C])])
    return g.op("Transpose",[pr],perm=[0,3,1,2])
def main():
    """Times each form of a 3x3, stride-1, pad-1 convolution's weight gradient on ONNX
    Runtime (batch 64, ResNet-20's layer shapes, 1 and 2 threads, median of 20 runs) and
    checks each against a float64 reference."""
    N = 64
    rng = np.random.default_rng(0)
    forms = [("per-offset (ours)", cur, {}), ("flattened grid", grid, {}), ("grid, batched", grid_chunk, {"B": 2}),
             ("grid, one MatMul", grid_one, {}), ("im2col by one-hot Conv", im2, {}),
             ("channels-last Concat", cl_cat, {}), ("batch as channels Conv", bac, {})]
    print("| layer | threads | " + " | ".join(f[0] for f in forms) + " |")
    for (C, M, H) in [(16, 16, 28), (32, 32, 14), (64, 64, 7)]:
        X = rng.standard_normal((N, C, H, H)).astype(np.float32)
        dY = rng.standard_normal((N, M, H, H)).astype(np.float32)
        R = ref(X, dY)
        for th in (1, 2):
            row = []
            for name, form, kw in forms:
                r, t = run(build(form, N, C, M, H, H, **kw), X, dY, th)
                err = np.abs(r - R).max() / np.abs(R).max()
                assert err < 1e-5, (name, err)
                row.append(f"{t:.2f}")
            print(f"| {C}->{M}, {H}x{H} | {th} | " + " | ".join(row) + " |", flush=True)

if __name__ == "__main__":
    main()
