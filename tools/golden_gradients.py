#!/usr/bin/env python3
"""Golden training fixtures for the bundled models, computed with PyTorch in float64.

Usage:
    pip install -r tools/requirements.txt
    python3 tools/golden_gradients.py --models models --out tests/fixtures/golden

For every TorchScript-exported model (mlp, lenet5, resnet20_28, resnet20_32,
mobilenetv2_05, transformer_text, kws_m5) this

1. builds the PyTorch module with the builders of ``tools/export_models.py`` and
   loads *every* parameter and BatchNorm buffer from the ONNX initializer of the
   same name (``models/<name>.onnx``), so the reference starts from exactly the
   ONNX initial values; the module is then converted to float64;
2. checks that the float64 module in eval mode reproduces onnxruntime's output
   of the ONNX file (max abs diff < 1e-5) -- this proves the weights were loaded
   right;
3. draws one fixed batch from ``numpy.random.RandomState(seed)``, where batch size
   and seed are chosen per model by the conditioning search (``choose_batch``):
   the first batch size of 8, 16, 32 (MobileNetV2: 32 only) and, for it, the first
   seed of 1234, 1235, ... (20 at most) at which an ordinary float32 PyTorch run of
   the whole recipe agrees with the float64 reference to 1e-5 relative in every
   category (``conditioning``); if none does, the closest try is used and the
   fixture is marked ``"conditioned": false``;
4. in train mode (BatchNorm on batch statistics; dropout disabled) records the
   logits, the cross-entropy loss, the gradient of every parameter, and the
   BatchNorm running statistics after that one forward;
5. runs two SGD, two AdamW (and, for mlp/lenet5, two Nesterov-SGD) steps on the
   same batch, each from the initial parameters with fresh optimizer state, and
   records the parameters after the second step and the loss at each step;
6. (lenet5) label-smoothed cross-entropy, (mlp) MSE against one-hot labels;

and writes ``<out>/<name>.safetensors`` (all tensors float32 except ``input``
(float32 / int64) and ``labels`` (int64)) plus ``<out>/<name>.json`` (recipe,
hyper-parameters, versions, parameter/buffer names in ONNX initializer order,
tensor index, the chosen ``batch`` / ``seed``, the conditioning result and the
seed search, measured float32-vs-float64 deviations per tensor group, and
PyTorch's own float32 error of every stored tensor,
``checks.float32_error_per_tensor[<key>] = ||f32 - f64||_2``, the yardstick of the
tests' tolerance rule).  ``<out>/README.md`` is regenerated as well.

The same recipe is re-run in float32 (PyTorch, same weights, batch and steps) to
choose a well-conditioned batch and to measure how far an ordinary float32
implementation lands from the float64 reference; of that run only these numbers are
stored (one per tensor, in the JSON), not its tensors.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

try:
    import safetensors
    from safetensors.numpy import save_file
except ImportError as exc:  # pragma: no cover - hard requirement
    raise SystemExit(f"safetensors is required (pip install -r tools/requirements.txt): {exc}")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_models as em  # noqa: E402  (only the model builders / SPECS are used)

MODELS = ["mlp", "lenet5", "resnet20_28", "resnet20_32", "mobilenetv2_05", "transformer_text", "kws_m5"]
# Batch size and data seed are chosen per model so that the fixture is well
# conditioned (see `choose_batch`): the first batch size of BATCH_LADDER that is
# >= BATCH_START[name] (default BATCH_DEFAULT) and, for it, the first seed
# SEED_BASE, SEED_BASE + 1, ... (SEED_TRIES at most) at which float32 PyTorch
# agrees with the float64 reference to COND_RTOL in every checked category.
BATCH_DEFAULT = 8
# MobileNetV2's last stages run at 1x1 spatial size: each BatchNorm channel
# there normalises over N values only, so N = 8 leaves channels with a batch
# variance far below eps (an amplifier of round-off); 32 values are enough.
BATCH_START = {"mobilenetv2_05": 32}
BATCH_LADDER = (8, 16, 32)
SEED_BASE = 1234
SEED_TRIES = 20
COND_RTOL = 1e-5  # relative L2 error of float32 PyTorch vs the float64 reference
COND_ZERO_NORM = 1e-9  # a reference tensor with a smaller L2 norm is (analytically) zero ...
COND_ZERO_ATOL = 1e-6  # ... and is compared with this absolute tolerance on ||diff||_2
STEPS = 2
# The tests' yardstick is the float32 error of an ensemble, not of one run: the seed
# search above picks the batch at which the default float32 run happens to land close
# (a selected sample, biased low), so that run alone understates what float32 does at
# this batch. ENSEMBLE_RUNS more float32 runs start from the same values each moved by
# a random -1, 0 or +1 float32 ulp (parameters, BatchNorm buffers and a float input):
# the size of round-off every float32 implementation makes, in a different place each
# time. They are not used for the choice, so they are an unbiased look at the spread.
ENSEMBLE_RUNS = 4
ENSEMBLE_SEED = 20260
ORT_ATOL = 1e-5
SIZE_BUDGET = 35 * 1000 * 1000

SGD = {"lr": 0.1, "momentum": 0.9, "dampening": 0.0, "weight_decay": 5e-4, "nesterov": False}
NESTEROV = {"lr": 0.1, "momentum": 0.9, "dampening": 0.0, "weight_decay": 5e-4, "nesterov": True}
ADAMW = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01, "amsgrad": False}
NESTEROV_MODELS = {"mlp", "lenet5"}
SMOOTH_MODELS = {"lenet5"}
MSE_MODELS = {"mlp"}
LABEL_SMOOTHING = 0.1

# a parameter whose float64 gradient has an L2 norm below COND_ZERO_NORM is analytically zero

SPECS = {s.name: s for s in em.SPECS}


# ---------------------------------------------------------------------------
# Model construction from the ONNX file
# ---------------------------------------------------------------------------


def state_names(model: nn.Module) -> list:
    """Persistent state (parameters + BN running stats), without num_batches_tracked."""
    return [k for k in model.state_dict() if not k.endswith("num_batches_tracked")]


def load_from_onnx(model: nn.Module, onnx_model: onnx.ModelProto) -> dict:
    inits = {t.name: t for t in onnx_model.graph.initializer}
    sd = model.state_dict()
    names = state_names(model)
    missing = [k for k in names if k not in inits]
    assert not missing, f"state not found among ONNX initializers: {missing}"
    with torch.no_grad():
        for k in names:
            arr = numpy_helper.to_array(inits[k])
            dst = sd[k]
            assert tuple(arr.shape) == tuple(dst.shape), (k, arr.shape, tuple(dst.shape))
            assert arr.dtype == np.float32, (k, arr.dtype)
            dst.copy_(torch.from_numpy(arr.copy()))
        for k, v in sd.items():
            if k.endswith("num_batches_tracked"):
                v.zero_()
    # the loaded values must be bit-identical to the initializers
    sd = model.state_dict()
    for k in names:
        assert np.array_equal(sd[k].numpy(), numpy_helper.to_array(inits[k])), k
    unused = [n for n in inits if n not in set(names)]
    return {"unused_initializers": unused}


def disable_dropout(model: nn.Module) -> list:
    """The ONNX files are exported in eval mode, where Dropout is the identity and
    is not even emitted; the golden reference therefore runs without dropout."""
    names = []
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
            names.append(name)
    return names


def make_batch(spec, seed: int, batch: int) -> tuple:
    rs = np.random.RandomState(seed)
    shape = (batch,) + tuple(spec.input_shape)
    if spec.input_dtype == "int64":
        x = rs.randint(0, em.VOCAB, size=shape).astype(np.int64)
    else:
        x = rs.standard_normal(shape).astype(np.float32)
    y = rs.randint(0, spec.num_classes, size=(batch,)).astype(np.int64)
    return x, y


# ---------------------------------------------------------------------------
# Recipe
# ---------------------------------------------------------------------------


def to_input(x: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    t = torch.from_numpy(x.copy())
    return t if t.dtype == torch.int64 else t.to(dtype)


def ce(logits, y):
    return F.cross_entropy(logits, y)


def ce_smooth(logits, y):
    return F.cross_entropy(logits, y, label_smoothing=LABEL_SMOOTHING)


def mse_onehot(logits, y):
    return F.mse_loss(logits, F.one_hot(y, logits.shape[1]).to(logits.dtype))


def grads_of(model0, x, y, loss_fn, dtype):
    m = copy.deepcopy(model0).to(dtype)
    m.train()
    logits = m(to_input(x, dtype))
    loss = loss_fn(logits, torch.from_numpy(y))
    loss.backward()
    grads = {}
    for n, p in m.named_parameters():
        assert p.grad is not None, f"parameter {n} got no gradient"
        grads[n] = p.grad.detach().numpy().copy()
    running = {}
    for n, b in m.named_buffers():
        if n.endswith("running_mean") or n.endswith("running_var"):
            running[n] = b.detach().numpy().copy()
    return logits.detach().numpy().copy(), float(loss.item()), grads, running


def optimize(model0, x, y, make_opt, dtype):
    m = copy.deepcopy(model0).to(dtype)
    m.train()
    opt = make_opt(m.parameters())
    xt, yt = to_input(x, dtype), torch.from_numpy(y)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = ce(m(xt), yt)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    params = {n: p.detach().numpy().copy() for n, p in m.named_parameters()}
    return losses, params


def sgd(cfg):
    return lambda ps: torch.optim.SGD(ps, lr=cfg["lr"], momentum=cfg["momentum"], dampening=cfg["dampening"],
                                      weight_decay=cfg["weight_decay"], nesterov=cfg["nesterov"])


def adamw(cfg):
    return lambda ps: torch.optim.AdamW(ps, lr=cfg["lr"], betas=tuple(cfg["betas"]), eps=cfg["eps"],
                                        weight_decay=cfg["weight_decay"], amsgrad=cfg["amsgrad"])


def run_recipe(name, model0, x, y, dtype) -> dict:
    """All golden tensors as numpy arrays in `dtype` precision (not yet cast)."""
    out = {}
    logits, loss, grads, running = grads_of(model0, x, y, ce, dtype)
    out["logits"] = logits
    out["loss"] = np.array(loss)
    for n, g in grads.items():
        out[f"grad/{n}"] = g
    for n, r in running.items():
        out[f"running/{n}"] = r
    runs = [("sgd", sgd(SGD)), ("adamw", adamw(ADAMW))]
    if name in NESTEROV_MODELS:
        runs.append(("nesterov", sgd(NESTEROV)))
    for tag, make_opt in runs:
        losses, params = optimize(model0, x, y, make_opt, dtype)
        out[f"{tag}_loss"] = np.array(losses)
        for n, p in params.items():
            out[f"{tag}/{n}"] = p
    if name in SMOOTH_MODELS:
        _, l2, g2, _ = grads_of(model0, x, y, ce_smooth, dtype)
        out["loss_smooth"] = np.array(l2)
        for n, g in g2.items():
            out[f"grad_smooth/{n}"] = g
    if name in MSE_MODELS:
        _, l3, g3, _ = grads_of(model0, x, y, mse_onehot, dtype)
        out["loss_mse"] = np.array(l3)
        for n, g in g3.items():
            out[f"grad_mse/{n}"] = g
    return out


def group_of(key: str) -> str:
    return key.split("/", 1)[0]


def deviation(ref: dict, other: dict, zero_grads: list) -> dict:
    """Per tensor group, over its tensors: the largest max-abs difference, the largest
    ``max|diff| / max|ref|`` (``max_rel_diff``, tensor in ``worst``) and the largest
    ``||diff||_2 / ||ref||_2`` (``max_rel_l2``, tensor in ``worst_l2``).

    Tensors of parameters with an analytically zero gradient are reported in a
    separate group ``<group> (zero-grad params)``: their relative error is meaningless."""
    zero = set(zero_grads)
    stats = {}
    for k, r in ref.items():
        o = other[k].astype(np.float64)
        diff = (o - r).ravel()
        d = float(np.max(np.abs(diff))) if r.size else 0.0
        scale = float(np.max(np.abs(r))) if r.size else 0.0
        rel = d / scale if scale > 0 else (0.0 if d == 0 else float("inf"))
        n2 = float(np.linalg.norm(r.ravel()))
        d2 = float(np.linalg.norm(diff))
        rel2 = d2 / n2 if n2 > 0 else (0.0 if d2 == 0 else float("inf"))
        grp = group_of(k)
        if "/" in k and k.split("/", 1)[1] in zero:
            grp += " (zero-grad params)"
        g = stats.setdefault(grp, {"max_abs_diff": 0.0, "max_rel_diff": 0.0, "worst": None,
                                   "max_rel_l2": 0.0, "worst_l2": None})
        g["max_abs_diff"] = max(g["max_abs_diff"], d)
        if rel >= g["max_rel_diff"]:
            g["max_rel_diff"], g["worst"] = rel, k
        if rel2 >= g["max_rel_l2"]:
            g["max_rel_l2"], g["worst_l2"] = rel2, k
    return stats


LOSS_GROUPS = {"loss", "loss_smooth", "loss_mse", "sgd_loss", "adamw_loss", "nesterov_loss"}
COND_CATEGORY = {"logits": "logits", "grad": "grad", "grad_smooth": "grad", "grad_mse": "grad",
                 "running": "running", "sgd": "sgd", "nesterov": "nesterov", "adamw": "adamw_update"}


def float32_errors(ref: dict, other: dict) -> dict:
    """PyTorch's own float32 error per stored tensor: ``||f32 - f64||_2`` over the tensor's
    elements (absolute, so that it is meaningful for analytically zero gradients too; for
    a scalar it is ``|diff|``). Same weights, batch and steps as the stored reference.

    An absolute norm serves every check at once: for parameters after an optimizer step
    the difference of the updates ``(f32 - p0) - (f64 - p0)`` is the same vector, and a
    relative error is this number divided by the norm of whatever the test compares."""
    return {k: float(np.linalg.norm((other[k].astype(np.float64) - r.astype(np.float64)).ravel()))
            for k, r in ref.items()}


def ulp_perturbed(rs: np.random.RandomState, a: np.ndarray) -> np.ndarray:
    """`a` (float32 values) with every element moved by a random -1, 0 or +1 float32 ulp."""
    a32 = a.astype(np.float32)
    step = rs.randint(-1, 2, size=a32.shape)
    up, down = np.nextafter(a32, np.float32(np.inf)), np.nextafter(a32, np.float32(-np.inf))
    return np.where(step > 0, up, np.where(step < 0, down, a32)).astype(a.dtype)


def ensemble_errors(name: str, model: nn.Module, x: np.ndarray, y: np.ndarray, golden: dict,
                    f32_err: dict) -> tuple:
    """PyTorch float32 errors over the ensemble: the default run (`f32_err`) and
    ENSEMBLE_RUNS runs from ulp-perturbed values. Returns (per tensor the largest error
    over the ensemble, per run and tensor the errors of the perturbed runs)."""
    runs = []
    for i in range(ENSEMBLE_RUNS):
        rs = np.random.RandomState(ENSEMBLE_SEED + i)
        m = copy.deepcopy(model)
        with torch.no_grad():
            for t in list(m.parameters()) + [b for n, b in m.named_buffers()
                                             if n.endswith("running_mean") or n.endswith("running_var")]:
                t.copy_(torch.from_numpy(ulp_perturbed(rs, t.numpy())))
        xi = x if x.dtype == np.int64 else ulp_perturbed(rs, x)
        runs.append(float32_errors(golden, run_recipe(name, m, xi, y, torch.float32)))
    worst = {k: max([v] + [r[k] for r in runs]) for k, v in f32_err.items()}
    return worst, runs


def zero_gradients(golden: dict) -> list:
    """Parameters whose float64 gradient is analytically zero (L2 norm < COND_ZERO_NORM)."""
    return sorted(k[len("grad/"):] for k, v in golden.items()
                  if k.startswith("grad/") and float(np.linalg.norm(v.ravel())) < COND_ZERO_NORM)


def conditioning(ref: dict, other: dict, params0: dict, zero_grads: list) -> dict:
    """The conditioning rule: per category, the worst error of float32 PyTorch (`other`)
    against the float64 reference (`ref`) and whether it is within tolerance.

    - ``loss``: every loss value (``loss``, ``loss_smooth``, ``loss_mse`` and each element
      of ``*_loss``), ``|diff| / |ref|``;
    - ``logits``, ``grad`` (``grad/``, ``grad_smooth/``, ``grad_mse/``), ``running``,
      ``sgd``, ``nesterov``: per tensor ``||diff||_2 / ||ref||_2``;
    - ``adamw_update``: per tensor, the same on the update ``u = adamw/<p> - <p>_initial``,
      but net of the float32 storage floor: ``(||diff||_2 - ||ulp32(adamw/<p>)||_2) /
      ||u||_2`` (clipped at 0). AdamW moves every element by only ~``2 * lr`` = 2e-3
      (weight-decay-only entries, e.g. unreferenced embedding rows, by ~2e-5 * |p|),
      so merely holding the parameter in float32 -- which any float32 implementation
      and the stored fixture do -- costs up to ~1e-4 of ``||u||`` for tensors near 1
      (BN / LayerNorm weights); that part is independent of the batch. What is left is
      the seed-dependent part: elements whose gradient is within round-off of
      AdamW's ``eps`` or sign change. The raw ``||diff||_2 / ||u||_2`` and the floor
      ``||ulp32||_2 / ||u||_2`` are recorded as well. Parameters with an analytically
      zero gradient are skipped (there the result is round-off);
    - a reference tensor with ``||ref||_2 < COND_ZERO_NORM`` (analytically zero
      gradients, and parameters that stay at ~0 after SGD because both their
      initial value and their gradient are 0) goes to ``<category>_zero`` and is
      checked with ``||diff||_2 <= COND_ZERO_ATOL``.
    """
    zero = set(zero_grads)
    cats = {}

    def add(cat, key, metric, value, tol):
        c = cats.setdefault(cat, {"metric": metric, "tolerance": tol, "worst": 0.0,
                                  "worst_tensor": None, "tensors": 0})
        c["tensors"] += 1
        if value >= c["worst"]:
            c["worst"], c["worst_tensor"] = value, key
        return c

    skipped = []
    for k, r in ref.items():
        grp = group_of(k)
        o = other[k].astype(np.float64)
        r = r.astype(np.float64)
        if grp in LOSS_GROUPS:
            rel = float(np.max(np.abs(o - r) / np.abs(r)))
            add("loss", k, "max |diff|/|ref|", rel, COND_RTOL)
            continue
        cat = COND_CATEGORY[grp]
        if cat == "adamw_update":
            pname = k.split("/", 1)[1]
            if pname in zero:
                skipped.append(k)
                continue
            p0 = params0[pname].astype(np.float64)
            floor = float(np.linalg.norm(np.spacing(np.abs(r).astype(np.float32)).astype(np.float64).ravel()))
            r, o = r - p0, o - p0
            n2 = float(np.linalg.norm(r.ravel()))
            d2 = float(np.linalg.norm((o - r).ravel()))
            assert n2 >= COND_ZERO_NORM, k
            c = add(cat, k, "max(0, ||diff||_2 - ||ulp32(ref)||_2) / ||update||_2 (update = after - initial)",
                    max(0.0, d2 - floor) / n2, COND_RTOL)
            if d2 / n2 >= c.setdefault("worst_raw_rel_l2", 0.0):
                c["worst_raw_rel_l2"], c["worst_raw_tensor"] = d2 / n2, k
                c["float32_floor_of_worst_raw"] = floor / n2
            continue
        n2 = float(np.linalg.norm(r.ravel()))
        d2 = float(np.linalg.norm((o - r).ravel()))
        if n2 < COND_ZERO_NORM:
            add(cat + "_zero", k, "||diff||_2", d2, COND_ZERO_ATOL)
        else:
            add(cat, k, "||diff||_2/||ref||_2", d2 / n2, COND_RTOL)
    for c in cats.values():
        c["ok"] = bool(c["worst"] <= c["tolerance"])
    return {"categories": cats, "skipped": skipped, "ok": all(c["ok"] for c in cats.values())}


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ort_logits(path: str, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    (got,) = sess.run(["logits"], {"input": x})
    return got


def batch_ladder(name: str) -> list:
    start = BATCH_START.get(name, BATCH_DEFAULT)
    return [b for b in BATCH_LADDER if b >= start] or [start]


def excess_decades(cond: dict) -> float:
    """How far a try misses the conditioning rule: sum over categories of
    log10(worst / tolerance), counting only categories that fail."""
    return float(sum(np.log10(c["worst"] / c["tolerance"])
                     for c in cond["categories"].values() if not c["ok"]))


def choose_batch(name: str, spec, model: nn.Module, params0: dict) -> dict:
    """The conditioning search: for each batch size of `batch_ladder(name)`, the seeds
    SEED_BASE .. SEED_BASE + SEED_TRIES - 1 in order; the first (batch, seed) at which
    float32 PyTorch meets `conditioning` wins. If none does, the try that misses by the
    fewest decades (`excess_decades`) is used and the fixture is marked not conditioned."""
    tries, best = [], None
    for batch in batch_ladder(name):
        for seed in range(SEED_BASE, SEED_BASE + SEED_TRIES):
            x, y = make_batch(spec, seed, batch)
            golden = run_recipe(name, model, x, y, torch.float64)
            f32 = run_recipe(name, model, x, y, torch.float32)
            zero_grads = zero_gradients(golden)
            cond = conditioning(golden, f32, params0, zero_grads)
            excess = excess_decades(cond)
            failed = {c: v["worst"] for c, v in cond["categories"].items() if not v["ok"]}
            tries.append({"batch": batch, "seed": seed, "ok": cond["ok"], "failed": failed})
            print(f"   try batch={batch:2d} seed={seed} {'OK' if cond['ok'] else 'fails'} "
                  + " ".join(f"{c}={w:.1e}" for c, w in failed.items()), flush=True)
            cand = {"batch": batch, "seed": seed, "x": x, "y": y, "golden": golden, "f32": f32,
                    "zero_grads": zero_grads, "cond": cond, "excess": excess}
            if cond["ok"]:
                return {**cand, "tries": tries, "conditioned": True}
            if best is None or excess < best["excess"]:
                best = cand
    print(f"WARNING: {name}: no (batch, seed) meets the conditioning rule; using batch={best['batch']} "
          f"seed={best['seed']} (misses by {best['excess']:.2f} decades in total)", flush=True)
    return {**best, "tries": tries, "conditioned": False}


def process(name: str, models_dir: str, out_dir: str) -> dict:
    spec = SPECS[name]
    file = f"{name}.onnx"
    path = os.path.join(models_dir, file)
    onnx_model = onnx.load(path)

    model = em.build(spec)  # architecture only; every value is overwritten below
    load_info = load_from_onnx(model, onnx_model)
    dropouts = disable_dropout(model)
    model = model.double()
    model.eval()

    init_order = [t.name for t in onnx_model.graph.initializer]
    param_names = [n for n, _ in model.named_parameters()]
    buffer_names = [n for n in state_names(model) if n not in set(param_names)]
    params_onnx = [n for n in init_order if n in set(param_names)]
    buffers_onnx = [n for n in init_order if n in set(buffer_names)]
    assert sorted(params_onnx) == sorted(param_names) and sorted(buffers_onnx) == sorted(buffer_names)

    params0 = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    print(f"{name}: conditioning search (batches {batch_ladder(name)}, seeds {SEED_BASE}.."
          f"{SEED_BASE + SEED_TRIES - 1})", flush=True)
    chosen = choose_batch(name, spec, model, params0)
    batch, seed, x, y = chosen["batch"], chosen["seed"], chosen["x"], chosen["y"]
    golden, f32, zero_grads, cond = chosen["golden"], chosen["f32"], chosen["zero_grads"], chosen["cond"]

    # eval-mode float64 vs onnxruntime (float32) on the golden batch
    with torch.no_grad():
        ref_eval = model(to_input(x, torch.float64)).numpy()
    got = ort_logits(path, x)
    assert got.shape == ref_eval.shape == (batch, spec.num_classes), (got.shape, ref_eval.shape)
    ort_diff = float(np.max(np.abs(got.astype(np.float64) - ref_eval)))
    assert ort_diff < ORT_ATOL, f"{name}: float64 eval vs onnxruntime max abs diff {ort_diff:.3e}"

    dev = deviation(golden, f32, zero_grads)
    f32_err = float32_errors(golden, f32)
    ens_err, ens_runs = ensemble_errors(name, model, x, y, golden, f32_err)

    # BN running_var: PyTorch (unbiased batch variance) vs ONNX-spec (biased) update
    bn_unbiased_effect = 0.0
    if buffer_names:
        m = copy.deepcopy(model)
        m.train()
        counts = {}

        def counter(bn_name):
            def hook(_mod, inp, _out):
                counts[bn_name] = inp[0].numel() // inp[0].shape[1]  # values per channel
            return hook

        hs = [mm.register_forward_hook(counter(n))
              for n, mm in m.named_modules() if isinstance(mm, em.BN_TYPES)]
        with torch.no_grad():
            m(to_input(x, torch.float64))
        for h in hs:
            h.remove()
        for bn, n in counts.items():
            rv = golden[f"running/{bn}.running_var"]
            rv0 = model.state_dict()[f"{bn}.running_var"].numpy()
            batch_var_unbiased = (rv - 0.9 * rv0) / 0.1
            biased = 0.9 * rv0 + 0.1 * batch_var_unbiased * (n - 1) / n
            bn_unbiased_effect = max(bn_unbiased_effect, float(np.max(np.abs(rv - biased))))
        min_count = min(counts.values())
    else:
        min_count = None

    # ---- write tensors
    tensors = {}
    tensors["input"] = x
    tensors["labels"] = y
    for k, v in golden.items():
        tensors[k] = np.ascontiguousarray(v.astype(np.float32))
    for k, v in tensors.items():
        assert np.all(np.isfinite(v)), k
    st_path = os.path.join(out_dir, f"{name}.safetensors")
    # a single metadata entry: safetensors writes the metadata map in hash order,
    # so several keys would make the file bytes differ from run to run
    info = json.dumps({"format": "edgefreeze golden training fixture v1", "model": file,
                       "recipe": f"{name}.json", "reference_dtype": "float64",
                       "torch": torch.__version__}, sort_keys=True)
    save_file(tensors, st_path, metadata={"edgefreeze": info})
    os.chmod(st_path, 0o644)  # safetensors creates it 0600

    losses = {"loss": "cross_entropy (mean over batch)"}
    if name in SMOOTH_MODELS:
        losses["loss_smooth"] = f"cross_entropy(label_smoothing={LABEL_SMOOTHING}) (mean over batch)"
    if name in MSE_MODELS:
        losses["loss_mse"] = "mse_loss(logits, one_hot(labels, 10)) (mean over batch*classes elements)"
    optim = {"sgd": SGD, "adamw": ADAMW}
    if name in NESTEROV_MODELS:
        optim["nesterov"] = NESTEROV

    meta = {
        "model": name,
        "file": file,
        "onnx_sha256": sha256(path),
        "batch": batch,
        "batch_size": batch,  # same as "batch" (the name used before the conditioning search)
        "seed": seed,
        "conditioned": chosen["conditioned"],
        "rng": ("numpy.random.RandomState(seed): first input = "
                + ("rs.randint(0, 4096, size=shape) as int64" if spec.input_dtype == "int64"
                   else "rs.standard_normal(shape).astype(float32)")
                + f", then labels = rs.randint(0, {spec.num_classes}, size=({batch},)) as int64"),
        "input": {"name": "input", "dtype": spec.input_dtype, "shape": [batch, *spec.input_shape]},
        "labels": {"dtype": "int64", "shape": [batch], "num_classes": spec.num_classes},
        "mode": "train (BatchNorm uses batch statistics and updates running stats; dropout disabled)",
        "dropout_disabled": dropouts,
        "losses": losses,
        "optimizers": optim,
        "optimizer_steps": STEPS,
        "optimizer_note": ("each optimizer run starts from the initial (ONNX) parameters and BN buffers "
                           "with fresh optimizer state; weight decay applies to every parameter "
                           "(biases, norm affine parameters and embeddings included); the forward "
                           "and backward are recomputed on the same batch before each step"),
        "batchnorm": {"momentum_pytorch": 0.1, "momentum_onnx_attribute": 0.9, "eps": 1e-5,
                      "running_mean": "0.9 * old + 0.1 * batch_mean",
                      "running_var": "0.9 * old + 0.1 * batch_var * n/(n-1) (unbiased, n = N*spatial)",
                      "normalisation": "biased batch variance",
                      "smallest_n": min_count,
                      "max_abs_running_var_diff_unbiased_vs_biased": bn_unbiased_effect},
        "reference_dtype": "float64",
        "storage_dtype": "float32 (input float32/int64, labels int64)",
        "torch_version": torch.__version__,
        "numpy_version": np.__version__,
        "onnx_version": onnx.__version__,
        "onnxruntime_version": ort.__version__,
        "safetensors_version": safetensors.__version__,
        "parameters": params_onnx,
        "buffers": buffers_onnx,
        "unused_initializers": load_info["unused_initializers"],
        "results": {k: golden[k].tolist() for k in golden if k.startswith("loss") or k.endswith("_loss")},
        "analytically_zero_gradients": zero_grads,
        "checks": {
            "eval_float64_vs_onnxruntime_max_abs_diff": ort_diff,
            "conditioning": {
                "rule": ("first batch in batch_ladder, and for it the first seed from seed_base on "
                         "(seed_tries at most), at which an ordinary float32 PyTorch run of this recipe "
                         "is within tolerance of the float64 reference in every category (see "
                         "tools/golden_gradients.py: conditioning and README.md)"),
                "batch_ladder": batch_ladder(name),
                "seed_base": SEED_BASE,
                "seed_tries": SEED_TRIES,
                "rtol": COND_RTOL,
                "zero_norm": COND_ZERO_NORM,
                "zero_atol": COND_ZERO_ATOL,
                "met": chosen["conditioned"],
                "categories": cond["categories"],
                "adamw_update_skipped": cond["skipped"],
                "tries": chosen["tries"],
            },
            "float32_torch_vs_float64_reference": dev,
            "float32_error_metric": ("||torch_float32 - torch_float64||_2 over the tensor's elements "
                                     "(absolute; |diff| for a scalar); same batch and steps"),
            "float32_error_ensemble": (f"the default float32 run and {ENSEMBLE_RUNS} float32 runs whose "
                                       "parameters, BatchNorm buffers and float input are each moved by a "
                                       "random -1, 0 or +1 float32 ulp (numpy.random.RandomState("
                                       f"{ENSEMBLE_SEED} + run)); float32_error_per_tensor is the largest "
                                       "error over these runs, float32_error_default_run that of the "
                                       "default run alone (the one the conditioning search chose by)"),
            "float32_error_per_tensor": ens_err,
            "float32_error_default_run": f32_err,
        },
        "tensors": {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in tensors.items()},
    }
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")

    size = os.path.getsize(st_path)
    print(f"{'OK' if chosen['conditioned'] else 'NOT CONDITIONED'} {name}: batch={batch} seed={seed}; "
          + " ".join(f"{c}={v['worst']:.1e}" for c, v in cond["categories"].items()), flush=True)
    print(f"OK {name:17s} loss={golden['loss']:.6f} sgd_loss={golden['sgd_loss'].tolist()} "
          f"adamw_loss={golden['adamw_loss'].tolist()} tensors={len(tensors)} size={size}B "
          f"ort|diff|={ort_diff:.2e}", flush=True)
    for g, s in dev.items():
        print(f"   f32 vs f64 {g:30s} max_abs={s['max_abs_diff']:.2e} max_rel={s['max_rel_diff']:.2e} ({s['worst']}) "
              f"max_rel_l2={s['max_rel_l2']:.2e} ({s['worst_l2']})")
    if zero_grads:
        print(f"   analytically zero gradients: {zero_grads}")
    if dropouts:
        print(f"   dropout disabled: {dropouts}")
    return {"name": name, "size": size, "tensors": len(tensors), "meta": meta}


README = """# Golden training fixtures

