//! The activation cache: the frozen prefix's output for each training sample, computed
//! once and served to later epochs.
//!
//! A record is keyed by what determines the prefix's input — the sample index and an
//! augmentation key (0 when augmentation is off) — and the cache as a whole by the cut,
//! the model and a hash of the frozen parameters ([`CacheIdentity`]), so an activation
//! computed from another input or another prefix is never served. Records live in memory
//! up to a byte budget; the rest spill to one file, each with an FNV-64 checksum over its
//! key and bytes. A record whose checksum fails is reported and treated as a miss, so
//! the caller recomputes it. [`ActivationCache::persist`] writes the records held only in
//! memory to the file, so a resumed run finds everything the interrupted one had.
//!
//! File layout (little-endian): `EFCACHE1`, header length (u32), header JSON (the
//! identity), then records: sample (u64), augmentation key (u64), element count (u32),
//! the f32 values, checksum (u64).

use crate::error::{FreezeError, Result, cache_io};
use crate::hash::Fnv64;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"EFCACHE1";
/// The cache file inside the cache folder.
pub const CACHE_FILE: &str = "activations.bin";
const RECORD_OVERHEAD: u64 = 8 + 8 + 4 + 8;

/// What a cached activation was computed from, apart from the sample.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CacheIdentity {
    /// A fingerprint of the model (e.g. the hash of its inference graph bytes).
    pub model: u64,
    /// The layer after which the cut lies.
    pub cut: usize,
    /// Hash of the frozen parameters and running statistics.
    pub parameters: u64,
    /// Elements of one sample's activation.
    pub elements: usize,
}

/// The key of one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheKey {
    /// The training sample's index in its split.
    pub sample: u64,
    /// Which augmented variant (0: augmentation off).
    pub augmentation: u64,
}

/// Sizes and counters of a cache.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CacheStats {
    /// Records in memory.
    pub memory_records: usize,
    /// Bytes of activations in memory.
    pub memory_bytes: u64,
    /// Records in the file.
    pub disk_records: usize,
    /// Bytes of the file.
    pub disk_bytes: u64,
    /// Lookups served.
    pub hits: u64,
    /// Lookups not found.
    pub misses: u64,
    /// Records found damaged (and recomputed by the caller).
    pub corrupt: u64,
    /// Records not stored because the file reached its disk budget or could not be
    /// written (recomputed by the caller each time they are needed).
    #[serde(default)]
    pub refused: u64,
}

/// Why an existing cache file was not reused.
#[derive(Debug, Clone, PartialEq)]
pub enum Reopened {
    /// No file was there.
    Fresh,
    /// The file matched; this many records were found in it.
    Reused(usize),
    /// The file was for something else (another model, cut or parameters, or damaged);
    /// it was discarded and everything will be recomputed.
    Discarded(String),
}

/// The activation cache of one cut.
pub struct ActivationCache {
    path: PathBuf,
    identity: CacheIdentity,
    memory_budget: u64,
    memory: HashMap<CacheKey, Vec<f32>>,
    /// Records read ahead from the file by [`ActivationCache::warm`], checked, waiting to
    /// be served once (and dropped then).
    staged: HashMap<CacheKey, Vec<f32>>,
    /// The keys of the last read-ahead: kept staged through the next one, since the
    /// prefetcher reads batch t + 1 while batch t, read before, is being looked up.
    last_warmed: Vec<CacheKey>,
    /// Records held only in memory, not yet in the file.
    unsaved: Vec<CacheKey>,
    index: HashMap<CacheKey, u64>,
    file: File,
    end: u64,
    /// Bytes the file may grow to (u64::MAX: no budget).
    disk_budget: u64,
    /// Why records no longer go to the file, once they do not.
    stopped: Option<String>,
    stats: CacheStats,
}

