//! The server's log: one line per event (a session opened or freed, a message
//! rejected), to standard error by default or to a sink the embedding program gives.

use std::sync::Arc;

/// Where log lines go.
#[derive(Clone)]
pub struct Log {
    sink: Arc<dyn Fn(&str) + Send + Sync>,
}

impl Log {
    /// Lines to standard error, prefixed `edge: `.
    pub fn stderr() -> Log {
        Log { sink: Arc::new(|line| eprintln!("edge: {line}")) }
    }

    /// Lines to a function (tests collect them).
    pub fn to(sink: impl Fn(&str) + Send + Sync + 'static) -> Log {
        Log { sink: Arc::new(sink) }
    }

    /// Writes a line.
    pub fn line(&self, line: impl AsRef<str>) {
        (self.sink)(line.as_ref());
    }
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Log")
    }
}
