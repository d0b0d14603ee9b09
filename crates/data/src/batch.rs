//! Batches: samples gathered by index into plain tensors (f32 images normalised per
//! channel, i64 token ids) with i64 labels.

use crate::augment::{Augmentation, augment, augment_filled};
use crate::text::TextDataset;
use crate::{DataError, ImageDataset};

/// Per-channel normalisation of image pixels: `x = (p / 255 - mean[c]) / std[c]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalization {
    /// The mean of `p / 255` per channel.
    pub mean: Vec<f32>,
    /// The standard deviation of `p / 255` per channel.
    pub std: Vec<f32>,
}

impl Normalization {
    /// The statistics of a dataset's pixels (use the training split's for every split).
    ///
    /// For each channel, over all images and positions: the mean of `p / 255` and its
    /// population standard deviation (dividing by the count N, not N − 1; for 47 million
    /// pixels the two agree to 8 digits), computed exactly from a histogram in f64 and
    /// then rounded to f32. A channel without pixels gets mean 0 and a constant channel
    /// standard deviation 1, so that normalisation stays finite.
    pub fn from_images(ds: &ImageDataset) -> Normalization {
        let plane = ds.height * ds.width;
        let mut hist = vec![[0u64; 256]; ds.channels];
        if plane > 0 {
            for (k, chunk) in ds.pixels.chunks(plane).enumerate() {
                let h = &mut hist[k % ds.channels];
                for &p in chunk {
                    h[p as usize] += 1;
                }
            }
        }
        let (mut mean, mut std) = (Vec::new(), Vec::new());
        for h in &hist {
            let n: u64 = h.iter().sum();
            if n == 0 {
                mean.push(0.0);
                std.push(1.0);
                continue;
            }
            let m = h.iter().enumerate().map(|(v, &c)| c as f64 * v as f64 / 255.0).sum::<f64>() / n as f64;
            let var =
                h.iter().enumerate().map(|(v, &c)| c as f64 * (v as f64 / 255.0 - m).powi(2)).sum::<f64>() / n as f64;
            mean.push(m as f32);
            std.push(if var > 0.0 { var.sqrt() as f32 } else { 1.0 });
        }
        Normalization { mean, std }
    }

    /// Normalises one pixel of channel `c`.
    fn apply(&self, c: usize, p: u8) -> f32 {
        (p as f32 / 255.0 - self.mean[c]) / self.std[c]
    }
}

/// The samples of one split.
#[derive(Debug, Clone, PartialEq)]
pub enum Samples {
    /// Images, with the normalisation that batches apply (the training split's statistics,
    /// for the test split too).
    Images {
        /// The images.
        data: ImageDataset,
        /// The per-channel normalisation.
        normalization: Normalization,
        /// Batches laid out `[batch, height, width, channels]` (a model from Keras or
        /// TensorFlow, converted by tf2onnx, takes its images channels last) instead of
        /// `[batch, channels, height, width]`.
        channels_last: bool,
    },
    /// Token sequences.
    Text(TextDataset),
}

/// The input tensor of a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Inputs {
    /// Normalised images.
    F32(Vec<f32>),
    /// Token ids.
    I64(Vec<i64>),
}

impl Inputs {
    /// The values if they are f32.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            Inputs::F32(v) => Some(v),
            Inputs::I64(_) => None,
        }
    }

    /// The values if they are i64.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match self {
            Inputs::I64(v) => Some(v),
            Inputs::F32(_) => None,
        }
    }
}

/// A batch of samples, ready to become tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The sample indices, in batch order.
    pub indices: Vec<usize>,
    /// The input shape: `[batch, channels, height, width]` or `[batch, seq_len]`.
    pub shape: Vec<usize>,
    /// The inputs, row-major in `shape`.
    pub inputs: Inputs,
    /// The labels, row-major in `[batch] + label_dims`: one per sample, or one per pixel
    /// of a segmentation dataset.
    pub labels: Vec<i64>,
    /// The shape of one sample's labels: `[]` (a class), or `[height, width]`.
    pub label_dims: Vec<usize>,
}

impl Batch {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether the batch has no samples.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
}

impl Samples {
    /// Images that batches normalise with `normalization` (the training split's statistics).
    pub fn images(data: ImageDataset, normalization: Normalization) -> Samples {
        Samples::Images { data, normalization, channels_last: false }
    }