impl ActivationCache {
    /// Opens (or creates) the cache in `dir` for `identity`, keeping at most
    /// `memory_budget` bytes of activations in memory. A file left for another identity
    /// is discarded, and the reason returned, so the caller can log the recompute.
    pub fn open(dir: &Path, identity: CacheIdentity, memory_budget: u64) -> Result<(ActivationCache, Reopened)> {
        if identity.elements == 0 {
            return Err(FreezeError::Cache("an activation of 0 elements cannot be cached".into()));
        }
        std::fs::create_dir_all(dir).map_err(cache_io("create the cache folder", dir))?;
        let path = dir.join(CACHE_FILE);
        let existed = path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(cache_io("open", &path))?;
        let mut cache = ActivationCache {
            path: path.clone(),
            identity,
            memory_budget,
            memory: HashMap::new(),
            staged: HashMap::new(),
            last_warmed: Vec::new(),
            unsaved: Vec::new(),
            index: HashMap::new(),
            file: file.try_clone().map_err(cache_io("open", &path))?,
            end: 0,
            disk_budget: u64::MAX,
            stopped: None,
            stats: CacheStats::default(),
        };
        let reopened = if existed {
            match cache.scan(&mut file) {
                Ok(n) => Reopened::Reused(n),
                Err(why) => {
                    cache.reset()?;
                    Reopened::Discarded(why)
                }
            }
        } else {
            cache.reset()?;
            Reopened::Fresh
        };
        Ok((cache, reopened))
    }

    /// Limits the file to `bytes` (None: no limit). Past it, records that do not fit in
    /// memory are not stored, and [`ActivationCache::stopped`] says why; the run goes on
    /// and recomputes them.
    pub fn with_disk_budget(mut self, bytes: Option<u64>) -> ActivationCache {
        self.disk_budget = bytes.unwrap_or(u64::MAX);
        self
    }

    /// Why the file takes no more records (its budget, or a failed write such as a full
    /// disk), if it does not.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// The identity records are valid for.
    pub fn identity(&self) -> &CacheIdentity {
        &self.identity
    }

    /// The cache file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the header and indexes the records; a damaged tail (an interrupted write) is cut off.
    fn scan(&mut self, file: &mut File) -> std::result::Result<usize, String> {
        let mut bytes = Vec::new();
        file.seek(SeekFrom::Start(0)).and_then(|_| file.read_to_end(&mut bytes)).map_err(|e| e.to_string())?;
        if bytes.len() < 12 || &bytes[..8] != MAGIC {
            return Err("not an edgefreeze activation cache".into());
        }
        let header_len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
        let header = bytes.get(12..12 + header_len).ok_or("its header is cut short")?;
        let found: CacheIdentity =
            serde_json::from_slice(header).map_err(|e| format!("its header is damaged ({e})"))?;
        if found != self.identity {
            let what = if found.model != self.identity.model {
                "another model"
            } else if found.cut != self.identity.cut {
                "another cut"
            } else if found.parameters != self.identity.parameters {
                "other frozen parameters"
            } else {
                "another activation size"
            };
            return Err(format!("it holds activations of {what} ({found:?}, wanted {:?})", self.identity));
        }
        let mut at = (12 + header_len) as u64;
        let record = self.record_len();
        while at + record <= bytes.len() as u64 {
            let p = at as usize;
            let sample = u64::from_le_bytes(bytes[p..p + 8].try_into().unwrap());
            let augmentation = u64::from_le_bytes(bytes[p + 8..p + 16].try_into().unwrap());
            let count = u32::from_le_bytes(bytes[p + 16..p + 20].try_into().unwrap()) as usize;
            if count != self.identity.elements {
                break;
            }
            self.index.insert(CacheKey { sample, augmentation }, at);
            at += record;
        }
        if at != bytes.len() as u64 {
            self.file.set_len(at).map_err(|e| e.to_string())?;
        }
        self.end = at;
        self.stats.disk_records = self.index.len();
        Ok(self.index.len())
    }

    fn record_len(&self) -> u64 {
        RECORD_OVERHEAD + 4 * self.identity.elements as u64
    }

    /// Empties the cache and starts a new file for the current identity.
    fn reset(&mut self) -> Result<()> {
        self.memory.clear();
        self.staged.clear();
        self.last_warmed.clear();
        self.unsaved.clear();
        self.index.clear();
        self.stopped = None;
        let header = serde_json::to_vec(&self.identity).expect("identity serialises");
        let mut bytes = MAGIC.to_vec();
        bytes.extend((header.len() as u32).to_le_bytes());
        bytes.extend(header);
        let io = cache_io("write", &self.path);
        self.file.set_len(0).map_err(io)?;
        self.file.write_all_at(&bytes, 0).map_err(cache_io("write", &self.path))?;
        self.end = bytes.len() as u64;
        let s = &mut self.stats;
        (s.memory_records, s.memory_bytes, s.disk_records) = (0, 0, 0);
        Ok(())
    }

    /// Drops every record and starts over for a new identity (the cut moved, the layers
    /// were unfrozen, or the frozen parameters changed).
    pub fn invalidate(&mut self, identity: CacheIdentity) -> Result<()> {
        self.identity = identity;
        self.reset()
    }

