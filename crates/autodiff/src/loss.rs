//! Losses: forward value, closed-form gradient with respect to the model output, and the
//! number of correct predictions.

use crate::emit::Emitter;
use edgefreeze_graph::DataType;
use edgefreeze_graph::ir::Attribute;

/// The training objective.
#[derive(Debug, Clone, PartialEq)]
pub enum Loss {
    /// Softmax cross-entropy of logits `[N, K]` against int64 class labels `[N]`, averaged
    /// over the batch, with optional label smoothing (as PyTorch's `label_smoothing`).
    CrossEntropy {
        /// Weight moved from the true class to the uniform distribution, in [0, 1).
        label_smoothing: f64,
    },
    /// Mean squared error of the output against float targets of the same shape,
    /// averaged over all elements.
    MeanSquaredError,
    /// The model's first output already is the scalar loss.
    Output,
}

/// Name of the labels (targets) input.
pub const LABELS: &str = "labels";

/// Values the loss adds.
pub struct LossValues {
    /// The scalar loss.
    pub loss: String,
    /// d loss / d output, the seed of the backward pass.
    pub seed: (String, String),
    /// Correct predictions in the batch (int64 scalar), for classification losses.
    pub correct: Option<String>,
}

/// Emits the loss of `output` against [`LABELS`].
pub fn emit_loss(loss: &Loss, output: &str, e: &mut Emitter) -> LossValues {
    e.set_prefix("loss");
    let values = match loss {
        Loss::CrossEntropy { label_smoothing } => cross_entropy(output, *label_smoothing, e),
        Loss::MeanSquaredError => mean_squared_error(output, e),
        Loss::Output => {
            let one = e.scalar(1.0);
            LossValues { loss: output.to_string(), seed: (output.to_string(), one), correct: None }
        }
    };
    e.set_prefix("");
    values
}

/// One-hot targets `[N, K]` (in the float type) of int64 labels for logits `[N, K]`,
/// smoothed: (1 − ε)·onehot + ε/K.
fn smoothed_targets(logits: &str, classes: &str, smoothing: f64, e: &mut Emitter) -> String {
    let zero = e.int_scalar(0);
    let one = e.int_scalar(1);
    let k_int = {
        let shape = e.shape_of(logits);
        let i = e.int_scalar(1);
        e.op("Gather", &[&shape, &i], vec![("axis", Attribute::Int(0))])
    };
    let range = e.op("Range", &[&zero, &k_int, &one], vec![]);
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
    let targets = smoothed_targets(logits, &classes, smoothing, e);
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
