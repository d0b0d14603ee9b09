//! Training data: image datasets in memory, read from the IDX format (MNIST,
//! Fashion-MNIST, gzip or not) and the CIFAR-10 binary format, with seeded shuffling and
//! augmentation that is a pure function of (seed, epoch, sample), so that a cached
//! activation of a frozen prefix stays valid.

mod augment;
mod cifar;
mod idx;

pub use augment::{Augmentation, augment, epoch_order};
pub use cifar::read_cifar10;
pub use idx::{read_idx, read_idx_dataset};

use std::path::PathBuf;

/// Errors reading datasets; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating-system error.
        source: std::io::Error,
    },
    /// The file is not in the expected format.
    #[error("{}: {message}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
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

    /// The pixels of image `i`.
    pub fn image(&self, i: usize) -> &[u8] {
        let n = self.image_size();
        &self.pixels[i * n..(i + 1) * n]
    }
}