    /// The activation of `key`, if cached and intact. A damaged record counts as corrupt,
    /// is forgotten, and is a miss.
    pub fn get(&mut self, key: CacheKey) -> Result<Option<Vec<f32>>> {
        if let Some(v) = self.memory.get(&key) {
            self.stats.hits += 1;
            return Ok(Some(v.clone()));
        }
        if let Some(v) = self.staged.remove(&key) {
            self.stats.hits += 1;
            return Ok(Some(v));
        }
        match self.read_record(key)? {
            Some(v) => {
                self.stats.hits += 1;
                Ok(Some(v))
            }
            None => {
                self.stats.misses += 1;
                Ok(None)
            }
        }
    }

    /// Reads ahead the records of `keys` that are only in the file, checking each, so
    /// that [`ActivationCache::get`] serves them without touching the disk (what the
    /// prefetch thread calls for the next batch). A damaged record is counted as corrupt
    /// and forgotten here, as `get` would. Records staged by calls before the previous
    /// one and not served are dropped, so at most two batches are held.
    pub fn warm(&mut self, keys: &[CacheKey]) -> Result<()> {
        let previous = std::mem::replace(&mut self.last_warmed, keys.to_vec());
        self.staged.retain(|k, _| keys.contains(k) || previous.contains(k));
        for &key in keys {
            if self.memory.contains_key(&key) || self.staged.contains_key(&key) {
                continue;
            }
            if let Some(v) = self.read_record(key)? {
                self.staged.insert(key, v);
            }
        }
        Ok(())
    }

    /// The record of `key` from the file, if indexed and intact; a damaged one is
    /// counted as corrupt and forgotten.
    fn read_record(&mut self, key: CacheKey) -> Result<Option<Vec<f32>>> {
        let Some(&at) = self.index.get(&key) else {
            return Ok(None);
        };
        let mut bytes = vec![0u8; self.record_len() as usize];
        self.file.read_exact_at(&mut bytes, at).map_err(cache_io("read", &self.path))?;
        let body = bytes.len() - 8;
        let stored = u64::from_le_bytes(bytes[body..].try_into().unwrap());
        let mut h = Fnv64::default();
        h.write(&bytes[..body]);
        let sample = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        let augmentation = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
        if h.finish() != stored || (CacheKey { sample, augmentation }) != key {
            self.index.remove(&key);
            self.stats.corrupt += 1;
            self.stats.disk_records = self.index.len();
            return Ok(None);
        }
        Ok(Some(bytes[20..body].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()))
    }

    /// Stores the activation of `key`: in memory while the budget allows, else in the file.
    pub fn insert(&mut self, key: CacheKey, values: &[f32]) -> Result<()> {
        if values.len() != self.identity.elements {
            return Err(FreezeError::Cache(format!(
                "an activation of {} elements for sample {}, but the cache holds {} per sample",
                values.len(),
                key.sample,
                self.identity.elements
            )));
        }
        let bytes = 4 * values.len() as u64;
        if self.stats.memory_bytes + bytes <= self.memory_budget {
            if self.memory.insert(key, values.to_vec()).is_none() {
                self.stats.memory_bytes += bytes;
                self.stats.memory_records += 1;
            }
            self.index.remove(&key);
            self.staged.remove(&key);
            self.unsaved.push(key);
            return Ok(());
        }
        self.write_record(key, values)
    }

    /// Appends a record to the file; past the disk budget, or when the write fails (a
    /// full disk), the record is refused and the file takes no more: the caller
    /// recomputes such activations, and the run never fails for want of cache space.
    fn write_record(&mut self, key: CacheKey, values: &[f32]) -> Result<()> {
        if self.stopped.is_some() {
            self.stats.refused += 1;
            return Ok(());
        }
        if self.end.saturating_add(self.record_len()) > self.disk_budget {
            self.stopped = Some(format!(
                "{} reached its disk budget of {} bytes; activations past it are recomputed",
                self.path.display(),
                self.disk_budget
            ));
            self.stats.refused += 1;
            return Ok(());
        }
        let mut bytes = Vec::with_capacity(self.record_len() as usize);
        bytes.extend(key.sample.to_le_bytes());
        bytes.extend(key.augmentation.to_le_bytes());
        bytes.extend((values.len() as u32).to_le_bytes());
        for v in values {
            bytes.extend(v.to_le_bytes());
        }
        let mut h = Fnv64::default();
        h.write(&bytes);
        bytes.extend(h.finish().to_le_bytes());
        if let Err(e) = self.file.write_all_at(&bytes, self.end) {
            // A part written is past `end`: never indexed, cut off when the file is scanned.
            self.stopped = Some(format!(
                "cannot write {} ({e}); activations not held in memory are recomputed",
                self.path.display()
            ));
            self.stats.refused += 1;
            return Ok(());
        }
        self.index.insert(key, self.end);
        self.end += bytes.len() as u64;
        self.stats.disk_records = self.index.len();
        Ok(())
    }

