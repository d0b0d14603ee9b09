//! Typed errors of the training driver.

use std::path::PathBuf;

/// What can go wrong while training, checkpointing, exporting or benchmarking.
///
/// Each message is complete, its cause included, and no variant also returns that cause
/// from `source()` (the errors of the other crates are wrapped transparently): the
/// binary's `{:#}` prints each cause once.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Bad settings (a schedule that does not parse, a dataset that does not fit the model...).
    #[error("{0}")]
    Config(String),
    /// A file cannot be read or written.
    #[error("cannot {action} {}: {error}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating-system error (in the message, so not a `source()`).
        error: std::io::Error,
    },
    /// A checkpoint or run file is damaged or does not belong to this run.
    #[error("{}: {message}", path.display())]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The loss stopped being finite.
    #[error(
        "training diverged: the loss is {loss} at step {step} (epoch {epoch}); {}",
        match checkpoint {
            Some(p) => format!("the last good checkpoint is {}", p.display()),
            None => "there is no checkpoint yet".to_string(),
        }
    )]
    Diverged {
        /// The global step (1 for the first update) whose loss was not finite.
        step: u64,
        /// The epoch it was in (1-based).
        epoch: usize,
        /// The loss value.
        loss: f64,
        /// The last checkpoint written, kept unchanged.
        checkpoint: Option<PathBuf>,
    },
    /// Drawing a plot failed.
    #[error("cannot draw {}: {message}", path.display())]
    Plot {
        /// The image file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// From the engine.
    #[error(transparent)]
    Engine(#[from] edgefreeze_engine::EngineError),
    /// From graph loading or saving.
    #[error(transparent)]
    Graph(#[from] edgefreeze_graph::GraphError),
    /// From building the training graphs.
    #[error(transparent)]
    Autodiff(#[from] edgefreeze_autodiff::AutodiffError),
    /// From reading data.
    #[error(transparent)]
    Data(#[from] edgefreeze_data::DataError),
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, TrainError>;

/// An I/O error naming its file.
pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> TrainError {
    let path = path.into();
    move |error| TrainError::Io { action, path, error }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgefreeze_autodiff::AutodiffError;
    use edgefreeze_data::DataError;
    use edgefreeze_graph::GraphError;
    use std::error::Error;

    /// The messages of an error's `source()` chain, outermost first: what `anyhow`'s `{:#}`
    /// joins with ": ".
    fn chain(e: &dyn Error) -> Vec<String> {
        let mut messages = vec![e.to_string()];
        let mut next = e.source();
        while let Some(s) = next {
            messages.push(s.to_string());
            next = s.source();
        }
        messages
    }

    /// Asserts the chain prints `cause` exactly once and is `expected` in full.
    fn prints_once(e: &dyn Error, cause: &str, expected: &str) {
        let text = chain(e).join(": ");
        assert_eq!(text.matches(cause).count(), 1, "{cause:?} in {text:?}");
        assert_eq!(text, expected);
    }

    #[test]
    fn every_error_with_a_cause_prints_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.onnx");
        let os = std::fs::read(&missing).unwrap_err().to_string();
        let m = missing.display();

        // Graph: a file that cannot be read, and one that is not ONNX (the decoder's cause).
        let read = edgefreeze_graph::load_model(&missing).unwrap_err();
        assert!(matches!(read, GraphError::Io { .. }));
        prints_once(&read, &os, &format!("cannot read {m}: {os}"));
        let broken = dir.path().join("broken.onnx");
        std::fs::write(&broken, b"\x0a\xff\xff\xff").unwrap();
        let decode = edgefreeze_graph::load_model(&broken).unwrap_err();
        let GraphError::InFile { error, .. } = &decode else { panic!("{decode:?}") };
        let GraphError::Decode(cause) = error.as_ref() else { panic!("{error:?}") };
        let cause = cause.to_string();
        prints_once(
            &decode,
            &cause,
            &format!(
                "{}: not a valid ONNX model (protobuf decoding failed: {cause}); is the file truncated or not ONNX?",
                broken.display()
            ),
        );

        // The same causes wrapped by the training driver and the autodiff crate.
        let wrapped = TrainError::from(edgefreeze_graph::load_model(&missing).unwrap_err());
        prints_once(&wrapped, &os, &format!("cannot read {m}: {os}"));
        let twice = TrainError::from(AutodiffError::from(edgefreeze_graph::load_model(&missing).unwrap_err()));
        prints_once(&twice, &os, &format!("cannot read {m}: {os}"));
        let train = io("read", &missing)(std::fs::read(&missing).unwrap_err());
        prints_once(&train, &os, &format!("cannot read {m}: {os}"));

        // Data: a file that cannot be read, a loader thread that cannot start.
        let data = edgefreeze_data::read_idx(&missing).unwrap_err();
        assert!(matches!(data, DataError::Io { .. }));
        prints_once(&data, &os, &format!("cannot read {m}: {os}"));
        prints_once(&TrainError::from(data), &os, &format!("cannot read {m}: {os}"));
        let spawn = DataError::Spawn(std::io::Error::other("no threads left"));
        prints_once(&spawn, "no threads left", "cannot start the loader thread: no threads left");
    }
}
