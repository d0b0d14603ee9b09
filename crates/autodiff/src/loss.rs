//! Losses: forward value, closed-form gradient with respect to the model output, and the
//! number of correct predictions.

use crate::emit::Emitter;
use edgefreeze_graph::DataType;
use edgefreeze_graph::ir::Attribute;

/// The training objective.
#[derive(Debug, Clone, PartialEq)]
pub enum Loss {
    /// Softmax cross-entropy over axis 1 of logits `[N, K, d1, …]` against int64 class
    /// labels `[N, d1, …]` (one per sample, or one per pixel of a segmentation model's
    /// class map), averaged over the labels, with optional label smoothing and an ignored
    /// label: PyTorch's `F.cross_entropy(logits, labels, ignore_index=…,
    /// label_smoothing=…)`, classes on axis 1 as there (a model whose classes come last,
    /// `[N, T, K]`, needs them moved first). Labels must lie in 0..K or be the ignored
    /// one: PyTorch refuses others; here such a label has no hot class, so its loss and
    /// its gradient would not agree (the trainer refuses datasets whose labels do not fit).
    CrossEntropy {
        /// Weight moved from the true class to the uniform distribution, in [0, 1).
        label_smoothing: f64,
        /// Labels with this value add nothing to the loss, its gradient or the accuracy,
        /// and the mean is over the others (PyTorch's `ignore_index`, 255 in Pascal VOC's
        /// masks; unlike PyTorch's, there is none by default, not −100).
        ignore_index: Option<i64>,
    },
    /// Mean squared error of the output against float targets of the same shape,
    /// averaged over all elements.
    MeanSquaredError,
    /// The model's first output already is the scalar loss.
    Output,
}

/// Name of the labels (targets) input.
pub const LABELS: &str = "labels";

impl Loss {
    /// Plain cross-entropy: no smoothing, no ignored label.
    pub fn cross_entropy() -> Loss {
        Loss::CrossEntropy { label_smoothing: 0.0, ignore_index: None }
    }
}

/// Values the loss adds.
pub struct LossValues {
    /// The scalar loss.
    pub loss: String,
    /// d loss / d output, the seed of the backward pass.
    pub seed: (String, String),
    /// Correct predictions in the batch, for classification losses: an int64 count with one
    /// label per sample; with labels per element, or an ignored label, a float scalar in
    /// samples: the batch's accuracy over its counted labels times its sample count, so
    /// that the trainer's Σ correct / Σ samples is the accuracy per label either way.
    pub correct: Option<String>,
}

/// Emits the loss of `output`, of rank `rank`, against [`LABELS`].
pub fn emit_loss(loss: &Loss, output: &str, rank: usize, e: &mut Emitter) -> LossValues {
    e.set_prefix("loss");
    let values = match loss {
        Loss::CrossEntropy { label_smoothing, ignore_index: None } if rank == 2 => {
            cross_entropy(output, *label_smoothing, e)
        }
        Loss::CrossEntropy { label_smoothing, ignore_index } => {
            cross_entropy_per_label(output, rank, *label_smoothing, *ignore_index, e)
        }
        Loss::MeanSquaredError => mean_squared_error(output, e),
        Loss::Output => {
            let one = e.scalar(1.0);
            LossValues { loss: output.to_string(), seed: (output.to_string(), one), correct: None }
        }
    };
    e.set_prefix("");
    values
}

/// One-hot targets `[N, K, d1, …]` (in the float type) of int64 labels `[N, d1, …]` for
/// logits `[N, K, d1, …]` of rank `rank`, smoothed: (1 − ε)·onehot + ε/K. A label outside
/// 0..K (an ignored one) has no hot class.
fn smoothed_targets(logits: &str, rank: usize, classes: &str, smoothing: f64, e: &mut Emitter) -> String {
    let zero = e.int_scalar(0);
    let one = e.int_scalar(1);
    let k_int = {
        let shape = e.shape_of(logits);
        let i = e.int_scalar(1);
        e.op("Gather", &[&shape, &i], vec![("axis", Attribute::Int(0))])
    };
    let mut range = e.op("Range", &[&zero, &k_int, &one], vec![]);
    if rank > 2 {
        // The classes along axis 1: `[K, 1, …]` against the labels `[N, 1, d1, …]`.
        let trailing: Vec<i64> = (1..rank as i64 - 1).collect();
        range = e.unsqueeze(&range, &trailing);
    }
    let labels = e.unsqueeze(LABELS, &[1]);
    let hit = e.op("Equal", &[&labels, &range], vec![]);
    let float = e.float;
    let onehot = e.cast(&hit, float);
    if smoothing == 0.0 {
        return onehot;
    }
    let kept = e.scale(&onehot, 1.0 - smoothing);
    let eps = e.scalar(smoothing);
    let spread = e.div(&eps, classes);
    e.add(&kept, &spread)
}

fn count_correct(predicted: &str, target_classes: &str, e: &mut Emitter) -> String {
    let hit = e.op("Equal", &[predicted, target_classes], vec![]);
    let as_int = e.cast(&hit, DataType::Int64);
    e.op("ReduceSum", &[&as_int], vec![("keepdims", Attribute::Int(0))])
}

fn argmax(x: &str, e: &mut Emitter) -> String {
    e.op("ArgMax", &[x], vec![("axis", Attribute::Int(1)), ("keepdims", Attribute::Int(0))])
}