    /// Writes the records held only in memory to the file and syncs it, so that a
    /// resumed run finds them.
    pub fn persist(&mut self) -> Result<()> {
        for key in std::mem::take(&mut self.unsaved) {
            if let Some(values) = self.memory.get(&key).cloned()
                && !self.index.contains_key(&key)
            {
                self.write_record(key, &values)?;
            }
        }
        // A failed sync (a full disk) costs only the records: a resumed run finds a
        // damaged tail or bad checksums, cuts them off and recomputes.
        if let Err(e) = self.file.flush().and_then(|_| self.file.sync_data()) {
            self.stopped = Some(format!("cannot sync {} ({e}); activations are recomputed", self.path.display()));
        }
        Ok(())
    }

    /// Sizes and counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats { disk_bytes: self.end, ..self.stats.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> CacheIdentity {
        CacheIdentity { model: 7, cut: 2, parameters: 99, elements: 3 }
    }

    fn key(sample: u64) -> CacheKey {
        CacheKey { sample, augmentation: 0 }
    }

    fn values(sample: u64) -> Vec<f32> {
        vec![sample as f32, -(sample as f32) * 0.5, 1.0 / (1.0 + sample as f32)]
    }

    #[test]
    fn records_read_ahead_are_served_once_and_checked_like_any_other() {
        let dir = tempfile::tempdir().unwrap();
        // Nothing in memory: every record is in the file.
        let (mut c, _) = ActivationCache::open(dir.path(), identity(), 0).unwrap();
        for s in 0..4 {
            c.insert(key(s), &values(s)).unwrap();
        }
        // Damage record 2 on disk after it was written.
        let path = c.path().to_path_buf();
        let header = c.stats().disk_bytes - 4 * (RECORD_OVERHEAD + 12);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[(header + 2 * (RECORD_OVERHEAD + 12) + 20) as usize] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        c.warm(&[key(1), key(2), key(3), key(9)]).unwrap();
        let st = c.stats();
        assert_eq!((st.corrupt, st.hits, st.misses), (1, 0, 0), "reading ahead is no lookup: {st:?}");
        // Staged records come back without the file: prove it by truncating it.
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
        assert_eq!(c.get(key(1)).unwrap(), Some(values(1)));
        assert_eq!(c.get(key(3)).unwrap(), Some(values(3)));
        assert_eq!(c.get(key(2)).unwrap(), None, "a damaged record is never served");
        // Record 0 was not read ahead, and a staged record is served once: both go to
        // the (now empty) file, and fail there.
        assert!(c.get(key(0)).is_err());
        assert!(c.get(key(1)).is_err());
        let st = c.stats();
        assert_eq!((st.hits, st.corrupt), (2, 1), "{st:?}");
    }

    #[test]
    fn past_the_disk_budget_records_are_refused_and_the_cache_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let (c, _) = ActivationCache::open(dir.path(), identity(), 24).unwrap();
        // The header, then room for exactly two records on disk.
        let record = RECORD_OVERHEAD + 12;
        let budget = c.stats().disk_bytes + 2 * record;
        let mut c = c.with_disk_budget(Some(budget));
        for s in 0..6 {
            c.insert(key(s), &values(s)).unwrap();
        }
        let st = c.stats();
        assert_eq!((st.memory_records, st.disk_records, st.refused), (2, 2, 2), "{st:?}");
        assert_eq!(st.disk_bytes, budget);
        let why = c.stopped().unwrap();
        assert!(why.contains("disk budget") && why.contains(&budget.to_string()), "{why}");
        // What was stored is served; what was refused is a miss, to be recomputed.
        for s in 0..4 {
            assert_eq!(c.get(key(s)).unwrap(), Some(values(s)));
        }
        assert_eq!(c.get(key(5)).unwrap(), None);
        // Persisting writes nothing past the budget and does not fail.
        c.persist().unwrap();
        assert_eq!(c.stats().disk_bytes, budget);
        // A new identity starts a new file, within the budget again.
        c.invalidate(CacheIdentity { cut: 3, ..identity() }).unwrap();
        assert_eq!(c.stopped(), None);
        for s in 0..3 {
            c.insert(key(s), &values(s)).unwrap();
        }
        assert_eq!(c.stats().disk_records, 1);
    }

    #[test]
    fn records_come_back_from_memory_and_from_the_spill_file() {
        let dir = tempfile::tempdir().unwrap();
        // Room for two records in memory; the rest spill.
        let (mut c, how) = ActivationCache::open(dir.path(), identity(), 24).unwrap();
        assert_eq!(how, Reopened::Fresh);
        for s in 0..5 {
            c.insert(key(s), &values(s)).unwrap();
        }
        let st = c.stats();
        assert_eq!((st.memory_records, st.memory_bytes, st.disk_records), (2, 24, 3));
        for s in 0..5 {
            assert_eq!(c.get(key(s)).unwrap(), Some(values(s)), "sample {s}");
        }
        assert_eq!(c.get(key(9)).unwrap(), None);
        assert_eq!(c.get(CacheKey { sample: 1, augmentation: 1 }).unwrap(), None);
        assert_eq!((c.stats().hits, c.stats().misses), (5, 2));
    }

    #[test]
    fn a_persisted_cache_is_reused_by_the_same_identity_only() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut c, _) = ActivationCache::open(dir.path(), identity(), 1 << 20).unwrap();
            for s in 0..4 {
                c.insert(key(s), &values(s)).unwrap();
            }
            c.persist().unwrap();
        }
        let (mut c, how) = ActivationCache::open(dir.path(), identity(), 0).unwrap();
        assert_eq!(how, Reopened::Reused(4));
        assert_eq!(c.get(key(3)).unwrap(), Some(values(3)));
        drop(c);
        for (other, what) in [
            (CacheIdentity { parameters: 100, ..identity() }, "other frozen parameters"),
            (CacheIdentity { cut: 3, ..identity() }, "another cut"),
            (CacheIdentity { model: 8, ..identity() }, "another model"),
        ] {
            let (mut c, how) = ActivationCache::open(dir.path(), other, 0).unwrap();
            match how {
                Reopened::Discarded(why) => assert!(why.contains(what), "{why}"),
                other => panic!("expected a discarded cache, got {other:?}"),
            }
            assert_eq!(c.get(key(3)).unwrap(), None);
        }
    }

    #[test]
    fn a_corrupted_record_is_detected_and_not_served() {
        let dir = tempfile::tempdir().unwrap();
        let (mut c, _) = ActivationCache::open(dir.path(), identity(), 0).unwrap();
        for s in 0..3 {
            c.insert(key(s), &values(s)).unwrap();
        }
        drop(c);
        // Flip one bit inside the values of the second record.
        let path = dir.path().join(CACHE_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let header = 12 + u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
        let record = (RECORD_OVERHEAD + 12) as usize;
        bytes[header + record + 21] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        let (mut c, how) = ActivationCache::open(dir.path(), identity(), 0).unwrap();
        assert_eq!(how, Reopened::Reused(3));
        assert_eq!(c.get(key(0)).unwrap(), Some(values(0)));
        assert_eq!(c.get(key(1)).unwrap(), None, "a damaged record must not be served");
        assert_eq!(c.stats().corrupt, 1);
        // The caller recomputes and stores it again; then it is served.
        c.insert(key(1), &values(1)).unwrap();
        assert_eq!(c.get(key(1)).unwrap(), Some(values(1)));
        assert_eq!(c.get(key(2)).unwrap(), Some(values(2)));
    }

    #[test]
    fn invalidation_empties_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let (mut c, _) = ActivationCache::open(dir.path(), identity(), 12).unwrap();
        c.insert(key(0), &values(0)).unwrap();
        c.insert(key(1), &values(1)).unwrap();
        c.invalidate(CacheIdentity { cut: 4, ..identity() }).unwrap();
        assert_eq!(c.get(key(0)).unwrap(), None);
        assert_eq!(c.get(key(1)).unwrap(), None);
        let st = c.stats();
        assert_eq!((st.memory_records, st.disk_records), (0, 0));
        assert!(c.insert(key(0), &[1.0]).unwrap_err().to_string().contains("3 per sample"));
    }

    #[test]
    fn an_unwritable_folder_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"x").unwrap();
        let err = ActivationCache::open(&blocker.join("cache"), identity(), 0).err().unwrap().to_string();
        assert!(err.contains("cannot create the cache folder") && err.contains("file/cache"), "{err}");
    }
}
