//! The IDX format of MNIST and Fashion-MNIST (optionally gzip-compressed).

use crate::{DataError, ImageDataset};
use std::io::Read;
use std::path::Path;

/// Reads an IDX file of unsigned bytes: returns its dimensions and data.
pub fn read_idx(path: &Path) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let raw = std::fs::read(path).map_err(|error| DataError::Io { path: path.into(), error })?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| DataError::Format { path: path.into(), message: format!("bad gzip data: {e}") })?;
        out
    } else {
        raw
    };
    let fail = |message: String| DataError::Format { path: path.into(), message };
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err(fail("not an IDX file (bad magic number)".into()));
    }
    if bytes[2] != 0x08 {
        return Err(fail(format!("IDX element type 0x{:02x} is not unsigned bytes", bytes[2])));
    }
    let rank = bytes[3] as usize;
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(fail("truncated IDX header".into()));
    }
    let dims: Vec<usize> =
        (0..rank).map(|k| u32::from_be_bytes(bytes[4 + 4 * k..8 + 4 * k].try_into().unwrap()) as usize).collect();
    let count =
        dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| fail("dimensions overflow".into()))?;
    if bytes.len() - header != count {
        return Err(fail(format!(
            "IDX dimensions {dims:?} need {count} bytes of data, the file has {}",
            bytes.len() - header
        )));
    }
    Ok((dims, bytes[header..].to_vec()))
}

/// Reads an images file (`N×H×W`) and its labels file (`N`) into a dataset.
pub fn read_idx_dataset(images: &Path, labels_path: &Path) -> Result<ImageDataset, DataError> {
    let (dims, pixels) = read_idx(images)?;
    let [n, height, width] = dims[..] else {
        return Err(DataError::Format {
            path: images.into(), message: format!("images must be N×H×W, got {dims:?}")
        });
    };
    let (label_dims, labels) = read_idx(labels_path)?;
    if label_dims != [n] {
        return Err(DataError::Format {
            path: labels_path.into(),
            message: format!("{n} images need {n} labels, the file has shape {label_dims:?}"),
        });
    }
    Ok(ImageDataset { channels: 1, height, width, pixels, labels, pixel_labels: None })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut out = vec![0, 0, 8, dims.len() as u8];
        for d in dims {
            out.extend(d.to_be_bytes());
        }
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn plain_and_gzipped_files_read_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let pixels: Vec<u8> = (0..2 * 3 * 4).map(|i| i as u8).collect();
        std::fs::write(dir.path().join("images"), idx(&[2, 3, 4], &pixels)).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&idx(&[2], &[7, 9])).unwrap();
        std::fs::write(dir.path().join("labels.gz"), gz.finish().unwrap()).unwrap();
        let ds = read_idx_dataset(&dir.path().join("images"), &dir.path().join("labels.gz")).unwrap();
        assert_eq!((ds.len(), ds.height, ds.width), (2, 3, 4));
        assert_eq!(ds.image(1), &pixels[12..]);
        assert_eq!(ds.labels, [7, 9]);
    }

    #[test]
    fn bad_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short");
        std::fs::write(&path, idx(&[2, 3], &[1, 2, 3])).unwrap();
        let err = read_idx(&path).unwrap_err().to_string();
        assert!(err.contains("short") && err.contains("need 6 bytes"), "{err}");
        std::fs::write(&path, b"hello").unwrap();
        assert!(read_idx(&path).unwrap_err().to_string().contains("bad magic"));
    }
}
