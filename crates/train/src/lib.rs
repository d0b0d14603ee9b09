//! The training driver of edgefreeze: runs converted training graphs on real data with
//! an engine from `edgefreeze-engine`.
//!
//! A run lives in a directory ([`run`]): the recipe, the converted graphs, a checkpoint
//! after every epoch ([`checkpoint`], atomic, all kept) and metrics ([`metrics`]). The
//! [`Trainer`] feeds batches from a prefetching loader to the training-step graph, whose
//! parameters and optimizer state stay inside the engine between steps; it evaluates
//! after each epoch, stops on a non-finite loss, and resumes exactly: the data order,
//! augmentation, dropout masks and learning rate are pure functions of the seed and the
//! update index. A [`Controller`] may switch the graphs between updates through the
//! [`StepRunner`] (layer freezing); [`observe`]rs watch the run (progress bar, metrics,
//! plots, checkpoints). [`export`] writes an inference model with trained weights, [`plot`]
//! draws curves, and [`bench`] measures training throughput.

pub mod bench;
pub mod checkpoint;
pub mod control;
mod error;
pub mod export;
pub mod metrics;
pub mod observe;
pub mod plot;
pub mod png;
pub mod run;
pub mod schedule;
pub mod step;
pub mod tensors;
mod trainer;

pub use control::{Controller, Outcome, Saved, StateView, StepReport};
pub use error::{Result, TrainError};
pub use run::{ModelSource, NewRun, Recipe, RunFolder, RunSpec, create_run, open_run, prepare_run};
pub use schedule::{Decay, Schedule};
pub use step::{ActivationStore, GraphSet, StepGraphs, StepRunner};
pub use trainer::{
    Checked, TrainOptions, TrainSummary, Trainer, batch_values, check_fit, dropout_seed, evaluate, loss_and_correct,
    model_label, open_data, preflight, progress_bar, subset,
};