Reference values for edgefreeze's training path (forward in train mode, loss,
backward, BatchNorm running statistics, SGD / Nesterov / AdamW steps), computed
with PyTorch **in float64** from exactly the initial weights stored in
`models/<name>.onnx`, by [`tools/golden_gradients.py`](../../../tools/golden_gradients.py).

One pair of files per TorchScript-exported model in `models/`:

- `<name>.safetensors`: the tensors below, all **float32** (computed in float64,
  then rounded) except `input` (float32, or int64 token ids for
  `transformer_text`) and `labels` (int64). Scalars have shape `[]`.
- `<name>.json`: the recipe, optimizer hyper-parameters, versions, the chosen
  `batch` and `seed` (and `conditioned`), the parameter and BN buffer names in
  ONNX initializer order, an index of every tensor, the loss values, parameters
  whose gradient is analytically zero, the conditioning result with the whole
  seed search (`checks.conditioning`), the measured deviation of an
  ordinary float32 PyTorch run from the float64 reference
  (`checks.float32_torch_vs_float64_reference`), and, per stored tensor,
  PyTorch's own float32 error `||f32 - f64||_2`: the largest over an ensemble of
  float32 runs (`checks.float32_error_per_tensor`, the tests' yardstick, see
  *Tolerance rule* below) and that of the default run alone
  (`checks.float32_error_default_run`).

