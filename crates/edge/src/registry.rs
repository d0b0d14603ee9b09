//! The sessions of one server: lookup bound to the authenticated device, the session
//! limit, and freeing idle sessions.

use crate::session::{Command, SessionInfo, Shared};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::Status;

/// A live session as the calls see it.
pub(crate) struct Entry {
    pub info: SessionInfo,
    pub commands: mpsc::Sender<Command>,
    pub shared: Arc<Shared>,
}

/// What a server reports about one of its sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionReport {
    /// The session id.
    pub id: String,
    /// The device that opened it.
    pub device_id: String,
    /// The device's run id.
    pub run_id: String,
    /// Updates applied.
    pub step: u64,
    /// Bytes of edge state held (state tensors and gradient sums).
    pub state_bytes: u64,
}

#[derive(Default)]
struct Inner {
    sessions: HashMap<String, Arc<Entry>>,
    /// Sessions being built (they count against the limit already).
    opening: usize,
}

pub(crate) struct Registry {
    inner: Mutex<Inner>,
    max_sessions: usize,
}

/// A place among the server's sessions, held while one is built; given back on drop
/// unless the session was inserted.
pub(crate) struct Slot<'r> {
    registry: &'r Registry,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.registry.lock().opening -= 1;
    }
}

impl Registry {
    pub fn new(max_sessions: usize) -> Registry {
        Registry { inner: Mutex::new(Inner::default()), max_sessions }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere cannot leave the map half changed: every change is one call.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a place for a new session, or refuses when the server is full.
    pub fn reserve(&self) -> Result<Slot<'_>, Status> {
        let mut inner = self.lock();
        let used = inner.sessions.len() + inner.opening;
        if used >= self.max_sessions {
            return Err(Status::resource_exhausted(format!(
                "this edge server is full: {used} sessions of at most {} (--max-sessions); try another edge \
                 server or later (idle sessions are freed after the idle timeout)",
                self.max_sessions
            )));
        }
        inner.opening += 1;
        Ok(Slot { registry: self })
    }

    /// Adds a built session in its reserved place.
    pub fn insert(&self, slot: Slot<'_>, entry: Arc<Entry>) {
        let mut inner = self.lock();
        inner.sessions.insert(entry.info.id.clone(), entry);
        inner.opening -= 1;
        std::mem::forget(slot);
    }

    /// The session `id`, which must belong to `device`.
    pub fn get(&self, id: &str, device: &str) -> Result<Arc<Entry>, Status> {
        let inner = self.lock();
        let entry = inner.sessions.get(id).ok_or_else(|| {
            Status::not_found(format!("unknown session {id:?}: never opened, closed, or freed after being idle"))
        })?;
        if entry.info.device_id != device {
            return Err(Status::permission_denied(format!("session {id:?} belongs to another device")));
        }
        entry.shared.touch();
        Ok(entry.clone())
    }

    /// Removes a session; its thread ends after the commands already queued.
    pub fn remove(&self, id: &str) -> Option<Arc<Entry>> {
        self.lock().sessions.remove(id)
    }

    /// Removes the session of a device's run, if one is open (the device restarted it).
    pub fn remove_run(&self, device: &str, run: &str) -> Option<Arc<Entry>> {
        let mut inner = self.lock();
        let id = inner
            .sessions
            .values()
            .find(|e| e.info.device_id == device && e.info.run_id == run)
            .map(|e| e.info.id.clone())?;
        inner.sessions.remove(&id)
    }

    /// Removes and returns the sessions idle for longer than `timeout`.
    pub fn reap(&self, timeout: Duration) -> Vec<Arc<Entry>> {
        let mut inner = self.lock();
        let idle: Vec<String> =
            inner.sessions.values().filter(|e| e.shared.idle_for() > timeout).map(|e| e.info.id.clone()).collect();
        idle.iter().filter_map(|id| inner.sessions.remove(id)).collect()
    }

    pub fn reports(&self) -> Vec<SessionReport> {
        let inner = self.lock();
        let mut out: Vec<SessionReport> = inner
            .sessions
            .values()
            .map(|e| SessionReport {
                id: e.info.id.clone(),
                device_id: e.info.device_id.clone(),
                run_id: e.info.run_id.clone(),
                step: e.shared.step.load(std::sync::atomic::Ordering::Relaxed),
                state_bytes: e.shared.state_bytes.load(std::sync::atomic::Ordering::Relaxed),
            })
            .collect();
        out.sort_by(|a, b| (&a.device_id, &a.run_id).cmp(&(&b.device_id, &b.run_id)));
        out
    }
}
