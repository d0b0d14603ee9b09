//! A PNG writer for the plots: 8-bit RGB, one IDAT chunk, every scanline unfiltered.
//!
//! plotters draws into an RGB buffer; encoding that buffer is all a plot needs, and doing it
//! here with `flate2` (already a dependency, for the datasets) instead of through plotters'
//! `bitmap_encoder` feature keeps the `image` crate and its codecs out of the build.

use flate2::write::ZlibEncoder;
use flate2::{Compression, Crc};
use std::io::{self, Write};

const SIGNATURE: &[u8; 8] = b"\x89PNG\r\n\x1a\n";

/// Encodes `rgb` (row-major, 3 bytes per pixel, no padding) as a PNG.
pub fn encode_rgb(width: u32, height: u32, rgb: &[u8]) -> io::Result<Vec<u8>> {
    let row = width as usize * 3;
    if width == 0 || height == 0 || rgb.len() != row * height as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} bytes is not a {width}x{height} RGB image", rgb.len()),
        ));
    }
    let mut png = SIGNATURE.to_vec();
    let mut header = Vec::with_capacity(13);
    header.extend_from_slice(&width.to_be_bytes());
    header.extend_from_slice(&height.to_be_bytes());
    // Bit depth 8, colour type 2 (truecolour), deflate, adaptive filtering, no interlace.
    header.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut png, b"IHDR", &header);
    let mut zlib = ZlibEncoder::new(Vec::with_capacity(rgb.len() / 8), Compression::default());
    for line in rgb.chunks_exact(row) {
        // Filter type 0 (None): plots are mostly flat colour, which deflate packs well as is.
        zlib.write_all(&[0])?;
        zlib.write_all(line)?;
    }
    chunk(&mut png, b"IDAT", &zlib.finish()?);
    chunk(&mut png, b"IEND", &[]);
    Ok(png)
}

/// Appends one chunk: big-endian length, type, data, and the CRC-32 of type and data.
fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let mut crc = Crc::new();
    crc.update(kind);
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::read::ZlibDecoder;
    use std::io::Read;

    /// CRC-32 (ISO-HDLC, as PNG uses), bit by bit: independent of flate2's table-driven one.
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= b as u32;
            for _ in 0..8 {
                crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
            }
        }
        !crc
    }

    /// Splits a PNG into its chunks, checking every length and CRC on the way.
    fn chunks(png: &[u8]) -> Vec<([u8; 4], Vec<u8>)> {
        assert_eq!(&png[..8], SIGNATURE);
        let mut at = 8;
        let mut out = Vec::new();
        while at < png.len() {
            let len = u32::from_be_bytes(png[at..at + 4].try_into().unwrap()) as usize;
            let kind: [u8; 4] = png[at + 4..at + 8].try_into().unwrap();
            let data = png[at + 8..at + 8 + len].to_vec();
            let crc = u32::from_be_bytes(png[at + 8 + len..at + 12 + len].try_into().unwrap());
            assert_eq!(crc, crc32(&png[at + 4..at + 8 + len]), "CRC of {}", String::from_utf8_lossy(&kind));
            out.push((kind, data));
            at += 12 + len;
        }
        assert_eq!(at, png.len(), "trailing bytes");
        out
    }

    #[test]
    fn the_crc_is_the_standard_one() {
        // The check value of CRC-32/ISO-HDLC, and the CRC every PNG's IEND chunk carries.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b"IEND"), 0xAE42_6082);
    }

    #[test]
    fn an_image_round_trips_through_its_chunks() {
        let (w, h) = (5u32, 3u32);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect();
        let png = encode_rgb(w, h, &rgb).unwrap();
        let chunks = chunks(&png);
        let kinds: Vec<&[u8; 4]> = chunks.iter().map(|c| &c.0).collect();
        assert_eq!(kinds, [b"IHDR", b"IDAT", b"IEND"]);
        assert_eq!(chunks[0].1, [0, 0, 0, 5, 0, 0, 0, 3, 8, 2, 0, 0, 0]);
        let mut raw = Vec::new();
        ZlibDecoder::new(&chunks[1].1[..]).read_to_end(&mut raw).unwrap();
        assert_eq!(raw.len(), (1 + w as usize * 3) * h as usize);
        for (y, line) in raw.chunks_exact(1 + w as usize * 3).enumerate() {
            assert_eq!(line[0], 0, "row {y} filter");
            assert_eq!(&line[1..], &rgb[y * w as usize * 3..(y + 1) * w as usize * 3], "row {y}");
        }
        assert!(chunks[2].1.is_empty());
    }

    #[test]
    fn a_buffer_of_the_wrong_size_is_an_error() {
        let e = encode_rgb(4, 4, &[0; 47]).unwrap_err();
        assert!(e.to_string().contains("47 bytes is not a 4x4 RGB image"), "{e}");
        assert!(encode_rgb(0, 4, &[]).is_err());
    }
}