| file | batch | seed | conditioned | size | tensors | loss (CE) |
|---|---:|---:|:---:|---:|---:|---:|
{rows}

Total: {total}.

## Tensors

| name | meaning |
|---|---|
| `input`, `labels` | the batch (`batch` samples, per model: see the table above / the JSON) |
| `logits` | train-mode forward output, `[batch, classes]` |
| `loss` | `F.cross_entropy(logits, labels)` (mean over the batch), shape `[]` |
| `grad/<param>` | d`loss`/d`param` at the initial parameters, for every parameter |
| `running/<bn>.running_mean`, `running/<bn>.running_var` | BN running stats after that one train-mode forward |
| `sgd/<param>` | parameters after 2 SGD steps (momentum) |
| `adamw/<param>` | parameters after 2 AdamW steps |
| `nesterov/<param>` | (mlp, lenet5) parameters after 2 Nesterov-SGD steps |
| `sgd_loss`, `adamw_loss`, `nesterov_loss` | `[loss at step 1, loss at step 2]` (float32 `[2]`) |
| `loss_smooth`, `grad_smooth/<param>` | (lenet5) `F.cross_entropy(..., label_smoothing=0.1)` and its gradient |
| `loss_mse`, `grad_mse/<param>` | (mlp) `F.mse_loss(logits, one_hot(labels, 10))` (mean over all `batch * 10` elements) and its gradient |

