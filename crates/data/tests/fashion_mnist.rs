//! Real data: Fashion-MNIST as Debian's `dataset-fashion-mnist` package installs it
//! (`.ci/run` installs it). Without it the test skips with a message, unless
//! EDGEFREEZE_REQUIRE_DATA is set (as CI does), which makes it fail.

use edgefreeze_data::read_idx_dataset;
use std::path::Path;

const DIR: &str = "/usr/share/datasets/fashion-mnist";

#[test]
fn fashion_mnist_reads_with_its_known_sizes_and_class_balance() {
    let dir = Path::new(DIR);
    if !dir.is_dir() {
        assert!(
            !std::env::var("EDGEFREEZE_REQUIRE_DATA").is_ok_and(|v| !v.is_empty() && v != "0"),
            "{DIR} is missing: apt-get install -y dataset-fashion-mnist"
        );
        eprintln!("skipping: {DIR} is missing (apt-get install -y dataset-fashion-mnist)");
        return;
    }
    let train =
        read_idx_dataset(&dir.join("train-images-idx3-ubyte.gz"), &dir.join("train-labels-idx1-ubyte.gz")).unwrap();
    let test =
        read_idx_dataset(&dir.join("t10k-images-idx3-ubyte.gz"), &dir.join("t10k-labels-idx1-ubyte.gz")).unwrap();
    assert_eq!((train.len(), test.len()), (60_000, 10_000));
    assert_eq!((train.channels, train.height, train.width), (1, 28, 28));
    // Fashion-MNIST is balanced: 6,000 training and 1,000 test images per class.
    for (ds, per_class) in [(&train, 6_000), (&test, 1_000)] {
        let mut counts = [0usize; 10];
        for &l in &ds.labels {
            counts[l as usize] += 1;
        }
        assert_eq!(counts, [per_class; 10]);
    }
    let mean = train.pixels.iter().map(|&p| p as f64).sum::<f64>() / train.pixels.len() as f64 / 255.0;
    assert!((mean - 0.286).abs() < 0.01, "mean pixel {mean:.4} (Fashion-MNIST's is 0.2860)");
}
