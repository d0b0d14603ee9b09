//! The CIFAR-10 binary format: records of one label byte and 3×32×32 pixel bytes.

use crate::{DataError, ImageDataset};
use std::path::Path;

const SIDE: usize = 32;
const RECORD: usize = 1 + 3 * SIDE * SIDE;

/// Reads CIFAR-10 binary batch files (`data_batch_1.bin`...) into one dataset.
pub fn read_cifar10(files: &[&Path]) -> Result<ImageDataset, DataError> {
    let mut ds = ImageDataset {
        channels: 3,
        height: SIDE,
        width: SIDE,
        pixels: Vec::new(),
        labels: Vec::new(),
        pixel_labels: None,
    };
    for path in files {
        let bytes = std::fs::read(path).map_err(|error| DataError::Io { path: (*path).into(), error })?;
        if bytes.is_empty() || bytes.len() % RECORD != 0 {
            return Err(DataError::Format {
                path: (*path).into(),
                message: format!("{} bytes is not a whole number of {RECORD}-byte CIFAR-10 records", bytes.len()),
            });
        }
        for record in bytes.chunks_exact(RECORD) {
            if record[0] > 9 {
                return Err(DataError::Format {
                    path: (*path).into(),
                    message: format!("label {} is not 0–9", record[0]),
                });
            }
            ds.labels.push(record[0]);
            ds.pixels.extend_from_slice(&record[1..]);
        }
    }
    Ok(ds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_batches_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = Vec::new();
        for label in [3u8, 9] {
            bytes.push(label);
            bytes.extend((0..3 * SIDE * SIDE).map(|i| (i % 251) as u8 ^ label));
        }
        let path = dir.path().join("data_batch_1.bin");
        std::fs::write(&path, &bytes).unwrap();
        let ds = read_cifar10(&[&path]).unwrap();
        assert_eq!(ds.labels, [3, 9]);
        assert_eq!(ds.image(1), &bytes[RECORD + 1..]);
        std::fs::write(&path, &bytes[..RECORD + 5]).unwrap();
        assert!(read_cifar10(&[&path]).unwrap_err().to_string().contains("whole number"));
    }
}