`num_batches_tracked` is not recorded (irrelevant with a fixed momentum).

## Recipe

1. Build the module with the builders of `tools/export_models.py`, copy every
   parameter and BN buffer from the ONNX initializer of the same name
   (asserted: all found, bit-identical), then `.double()`.
   MobileNetV2's classifier `Dropout(0.2)` is set to `p=0` (the ONNX file,
   exported in eval mode, has no Dropout); no other model has dropout.
2. Check: the float64 module in eval mode matches onnxruntime (CPU, float32) on
   the golden batch to max abs diff < 1e-5.
3. Batch: with the model's `batch` and `seed` (chosen as described under
   *Conditioning* below), `rs = numpy.random.RandomState(seed)`; first
   `input = rs.standard_normal((batch, *input_shape)).astype(float32)`
   (transformer: `rs.randint(0, 4096, size=(batch, 64))` as int64), then
   `labels = rs.randint(0, num_classes, size=(batch,))` as int64. The float64
   reference consumes the float32 input converted exactly to float64.
4. `model.train()`; one forward / backward gives `logits`, `loss`, `grad/*`,
   `running/*`.
5. Each optimizer run starts from the initial parameters and BN buffers with
   fresh state, and does 2 steps on the same batch (forward and backward
   recomputed each step, BN running stats updated by each forward but not
   recorded):
   - SGD: `torch.optim.SGD(lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=False)`
   - Nesterov (mlp, lenet5): same with `nesterov=True`
   - AdamW: `torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)`

   Weight decay applies to **every** parameter (biases, BN/LayerNorm affine
   parameters, embeddings).

