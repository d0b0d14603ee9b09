//! Seeded shuffling and stateless augmentation: everything is a pure function of
//! (seed, epoch, sample index), so an epoch can be replayed and cached activations of a
//! frozen prefix stay valid whenever augmentation is off.

/// Augmentations applied to an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Augmentation {
    /// Random crop after zero padding by this many pixels (0: none).
    pub crop_padding: usize,
    /// Random horizontal flip.
    pub horizontal_flip: bool,
}

impl Augmentation {
    /// Whether the augmentation changes anything (if not, inputs are the same every epoch).
    pub fn is_identity(&self) -> bool {
        self.crop_padding == 0 && !self.horizontal_flip
    }
}

/// SplitMix64: a well-mixed 64-bit hash.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn key(seed: u64, epoch: u64, index: u64, salt: u64) -> u64 {
    mix(mix(mix(seed ^ salt) ^ epoch) ^ index)
}

/// The order of `n` samples in `epoch`: a Fisher–Yates shuffle driven by (seed, epoch).
pub fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (key(seed, epoch, i as u64, 0x5eed) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// Augments one `[channels, height, width]` image; a pure function of its arguments.
pub fn augment(
    image: &[u8],
    dims: (usize, usize, usize),
    aug: &Augmentation,
    seed: u64,
    epoch: u64,
    index: u64,
) -> Vec<u8> {
    augment_filled(image, dims, aug, seed, epoch, index, 0)
}

/// [`augment`] with the pixels a crop brings in from outside set to `fill`: the same crop
/// and flip, so a segmentation mask augmented with its image's arguments still fits it.
pub fn augment_filled(
    image: &[u8],
    (channels, height, width): (usize, usize, usize),
    aug: &Augmentation,
    seed: u64,
    epoch: u64,
    index: u64,
    fill: u8,
) -> Vec<u8> {
    if aug.is_identity() {
        return image.to_vec();
    }
    let r = key(seed, epoch, index, 0xa0_97);
    let p = aug.crop_padding as i64;
    let span = 2 * p as u64 + 1;
    let (dy, dx) = ((r % span) as i64 - p, ((r >> 16) % span) as i64 - p);
    let flip = aug.horizontal_flip && (r >> 40) & 1 == 1;
    let mut out = vec![fill; image.len()];
    for c in 0..channels {
        for y in 0..height {
            for x in 0..width {
                let sx = if flip { width - 1 - x } else { x } as i64 + dx;
                let sy = y as i64 + dy;
                if sy >= 0 && sx >= 0 && (sy as usize) < height && (sx as usize) < width {
                    out[(c * height + y) * width + x] = image[(c * height + sy as usize) * width + sx as usize];
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffles_are_permutations_replayable_and_differ_by_epoch() {
        let a = epoch_order(1000, 7, 0);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_eq!(a, epoch_order(1000, 7, 0));
        assert_ne!(a, epoch_order(1000, 7, 1));
        assert_ne!(a, epoch_order(1000, 8, 0));
    }

    #[test]
    fn augmentation_is_a_pure_function_of_seed_epoch_and_index() {
        let image: Vec<u8> = (0..3 * 8 * 8).map(|i| i as u8).collect();
        let aug = Augmentation { crop_padding: 2, horizontal_flip: true };
        let shape = (3, 8, 8);
        let a = augment(&image, shape, &aug, 1, 2, 3);
        assert_eq!(a, augment(&image, shape, &aug, 1, 2, 3));
        let variants: std::collections::HashSet<Vec<u8>> =
            (0..20).map(|e| augment(&image, shape, &aug, 1, e, 3)).collect();
        assert!(variants.len() > 5, "epochs draw different crops and flips");
        assert_eq!(augment(&image, shape, &Augmentation::default(), 1, 2, 3), image);
    }

    #[test]
    fn a_mask_augmented_with_its_image_arguments_moves_with_the_image() {
        // The mask labels each pixel 1 where the image is lit, else 0; outside pixels 9.
        let image: Vec<u8> = (0..8 * 8).map(|i| if (i * 7) % 5 < 2 { 200 } else { 0 }).collect();
        let mask: Vec<u8> = image.iter().map(|&p| u8::from(p > 0)).collect();
        let aug = Augmentation { crop_padding: 2, horizontal_flip: true };
        let mut filled = 0;
        for epoch in 0..16 {
            let a = augment(&image, (1, 8, 8), &aug, 5, epoch, 1);
            let m = augment_filled(&mask, (1, 8, 8), &aug, 5, epoch, 1, 9);
            for (p, l) in a.iter().zip(&m) {
                assert!(*l == 9 && *p == 0 || *l == u8::from(*p > 0), "pixel {p}, label {l}");
                filled += usize::from(*l == 9);
            }
        }
        assert!(filled > 0, "some crops bring in outside pixels");
    }

    #[test]
    fn flip_without_crop_mirrors_rows() {
        let image: Vec<u8> = (0..4).collect();
        let aug = Augmentation { crop_padding: 0, horizontal_flip: true };
        let flipped: Vec<Vec<u8>> = (0..32).map(|i| augment(&image, (1, 1, 4), &aug, 0, 0, i)).collect();
        assert!(flipped.contains(&vec![3, 2, 1, 0]) && flipped.contains(&image));
    }
}
