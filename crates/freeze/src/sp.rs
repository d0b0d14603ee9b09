//! The similarity-preserving (SP) loss: how differently two models arrange a batch.
//!
//! Flatten a layer's activations to `A` (batch `b` × features), form the `b × b` Gram
//! matrix `G = A·Aᵀ`, L2-normalise each row, and take `‖Ĝ_train − Ĝ_ref‖²_F / b²`. The
//! Gram matrix compares how the batch's samples relate to each other, not the features
//! themselves, so the measure tolerates the reference model's quantization error, a
//! global scale, and even a different feature width.

use crate::error::{FreezeError, Result};

/// The SP loss between a training and a reference activation of the same `batch`
/// samples (each flattened in sample-major order; their feature counts may differ).
/// Computed in f64. A sample whose activation is all zeros has a zero Gram row.
pub fn sp_loss(train: &[f32], reference: &[f32], batch: usize) -> Result<f64> {
    Gram::of(train, batch, "training")?.sp(&Gram::of(reference, batch, "reference")?)
}

/// The row-normalised Gram matrix of a batch's activations: what the SP loss compares.
/// The reference model's side is the same at every measurement until it is rebuilt, so
/// the runner keeps its Gram matrices rather than recomputing them.
#[derive(Debug, Clone, PartialEq)]
pub struct Gram {
    batch: usize,
    /// Row-major `batch × batch`.
    values: Vec<f64>,
}

impl Gram {
    /// The row-normalised Gram matrix of `batch` flattened samples (`what` names them in
    /// the error when `values` is not a whole number of samples).
    pub fn of(values: &[f32], batch: usize, what: &str) -> Result<Gram> {
        if batch == 0 || values.is_empty() || !values.len().is_multiple_of(batch) {
            return Err(FreezeError::Shape(format!(
                "the {what} activation has {} elements, which is not a whole number of samples for a batch of {batch}",
                values.len()
            )));
        }
        let features = values.len() / batch;
        let rows: Vec<Vec<f64>> =
            values.chunks_exact(features).map(|r| r.iter().map(|&x| f64::from(x)).collect()).collect();
        let mut gram = vec![0.0f64; batch * batch];
        for i in 0..batch {
            for j in i..batch {
                let d = dot(&rows[i], &rows[j]);
                gram[i * batch + j] = d;
                gram[j * batch + i] = d;
            }
        }
        for row in gram.chunks_exact_mut(batch) {
            let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
            if norm > 0.0 {
                row.iter_mut().for_each(|x| *x /= norm);
            }
        }
        Ok(Gram { batch, values: gram })
    }

    /// The SP loss between this (training) Gram matrix and a reference one of the same
    /// batch: `‖Ĝ_train − Ĝ_ref‖²_F / b²`.
    pub fn sp(&self, reference: &Gram) -> Result<f64> {
        if self.batch != reference.batch {
            return Err(FreezeError::Shape(format!(
                "a batch of {} samples compared with a reference of {}",
                self.batch, reference.batch
            )));
        }
        let sum: f64 = self.values.iter().zip(&reference.values).map(|(a, b)| (a - b) * (a - b)).sum();
        Ok(sum / (self.batch * self.batch) as f64)
    }
}

/// A dot product in four independent sums, which the compiler keeps in vector registers
/// (the Gram matrices of a probe are most of a measurement's arithmetic: 32 samples of a
/// 16×28×28 activation are 6.6 M products).
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0.0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for ((s, xi), yi) in acc.iter_mut().zip(x).zip(y) {
            *s += xi * yi;
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
        let mut z = seed;
        (0..n)
            .map(|_| {
                z = z.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((z >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    }

    #[test]
    fn identical_activations_have_zero_loss() {
        let a = pseudo_random(8 * 13, 1);
        assert_eq!(sp_loss(&a, &a, 8).unwrap(), 0.0);
    }

    #[test]
    fn loss_ignores_a_global_scale_and_the_feature_width() {
        let a = pseudo_random(6 * 10, 2);
        let scaled: Vec<f32> = a.iter().map(|x| x * 4.0).collect();
        // 4 is a power of two: the Gram matrix scales by exactly 16, rows normalise back.
        assert!(sp_loss(&a, &scaled, 6).unwrap() < 1e-28);
        // Duplicating every feature doubles the Gram matrix: same arrangement, other width.
        let wide: Vec<f32> = a.chunks(10).flat_map(|r| r.iter().chain(r.iter()).copied()).collect();
        assert!(sp_loss(&a, &wide, 6).unwrap() < 1e-28);
        let other = pseudo_random(6 * 10, 3);
        assert!(sp_loss(&a, &other, 6).unwrap() > 1e-3);
    }

    #[test]
    fn a_small_case_matches_the_hand_computation() {
        // A = I₂ → Ĝ = I; B = all ones → G = 2·ones, rows (1/√2, 1/√2).
        // ‖Ĝa − Ĝb‖² = 2(1 − 1/√2)² + 2·(1/2) = 4 − 2√2, over b² = 4: 1 − √2/2.
        let a = [1.0, 0.0, 0.0, 1.0];
        let b = [1.0, 1.0, 1.0, 1.0];
        let expected = 1.0 - std::f64::consts::SQRT_2 / 2.0;
        assert!((sp_loss(&a, &b, 2).unwrap() - expected).abs() < 1e-15);
        assert_eq!(sp_loss(&a, &b, 2).unwrap(), sp_loss(&b, &a, 2).unwrap());
    }

    #[test]
    fn mismatched_batches_are_errors() {
        assert!(sp_loss(&[1.0; 5], &[1.0; 4], 2).unwrap_err().to_string().contains("training"));
        assert!(sp_loss(&[1.0; 4], &[1.0; 5], 2).unwrap_err().to_string().contains("reference"));
        assert!(sp_loss(&[1.0; 4], &[1.0; 4], 0).is_err());
        let (two, four) = (Gram::of(&[1.0; 4], 2, "a").unwrap(), Gram::of(&[1.0; 4], 4, "b").unwrap());
        assert!(two.sp(&four).unwrap_err().to_string().contains("reference of 4"));
    }

    #[test]
    fn the_dot_product_in_four_sums_is_the_plain_one() {
        // Lengths around the four-wide chunks, with and without a remainder; integers, so
        // every order of summation is exact.
        for n in [1, 3, 4, 5, 8, 13] {
            let a: Vec<f64> = (0..n).map(|i| (i as f64) - 2.0).collect();
            let b: Vec<f64> = (0..n).map(|i| (3 * i % 7) as f64).collect();
            let plain: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert_eq!(dot(&a, &b), plain, "length {n}");
        }
    }
}