## Semantics an implementation must match

- **BatchNorm running_var uses the unbiased batch variance** (PyTorch):
  `running_var = 0.9 * old + 0.1 * var_batch * n / (n - 1)`, with
  `n = N * H * W` (or `N * L`) per channel, while the normalisation itself uses
  the biased variance. The ONNX `BatchNormalization` spec (and
  `onnx.reference`) updates with the *biased* variance, and its `momentum`
  attribute is the weight of the old value (0.9 in these files). For
  MobileNetV2 the last stages run at 1x1 spatial size, so `n = batch = 32` and
  the factor `32/31` matters (`batchnorm.smallest_n` in the JSON).
- PyTorch SGD: `g += wd * p`; first step `buf = g`, later
  `buf = momentum * buf + g`; `p -= lr * buf` (Nesterov: `p -= lr * (g + momentum * buf)`).
- PyTorch AdamW: `p *= 1 - lr * wd` first, then `m = b1 m + (1-b1) g`,
  `v = b2 v + (1-b2) g^2`, `p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`.
- **Analytically zero gradients** (listed per model in the JSON under
  `analytically_zero_gradients`: float64 gradient with L2 norm < 1e-9): a
  per-channel constant shift that is removed by a later train-mode BatchNorm,
  or by softmax, has zero gradient -- the bias of a convolution followed by
  BatchNorm (kws_m5 `conv1..4.bias`), the bias of MobileNetV2's projection
  BatchNorms (`features.*.conv.3.bias`, `features.1.conv.2.bias`: their output
  reaches the next block's 1x1 expand conv and its BatchNorm only through
  linear ops), and the attention key bias (transformer
  `layers.*.attn.inner.k.bias`). The float64 reference has |g| ~ 1e-17 there;
  a float32 implementation gets round-off of ~1e-11..1e-6. SGD does not care,
  but AdamW's first step is about `lr * g / (|g| + eps)`, so on these
  parameters the AdamW result is dominated by round-off (up to ~`2 * lr` =
  2e-3 away from the reference after 2 steps). Compare those entries with an
  absolute tolerance of about `2 * lr`, or skip them.