/// `log softmax(x)` over axis 1 as `x − max − log Σ exp(x − max)`, finite for any finite
/// logits. Not the LogSoftmax op: tract 0.23 takes the log of the softmax, which is −∞
/// where a probability underflows (a logit 104 below the largest), and the loss's
/// `0 · −∞` of every other class made it NaN (the test loss of a ResNet-20 whose logits
/// spread over 150 after an epoch at a high learning rate; ONNX Runtime gave 11.1).
fn log_softmax(x: &str, e: &mut Emitter) -> String {
    let max = e.reduce_max(x, &[1], true);
    let shifted = e.sub(x, &max);
    let exp = e.op("Exp", &[&shifted], vec![]);
    let sum = e.reduce_sum(&exp, &[1], true);
    let log_sum = e.op("Log", &[&sum], vec![]);
    e.sub(&shifted, &log_sum)
}

fn cross_entropy(logits: &str, smoothing: f64, e: &mut Emitter) -> LossValues {
    let log_probs = log_softmax(logits, e);
    let classes = e.dim_size(logits, 1);
    let targets = smoothed_targets(logits, 2, &classes, smoothing, e);
    let weighted = e.mul(&targets, &log_probs);
    let total = e.op("ReduceSum", &[&weighted], vec![("keepdims", Attribute::Int(0))]);
    let batch = e.dim_size(logits, 0);
    let mean = e.div(&total, &batch);
    let loss = e.neg(&mean);
    // d/dlogits of the mean cross-entropy: (softmax − targets) / N.
    let probs = e.op("Exp", &[&log_probs], vec![]);
    let diff = e.sub(&probs, &targets);
    let grad = e.div(&diff, &batch);
    let predicted = argmax(logits, e);
    let correct = count_correct(&predicted, LABELS, e);
    LossValues { loss, seed: (logits.to_string(), grad), correct: Some(correct) }
}

/// Cross-entropy with a label per element of `[N, d1, …]` (logits `[N, K, d1, …]`), or an
/// ignored label: the mean over the counted labels, `Σ m·(−Σ_k t·log p) / max(Σ m, 1)`
/// where `m` is 0 at an ignored label. PyTorch's mean is NaN when every label is ignored;
/// here the loss and its gradient are 0, so one empty batch cannot end a run.
fn cross_entropy_per_label(
    logits: &str,
    rank: usize,
    smoothing: f64,
    ignore: Option<i64>,
    e: &mut Emitter,
) -> LossValues {
    let log_probs = log_softmax(logits, e);
    let classes = e.dim_size(logits, 1);
    let targets = smoothed_targets(logits, rank, &classes, smoothing, e);
    let weighted = e.mul(&targets, &log_probs);
    let per_label = e.reduce_sum(&weighted, &[1], false);
    let float = e.float;
    let (counted, mask) = match ignore {
        Some(ignored) => {
            let ignored = e.int_scalar(ignored);
            let hit = e.op("Equal", &[LABELS, &ignored], vec![]);
            let kept = e.op("Not", &[&hit], vec![]);
            let mask = e.cast(&kept, float);
            let count = e.op("ReduceSum", &[&mask], vec![("keepdims", Attribute::Int(0))]);
            let one = e.scalar(1.0);
            (e.op("Max", &[&count, &one], vec![]), Some((kept, mask)))
        }
        None => (e.numel(LABELS), None),
    };
    let kept_loss = match &mask {
        Some((_, m)) => e.mul(&per_label, m),
        None => per_label,
    };
    let total = e.op("ReduceSum", &[&kept_loss], vec![("keepdims", Attribute::Int(0))]);
    let mean = e.div(&total, &counted);
    let loss = e.neg(&mean);
    // d/dlogits: (softmax − targets)·m / Σ m, m broadcast along the classes.
    let probs = e.op("Exp", &[&log_probs], vec![]);
    let diff = e.sub(&probs, &targets);
    let masked = match &mask {
        Some((_, m)) => {
            let along = e.unsqueeze(m, &[1]);
            e.mul(&diff, &along)
        }
        None => diff,
    };
    let grad = e.div(&masked, &counted);
    // Correct labels over the counted ones, in samples (see `LossValues::correct`).
    let predicted = argmax(logits, e);
    let mut hit = e.op("Equal", &[&predicted, LABELS], vec![]);
    if let Some((kept, _)) = &mask {
        hit = e.op("And", &[&hit, kept], vec![]);
    }
    let hits = e.cast(&hit, float);
    let right = e.op("ReduceSum", &[&hits], vec![("keepdims", Attribute::Int(0))]);
    let share = e.div(&right, &counted);
    let batch = e.dim_size(logits, 0);
    let correct = e.mul(&share, &batch);
    LossValues { loss, seed: (logits.to_string(), grad), correct: Some(correct) }
}

fn mean_squared_error(output: &str, e: &mut Emitter) -> LossValues {
    let diff = e.sub(output, LABELS);
    let squared = e.mul(&diff, &diff);
    let total = e.op("ReduceSum", &[&squared], vec![("keepdims", Attribute::Int(0))]);
    let count = e.numel(output);
    let loss = e.div(&total, &count);
    let twice = e.scale(&diff, 2.0);
    let grad = e.div(&twice, &count);
    let predicted = argmax(output, e);
    let target = argmax(LABELS, e);
    let correct = count_correct(&predicted, &target, e);
    LossValues { loss, seed: (output.to_string(), grad), correct: Some(correct) }
}
