//! A prefetching loader: a worker thread builds the batches of one epoch ahead of use and
//! hands them over a bounded channel.

use crate::DataError;
use crate::augment::Augmentation;
use crate::batch::{Batch, Samples};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::JoinHandle;

/// The number of batches of `batch_size` that `n` samples make, the last one partial if
/// `batch_size` does not divide `n` (0 if `batch_size` is 0).
pub fn batch_count(n: usize, batch_size: usize) -> usize {
    if batch_size == 0 { 0 } else { n.div_ceil(batch_size) }
}

/// How a [`Loader`] builds its batches.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LoaderOptions {
    /// Samples per batch; the last batch of the epoch holds the rest (it is not dropped).
    pub batch_size: usize,
    /// Augmentation for image training batches (None for test batches and for text).
    pub augmentation: Option<Augmentation>,
    /// The seed of augmentation.
    pub seed: u64,
    /// The epoch (augmentation depends on it).
    pub epoch: u64,
    /// How many batches the worker may build ahead of the consumer (the channel's bound).
    pub depth: usize,
    /// The first batch to build: batch `k` holds `order[k * batch_size..]`, so resuming
    /// mid-epoch after `k` batches yields exactly the batches an uninterrupted epoch would.
    pub start_batch: usize,
}

/// Iterates over the batches of one epoch in order, built on a worker thread.
///
/// Batch `k` is `samples.batch(&order[k * batch_size..(k + 1) * batch_size], ...)`, the
/// same as building it directly with [`Samples::batch`]. Dropping the loader, finished or
/// not, stops the worker and waits for it.
#[derive(Debug)]
pub struct Loader {
    receiver: Option<Receiver<Batch>>,
    worker: Option<JoinHandle<()>>,
    remaining: usize,
}

impl Loader {
    /// Starts a worker thread that builds the batches of `order` (sample indices, e.g. from
    /// [`crate::epoch_order`]) from `options.start_batch` on.
    ///
    /// Errors if the batch size is 0, an index is out of range or the thread cannot start.
    pub fn spawn(samples: Arc<Samples>, order: Vec<usize>, options: LoaderOptions) -> Result<Loader, DataError> {
        if options.batch_size == 0 {
            return Err(DataError::Invalid("the batch size must be positive".into()));
        }
        samples.check(&order)?;
        let total = batch_count(order.len(), options.batch_size);
        let start = options.start_batch.min(total);
        let (sender, receiver) = sync_channel(options.depth);
        let worker = std::thread::Builder::new()
            .name("edgefreeze-loader".into())
            .spawn(move || {
                let LoaderOptions { batch_size, augmentation, seed, epoch, .. } = options;
                for indices in order.chunks(batch_size).skip(start) {
                    let batch = samples.batch_unchecked(indices, augmentation.as_ref(), seed, epoch);
                    if sender.send(batch).is_err() {
                        return; // the loader was dropped
                    }
                }
            })
            .map_err(DataError::Spawn)?;
        Ok(Loader { receiver: Some(receiver), worker: Some(worker), remaining: total - start })
    }

    /// The number of batches still to come.
    pub fn remaining(&self) -> usize {
        self.remaining
    }
}

impl Iterator for Loader {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        let batch = self.receiver.as_ref()?.recv().ok();
        match batch {
            Some(_) => self.remaining -= 1,
            None => self.remaining = 0,
        }
        batch
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for Loader {}

impl Drop for Loader {
    fn drop(&mut self) {
        // Dropping the receiver makes the worker's next (or pending) send fail, so it ends.
        drop(self.receiver.take());
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TextDataset;

    fn text(n: usize) -> Arc<Samples> {
        Arc::new(Samples::Text(TextDataset {
            seq_len: 1,
            tokens: (0..n as i64).collect(),
            labels: (0..n).map(|i| (i % 2) as u8).collect(),
        }))
    }

    #[test]
    fn batches_come_in_order_with_the_partial_last_one() {
        let options = LoaderOptions { batch_size: 3, depth: 1, ..Default::default() };
        let loader = Loader::spawn(text(8), vec![7, 6, 5, 4, 3, 2, 1, 0], options.clone()).unwrap();
        assert_eq!(loader.len(), 3);
        let got: Vec<Vec<usize>> = loader.map(|b| b.indices).collect();
        assert_eq!(got, [vec![7, 6, 5], vec![4, 3, 2], vec![1, 0]]);
        let resumed = Loader::spawn(text(8), (0..8).collect(), LoaderOptions { start_batch: 2, ..options.clone() });
        assert_eq!(resumed.unwrap().map(|b| b.indices).collect::<Vec<_>>(), [vec![6, 7]]);
        let past_end = Loader::spawn(text(8), (0..8).collect(), LoaderOptions { start_batch: 9, ..options.clone() });
        assert_eq!(past_end.unwrap().count(), 0);
        assert_eq!(Loader::spawn(text(0), vec![], options.clone()).unwrap().count(), 0);
    }

    #[test]
    fn bad_arguments_are_errors() {
        let err = Loader::spawn(text(2), vec![0, 2], LoaderOptions { batch_size: 1, ..Default::default() });
        assert!(err.unwrap_err().to_string().contains("out of range"));
        assert!(Loader::spawn(text(2), vec![0], LoaderOptions::default()).is_err());
        assert_eq!(batch_count(10, 0), 0);
    }

    #[test]
    fn dropping_early_stops_the_worker() {
        for depth in [0, 1, 4] {
            let options = LoaderOptions { batch_size: 1, depth, ..Default::default() };
            let mut loader = Loader::spawn(text(1000), (0..1000).collect(), options).unwrap();
            assert_eq!(loader.next().unwrap().indices, [0]);
            drop(loader); // would hang if the worker kept blocking on a full channel
        }
    }
}