- Embedding rows not referenced by the batch have an exactly zero gradient; they
  only see weight decay.

## Conditioning: batch size and seed per model

A float32 implementation can only be held to a tight tolerance where float32
itself is not at a discontinuity or an amplifier: a ReLU/ReLU6 pre-activation
within float32 round-off of the kink lands on the other side (and moves the
gradient of everything before it by up to ~1%), a BatchNorm channel with a batch
variance far below eps amplifies round-off, and AdamW's sign-like first step
(`lr * g / (|g| + eps)`) turns the round-off of a gradient element that is
itself near round-off into a move of up to ~`lr`. Which elements sit there
depends on the data, so the batch is chosen per model:

- batch sizes, in order: 8, 16, 32 (MobileNetV2: 32 only -- its last stages run
  at 1x1 spatial size, so BN statistics there are over `batch` values);
- for each batch size the seeds 1234, 1235, ..., 1253 in order;
- the first (batch, seed) at which an ordinary **float32 PyTorch** run of the
  whole recipe agrees with the float64 reference in every category wins:
  - `loss`: every loss value (`loss`, `loss_smooth`, `loss_mse`, both elements
    of `sgd_loss` / `adamw_loss` / `nesterov_loss`): `|diff| / |ref| <= 1e-5`;
  - `logits`, `grad` (every tensor of `grad/`, `grad_smooth/`, `grad_mse/`),
    `running`, `sgd`, `nesterov`: per tensor `||diff||_2 / ||ref||_2 <= 1e-5`;
    a tensor with `||ref||_2 < 1e-9` (the analytically zero gradients) goes to
    `<category>_zero` and needs `||diff||_2 <= 1e-6` instead;
  - `adamw_update`: on the update `u = adamw/<p> - <p>` (initial value),
    analytically-zero-gradient parameters skipped (listed in
    `checks.conditioning.adamw_update_skipped`):
    `max(0, ||diff||_2 - ||ulp32(adamw/<p>)||_2) / ||u||_2 <= 1e-5`. The
    `ulp32` term is the float32 storage floor: AdamW moves each element by only
    ~`2 * lr` = 2e-3 (weight-decay-only entries such as unreferenced embedding
    rows by ~`2e-5 * |p|`), so just holding parameters near 1 (BN / LayerNorm
    weights) in float32 costs ~5e-5 of `||u||`, and unreferenced embedding rows
    ~1e-4, for every seed, in any float32 implementation and in the stored
    fixture itself. The raw `||diff||_2 / ||u||_2` and the floor are recorded
    too (`worst_raw_rel_l2`, `float32_floor_of_worst_raw`);