    /// The same samples, images batched channels last (`[batch, H, W, C]`); text as it is.
    pub fn channels_last(self) -> Samples {
        match self {
            Samples::Images { data, normalization, .. } => Samples::Images { data, normalization, channels_last: true },
            text => text,
        }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels().len()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shape of one sample's labels: `[]`, or `[height, width]` for a segmentation
    /// dataset (whichever way its images are batched).
    pub fn label_dims(&self) -> Vec<usize> {
        match self {
            Samples::Images { data, .. } if data.pixel_labels.is_some() => vec![data.height, data.width],
            _ => vec![],
        }
    }

    /// One label per sample (a segmentation dataset's images keep their class here).
    pub fn labels(&self) -> &[u8] {
        match self {
            Samples::Images { data, .. } => &data.labels,
            Samples::Text(t) => &t.labels,
        }
    }

    /// The shape of one sample: `[channels, height, width]` (`[height, width, channels]`
    /// channels last) or `[seq_len]`.
    pub fn sample_shape(&self) -> Vec<usize> {
        match self {
            Samples::Images { data, channels_last: false, .. } => vec![data.channels, data.height, data.width],
            Samples::Images { data, channels_last: true, .. } => vec![data.height, data.width, data.channels],
            Samples::Text(t) => vec![t.seq_len],
        }
    }

    /// The batch of the samples `indices`, in that order.
    ///
    /// Images become f32 `(p / 255 - mean[c]) / std[c]` of shape `[batch, C, H, W]` (or
    /// `[batch, H, W, C]`, channels last),
    /// augmented first (if `augmentation` is given) as a pure function of (`seed`,
    /// `epoch`, sample index): pass an augmentation for training batches only. Texts
    /// become i64 token ids `[batch, seq_len]` and ignore augmentation. Labels are i64.
    /// An index out of range is an error.
    pub fn batch(
        &self,
        indices: &[usize],
        augmentation: Option<&Augmentation>,
        seed: u64,
        epoch: u64,
    ) -> Result<Batch, DataError> {
        self.check(indices)?;
        Ok(self.batch_unchecked(indices, augmentation, seed, epoch))
    }

    /// Checks that every index is in range.
    pub(crate) fn check(&self, indices: &[usize]) -> Result<(), DataError> {
        let n = self.len();
        match indices.iter().find(|&&i| i >= n) {
            Some(i) => Err(DataError::Invalid(format!("sample index {i} is out of range for {n} samples"))),
            None => Ok(()),
        }
    }

    /// [`Samples::batch`] for indices already checked.
    pub(crate) fn batch_unchecked(
        &self,
        indices: &[usize],
        augmentation: Option<&Augmentation>,
        seed: u64,
        epoch: u64,
    ) -> Batch {
        let labels = match self {
            Samples::Images { data: data @ ImageDataset { pixel_labels: Some(pixels), .. }, .. } => {
                let plane = data.height * data.width;
                let mut labels = Vec::with_capacity(indices.len() * plane);
                for &i in indices {
                    let mask = &pixels.labels[i * plane..(i + 1) * plane];
                    match augmentation {
                        // The image's crop and flip, with its arguments.
                        Some(aug) if !aug.is_identity() => {
                            let dims = (1, data.height, data.width);
                            let moved = augment_filled(mask, dims, aug, seed, epoch, i as u64, pixels.outside);
                            labels.extend(moved.iter().map(|&l| l as i64));
                        }
                        _ => labels.extend(mask.iter().map(|&l| l as i64)),
                    }
                }
                labels
            }
            _ => indices.iter().map(|&i| self.labels()[i] as i64).collect(),
        };
        let mut shape = vec![indices.len()];
        shape.extend(self.sample_shape());
        let inputs = match self {
            Samples::Images { data, normalization, channels_last } => {
                let dims = (data.channels, data.height, data.width);
                let plane = data.height * data.width;
                let mut out = Vec::with_capacity(indices.len() * data.image_size());
                for &i in indices {
                    let augmented;
                    let image = match augmentation {
                        Some(aug) if !aug.is_identity() => {
                            augmented = augment(data.image(i), dims, aug, seed, epoch, i as u64);
                            &augmented[..]
                        }
                        _ => data.image(i),
                    };
                    if *channels_last {
                        for at in 0..plane {
                            out.extend((0..data.channels).map(|c| normalization.apply(c, image[c * plane + at])));
                        }
                    } else {
                        for (c, channel) in image.chunks(plane.max(1)).enumerate() {
                            out.extend(channel.iter().map(|&p| normalization.apply(c, p)));
                        }
                    }
                }
                Inputs::F32(out)
            }
            Samples::Text(t) => Inputs::I64(indices.iter().flat_map(|&i| t.sequence(i).iter().copied()).collect()),
        };
        Batch { indices: indices.to_vec(), shape, inputs, labels, label_dims: self.label_dims() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation_matches_a_hand_computation() {
        // Two 2-channel 1×2 images. Channel 0 holds 0, 255, 51, 102 -> p/255 = 0, 1, 0.2, 0.4:
        // mean 0.4, variance (0.16 + 0.36 + 0.04 + 0) / 4 = 0.14. Channel 1 is constant.
        let data = ImageDataset {
            channels: 2,
            height: 1,
            width: 2,
            pixels: vec![0, 255, 7, 7, 51, 102, 7, 7],
            labels: vec![3, 1],
            pixel_labels: None,
        };
        let norm = Normalization::from_images(&data);
        assert!((norm.mean[0] - 0.4).abs() < 1e-7 && (norm.std[0] - 0.14f32.sqrt()).abs() < 1e-7, "{norm:?}");
        assert!((norm.mean[1] - 7.0 / 255.0).abs() < 1e-8 && norm.std[1] == 1.0, "{norm:?}");

        let samples = Samples::images(data, norm);
        let batch = samples.batch(&[1, 0], None, 0, 0).unwrap();
        assert_eq!((batch.shape.as_slice(), batch.labels.as_slice()), ([2, 2, 1, 2].as_slice(), [1, 3].as_slice()));
        let s = 0.14f32.sqrt();
        let want = [(0.2 - 0.4) / s, 0.0, 0.0, 0.0, -0.4 / s, (1.0 - 0.4) / s, 0.0, 0.0];
        let got = batch.inputs.as_f32().unwrap();
        assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-6), "{got:?}");
        assert!(samples.batch(&[2], None, 0, 0).unwrap_err().to_string().contains("out of range"));
    }

    #[test]
    fn channels_last_batches_are_the_transpose_of_channels_first() {
        // Two 3-channel 2×2 images with distinct pixels.
        let data = ImageDataset {
            channels: 3,
            height: 2,
            width: 2,
            pixels: (0..24).map(|p| p * 10).collect(),
            labels: vec![0, 1],
            pixel_labels: None,
        };
        let norm = Normalization::from_images(&data);
        let first = Samples::images(data.clone(), norm.clone()).batch(&[1, 0], None, 0, 0).unwrap();
        let last = Samples::images(data, norm).channels_last().batch(&[1, 0], None, 0, 0).unwrap();
        assert_eq!(last.shape, vec![2, 2, 2, 3]);
        let (f, l) = (first.inputs.as_f32().unwrap(), last.inputs.as_f32().unwrap());
        for (n, y, x, c) in
            (0..2).flat_map(|n| (0..2).flat_map(move |y| (0..2).flat_map(move |x| (0..3).map(move |c| (n, y, x, c)))))
        {
            assert_eq!(l[((n * 2 + y) * 2 + x) * 3 + c], f[((n * 3 + c) * 2 + y) * 2 + x], "({n}, {y}, {x}, {c})");
        }
    }

    #[test]
    fn segmentation_batches_carry_a_label_per_pixel_augmented_with_the_image() {
        // Two 1-channel 2×3 images: lit pixels (≥ 100) take the image's class, dark ones
        // (0) 10, faint ones between 255.
        let data = ImageDataset {
            channels: 1,
            height: 2,
            width: 3,
            pixels: vec![0, 150, 99, 100, 0, 255, 255, 0, 0, 0, 0, 120],
            labels: vec![4, 7],
            pixel_labels: None,
        }
        .segmented(100, 10, 255);
        let norm = Normalization { mean: vec![0.0], std: vec![1.0] };
        let samples = Samples::images(data, norm);
        assert_eq!(samples.label_dims(), [2, 3]);
        let batch = samples.batch(&[1, 0], None, 0, 0).unwrap();
        assert_eq!(batch.label_dims, [2, 3]);
        assert_eq!(batch.labels, [7, 10, 10, 10, 10, 7, 10, 4, 255, 4, 10, 4]);
        // Augmented, each label stays with its pixel: lit ⇔ labelled with the class.
        let aug = Augmentation { crop_padding: 1, horizontal_flip: true };
        for epoch in 0..12 {
            let b = samples.batch(&[0, 1], Some(&aug), 3, epoch).unwrap();
            let pixels = b.inputs.as_f32().unwrap();
            for (k, (&p, &l)) in pixels.iter().zip(&b.labels).enumerate() {
                let class = if k < 6 { 4 } else { 7 };
                let want = match p * 255.0 {
                    p if p >= 99.5 => class,
                    p if p < 0.5 => 10,
                    _ => 255,
                };
                assert_eq!(l, want, "epoch {epoch}, pixel {k}");
            }
        }
        // Channels last: the labels keep their [height, width] shape.
        let last = samples.clone().channels_last().batch(&[0], None, 0, 0).unwrap();
        assert_eq!((last.label_dims.as_slice(), last.labels.len()), ([2, 3].as_slice(), 6));
    }

    #[test]
    fn augmentation_applies_before_normalisation_and_text_batches_gather_rows() {
        let data = ImageDataset {
            channels: 1,
            height: 1,
            width: 4,
            pixels: vec![0, 51, 102, 153],
            labels: vec![0],
            pixel_labels: None,
        };
        let norm = Normalization { mean: vec![0.0], std: vec![1.0] };
        let samples = Samples::images(data.clone(), norm);
        let aug = Augmentation { crop_padding: 0, horizontal_flip: true };
        for epoch in 0..8 {
            let batch = samples.batch(&[0], Some(&aug), 5, epoch).unwrap();
            let want: Vec<f32> =
                augment(&data.pixels, (1, 1, 4), &aug, 5, epoch, 0).iter().map(|&p| p as f32 / 255.0).collect();
            assert_eq!(batch.inputs.as_f32().unwrap(), want);
        }

        let text = Samples::Text(TextDataset { seq_len: 2, tokens: vec![5, 6, 7, 0], labels: vec![1, 0] });
        let batch = text.batch(&[1, 0, 1], Some(&aug), 0, 0).unwrap();
        assert_eq!(batch.shape, [3, 2]);
        assert_eq!(batch.inputs, Inputs::I64(vec![7, 0, 5, 6, 7, 0]));
        assert_eq!(batch.labels, [0, 1, 0]);
    }
}