- if no try meets the rule, the try missing it by the fewest decades in total
  (sum of `log10(worst / tolerance)` over failing categories) is used and the
  fixture is marked `"conditioned": false`.

`checks.conditioning` in each JSON has the tolerances, per category the worst
value, its tensor and pass/fail at the chosen (batch, seed), and every try of
the search with its failing categories. Worst float32-vs-float64 error per
category at the chosen (batch, seed) (**bold**: above tolerance):

| model | batch | seed | loss | logits | grad | grad zero (abs) | running | sgd | nesterov | adamw update: net / worst raw / its float32 floor |
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
{condrows}

{notmet}

### Models the rule cannot be met for

- **resnet20_28, resnet20_32** (60 tries each): every category but
  `adamw_update` meets the rule at 17 (resnet20_28) and 11 (resnet20_32) of
  the tries; `adamw_update` never does.
  With ~270k parameters there is always some element whose gradient is
  within float32 round-off of 0 -- e.g. resnet20_28 (batch 8, seed 1235):
  `layer3.1.bn1.bias[39]` has g = -2.63e-7 in float64 and -2.60e-7 in
  float32 (1% apart, a cancelling sum over the batch), and AdamW's second
  step turns that into a 3.8e-7 difference of the update, 2.5e-5 of
  `||u||` of that 64-element tensor. The fixtures use the closest tries:
  resnet20_28 batch 8 / seed 1235 (`adamw_update` 2.5e-5) and resnet20_32
  batch 16 / seed 1239 (6.4e-5, `layer3.1.conv1.weight`); both are well
  conditioned in every other category (<= 7e-6).
- **mobilenetv2_05** (batch 32, 20 tries): not reachable by choosing the batch.
  The float32 forward error grows steadily with depth (~1.5e-6 relative after
  the first blocks, ~1e-5 at the logits) and is the same at batch 32, 64 and
  128 (logits 1.0e-5..1.6e-5 over 12 tries), so `logits` and `grad` sit at
  1.1e-5..2e-5 for the *best* seeds and the analytically zero gradients get
  `||diff||_2` ~1.1e-6 (logits error: 1.1e-5..1.6e-5 over the 20 seeds at
  batch 32; 1.1e-5..1.2e-5 at batch 64 and 9.7e-6..1.1e-5 at batch 128 over 4
  seeds each). Larger batches do not help the gradients either (more ReLU6
  elements near a kink: 2 of 4 seeds at batch 64 and all 4 at 128 had a
  gradient error of 5e-3..3e-2). Even at batch 32, 37..44 of the 480
  depthwise BatchNorm channels of each 1x1 stage (`features.15..17.conv.1.1`)
  have a batch variance below eps / 10 (down to ~6e-12), and the second
  optimizer step is chaotic: `sgd/*` differs by >= 1.6e-2 and the AdamW
  update by >= 7e-3 relative at every seed (the step-2 gradient computed in float32
  and float64 from the *same* parameters already differs by up to ~5e-3;
  lowering SGD's lr to 0.01 still leaves 2e-3..6e-3 after 2 steps). The
  fixture uses seed 1237 (the closest try). For it, `running/*` and the
  step-1 `loss` are tight checks (the step-2 losses differ by up to 2.5e-5),
  `logits` and `grad/*` hold at ~1e-4 with little margin, and `sgd/*` and
  `adamw/*` (1.6e-2 and 9e-3 of the update here) cannot be checked tightly
  at all.

## float32 PyTorch vs the float64 reference, per tensor group

Largest `||diff||_2 / ||ref||_2` over the tensors of a group at the chosen
(batch, seed), parameters with an analytically zero gradient excluded (raw,
without the AdamW floor); all values are in the JSON under
`checks.float32_torch_vs_float64_reference`, together with max-abs and
max-relative numbers:

| model | logits | grad | running | sgd | adamw | sgd_loss (abs) | adamw_loss (abs) |
|---|---:|---:|---:|---:|---:|---:|---:|
{devrows}

A float32 implementation flips *different* elements than float32 PyTorch
does, so where a fixture is not conditioned only the categories that meet the
rule above with margin are tight checks there.

## Tolerance rule of the tests

`tests/pytorch_golden.rs` compares each tensor of ours (float32, ONNX Runtime and
tract) with the float64 reference `r` and accepts it when

    ||ours - r||_2 <= 16 * e32        or        max |ours - r| <= 16 * eps32 * s

- `e32` = `checks.float32_error_per_tensor[<key>]`: PyTorch's own float32 error
  on that tensor, `||f32 - f64||_2`, the largest over an ensemble of float32
  runs: the default run and 4 runs whose parameters, BatchNorm buffers and float
  input are each moved by a random -1, 0 or +1 float32 ulp. One run is not
  enough: the conditioning search above *chose* the batch at which the default
  run happens to land close, so its error is biased low; the perturbed runs
  were not used for the choice. Largest ratio, over the tensors of a group,
  of the ensemble error to the default run's (a large one means the default
  run was lucky there: at resnet20_32's batch, ulp-sized changes of the
  starting values move the gradients 2.5e-3 (median over tensors, relative
  L2) from the float64 run where the default run is 2.5e-6 off -- jumps of the
  kind a ReLU pre-activation within round-off of its kink gives, not traced to
  single elements; mobilenetv2_05's by 5e-4):

| model | grad | running | sgd | adamw | nesterov | losses |
|---|---:|---:|---:|---:|---:|---:|
{ensrows}

- `16` (C): ours and PyTorch's are two float32 evaluations of the same function;
  their errors are the round-off each injects, propagated by the same
  Jacobians, so the conditioning of model and batch cancels from the ratio and
  what is left is how much round-off each injects per op: the order of long
  reductions (a sequential sum's typical error grows like sqrt(K), a blocked one
  like sqrt(block): a factor up to ~8 for the 16384-term convolution weight
  gradients of ResNet-20) times fused against composed ops (PyTorch's
  BatchNorm, log-softmax and cross-entropy are one kernel each; ours are
  several ONNX ops, each rounding), ~2.
- the floor `16 * eps32 * s` (`eps32` = 2^-23): every element within 16 float32
  ulps of the scale `s` its round-off is relative to: for a gradient the
  largest gradient element of the model (a gradient that is zero in exact
  arithmetic, e.g. a bias before a training-mode BatchNorm, is round-off of
  terms of the size of the model's gradients and has no scale of its own); for
  a loss, running statistic or parameter the tensor's own largest element.
- Parameters after optimizer steps are compared as they are; the absolute
  difference is the same as that of the update, and on analytically zero
  gradients AdamW turns round-off into steps of up to `lr` in every float32
  implementation, which the ensemble's error there shows.

The tests also show that the rule rejects real errors: in copies of our
accepted output, the gradient float32 determines best scaled by `1 + 1e-3`,
the largest element of every gradient that is not analytically zero negated,
and the update of the best-determined parameter scaled by 1.01 (1.1 where
float32 leaves more than 0.5% of every update open: mobilenetv2_05's SGD)
must each be rejected.

Worst ratio `||ours - r||_2 / e32` measured over all tensors and categories
(on an AMD EPYC with AVX-512; tract also with its AVX2+FMA kernels,
`TRACT_CPU_ISA=-avx512f,-avx512vnni,-avx512fp16,-avxvnni,-amx-int8,-amx-bf16`;
no tensor needed the floor):

| model | ONNX Runtime | tract (AVX-512) | tract (AVX2+FMA) | where |
|---|---:|---:|---:|---|
| mlp | 9.25 | 8.74 | 9.31 | AdamW step losses |
| lenet5 | 4.30 | 4.28 | 4.27 | AdamW `fc1.bias` |
| resnet20_28 | 4.69 | 4.19 | 5.10 | AdamW step losses |
| resnet20_32 | 1.86 | 1.73 | 1.73 | running mean |
| mobilenetv2_05 | 2.29 | 2.28 | 2.28 | running mean |
| transformer_text | 6.05 | 6.05 | 6.05 | AdamW `head.bias` |
| kws_m5 | 10.65 | 9.96 | 9.96 | AdamW step losses |

The largest ratios are all AdamW: ours computes the bias correction
`1 - beta2^t` from float32 `beta2` = 0.99900001 but scales `g^2` by
`1 - beta2` = 0.001, which makes every AdamW step 6.4e-6 (step 1) and 9.8e-6
(step 2) too large; PyTorch computes both in float64.

## Regenerate

```sh
pip install -r tools/requirements.txt
python3 tools/golden_gradients.py --models models --out tests/fixtures/golden
```

The conditioning search runs the recipe in float64 and float32 for every try
(about 5 minutes on one CPU thread for all models). Generated with torch
{torch}, numpy {numpy}, onnx {onnx}, onnxruntime {ort}, safetensors {st}. The
output is deterministic on CPU for a given torch version (one intra-op
thread); a different torch version can change which seed wins.
"""


def write_readme(out_dir: str, rows: list) -> None:
    lines = []
    for r in rows:
        m = r["meta"]
        lines.append(f"| `{r['name']}.safetensors` | {m['batch']} | {m['seed']} | "
                     f"{'yes' if m['conditioned'] else '**no**'} | {r['size'] / 1e6:.2f} MB | {r['tensors']} | "
                     f"{m['results']['loss']:.6f} |")
    total = sum(r["size"] for r in rows)
    cond_lines, notmet = [], []
    for r in rows:
        m = r["meta"]
        cats = m["checks"]["conditioning"]["categories"]

        def w(c):
            if c not in cats:
                return "-"
            v = f"{cats[c]['worst']:.1e}"
            return v if cats[c]["ok"] else f"**{v}**"

        a = cats["adamw_update"]
        adam = f"{w('adamw_update')} / {a['worst_raw_rel_l2']:.1e} / {a['float32_floor_of_worst_raw']:.1e}"
        cond_lines.append(f"| {r['name']} | {m['batch']} | {m['seed']} | {w('loss')} | {w('logits')} | "
                          f"{w('grad')} | {w('grad_zero')} | {w('running')} | {w('sgd')} | {w('nesterov')} | "
                          f"{adam} |")
        if not m["conditioned"]:
            failing = [c for c, v in cats.items() if not v["ok"]]
            notmet.append(f"`{r['name']}` ({', '.join(failing)})")
    notmet_text = ("Every model meets the rule." if not notmet else
                   'Not met (closest try used, `"conditioned": false`): ' + "; ".join(notmet) + ".")
    dev_lines = []
    for r in rows:
        d = r["meta"]["checks"]["float32_torch_vs_float64_reference"]

        def l2(g):
            return f"{d[g]['max_rel_l2']:.1e}" if g in d else "-"

        def ab(g):
            return f"{d[g]['max_abs_diff']:.1e}" if g in d else "-"

        dev_lines.append(f"| {r['name']} | {l2('logits')} | {l2('grad')} | {l2('running')} | {l2('sgd')} | "
                         f"{l2('adamw')} | {ab('sgd_loss')} | {ab('adamw_loss')} |")
    ens_lines = []
    for r in rows:
        c = r["meta"]["checks"]
        ens, one = c["float32_error_per_tensor"], c["float32_error_default_run"]
        worst = {}
        for k, v in ens.items():
            g = {"grad_smooth": "grad", "grad_mse": "grad"}.get(group_of(k), group_of(k))
            g = "losses" if g in LOSS_GROUPS else g
            ratio = v / one[k] if one[k] > 0 else 1.0
            worst[g] = max(worst.get(g, 1.0), ratio)

        def ens_cell(g):
            return f"{worst[g]:.1f}" if g in worst else "-"

        ens_lines.append(f"| {r['name']} | " + " | ".join(ens_cell(g) for g in
                         ("grad", "running", "sgd", "adamw", "nesterov", "losses")) + " |")
    text = (README.replace("{rows}", "\n".join(lines)).replace("{ensrows}", "\n".join(ens_lines)).replace("{devrows}", "\n".join(dev_lines))
            .replace("{condrows}", "\n".join(cond_lines)).replace("{notmet}", notmet_text)
            .replace("{total}", f"{total / 1e6:.2f} MB"))
    text = (text.replace("{torch}", torch.__version__).replace("{numpy}", np.__version__)
            .replace("{onnx}", onnx.__version__).replace("{ort}", ort.__version__)
            .replace("{st}", safetensors.__version__))
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="models", help="directory with <name>.onnx")
    ap.add_argument("--out", default="tests/fixtures/golden", help="output directory")
    ap.add_argument("--only", nargs="*", help="only these model names")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    print(f"torch {torch.__version__}, numpy {np.__version__}, onnx {onnx.__version__}, "
          f"onnxruntime {ort.__version__}, safetensors {safetensors.__version__}")

    rows = []
    for name in MODELS:
        if args.only and name not in args.only:
            continue
        rows.append(process(name, args.models, args.out))

    total = sum(r["size"] for r in rows)
    print(f"total {total} bytes ({total / 1e6:.2f} MB)")
    if not args.only:
        if total > SIZE_BUDGET:
            big = max(rows, key=lambda r: r["size"])
            print(f"WARNING: fixtures exceed {SIZE_BUDGET} bytes; largest: {big['name']} ({big['size']} bytes)")
        write_readme(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
