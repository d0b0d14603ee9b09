//! Loss and accuracy curves drawn to PNG with plotters, in pure Rust: text is rendered
//! with a TrueType font read from the system (Debian's `fonts-dejavu-core`), pixels go to
//! an RGB buffer, and [`crate::png`] encodes it.

use crate::error::{Result, TrainError};
use crate::metrics::{Decision, DecisionKind, Record};
use plotters::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

/// Font files tried in order; the first that exists is used.
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Registers a system font with plotters once per process.
pub fn ensure_font() -> std::result::Result<(), String> {
    static REGISTERED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let path = std::env::var("EDGEFREEZE_FONT")
                .ok()
                .into_iter()
                .chain(FONT_CANDIDATES.iter().map(|s| s.to_string()))
                .find(|p| Path::new(p).is_file())
                .ok_or_else(|| {
                    "no TrueType font found for plot labels: install one (apt-get install fonts-dejavu-core) \
                     or point EDGEFREEZE_FONT at a .ttf file"
                        .to_string()
                })?;
            let bytes = std::fs::read(&path).map_err(|e| format!("cannot read font {path}: {e}"))?;
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| format!("{path} is not a usable TrueType font"))
        })
        .clone()
}

/// Draws training curves: loss per logged step and test loss per epoch on the left,
/// training and test accuracy per epoch on the right.
pub fn plot_training(records: &[Record], title: &str, path: &Path) -> Result<()> {
    plot_training_with_decisions(records, &[], title, path)
}

/// Draws the training curves with a controller's freezing timeline over them: the
/// frozen depth after each decision as a green step line (scaled to each chart's height,
/// its maximum labelled), and a dashed line at every freeze and unfreeze.
pub fn plot_training_with_decisions(
    records: &[Record],
    decisions: &[Decision],
    title: &str,
    path: &Path,
) -> Result<()> {
    let fail = |message: String| TrainError::Plot { path: path.into(), message };
    ensure_font().map_err(fail)?;
    render(path, (1200, 480), |root| draw(records, decisions, title, root)).map_err(|e| fail(e.to_string()))
}

/// What drawing a chart returns: plotters' errors and the PNG writer's, boxed alike.
pub type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// A chart's drawing area: plotters' bitmap backend over an RGB buffer.
pub type Canvas<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// Draws a `width` x `height` chart with `draw` into an RGB buffer and writes it to `path`
/// as PNG, atomically (a temporary file renamed over it), so a reader never sees half a
/// PNG and a failed drawing leaves the previous plot in place.
pub fn render(path: &Path, (width, height): (u32, u32), draw: impl FnOnce(Canvas<'_>) -> DrawResult) -> DrawResult {
    let mut rgb = vec![0u8; width as usize * height as usize * 3];
    draw(BitMapBackend::with_buffer(&mut rgb, (width, height)).into_drawing_area())?;
    edgefreeze_graph::save::write_atomically(path, &crate::png::encode_rgb(width, height, &rgb)?)?;
    Ok(())
}

/// The frozen depth over the run as (step, depth) corners of a step line, and the steps
/// of freezes and unfreezes.
fn timeline(decisions: &[Decision], last_step: f64) -> (Vec<(f64, f64)>, Vec<f64>) {
    let mut line = vec![(0.0, 0.0)];
    let mut marks = Vec::new();
    for d in decisions.iter().filter(|d| matches!(d.kind, DecisionKind::Freeze | DecisionKind::Unfreeze)) {
        let (x, previous) = (d.step as f64, line.last().map_or(0.0, |p| p.1));
        line.push((x, previous));
        line.push((x, d.depth as f64));
        marks.push(x);
    }
    let depth = line.last().map_or(0.0, |p| p.1);
    line.push((last_step, depth));
    (line, marks)
}

fn draw(records: &[Record], decisions: &[Decision], title: &str, root: Canvas<'_>) -> DrawResult {
    let mut steps = Vec::new();
    let mut epochs = Vec::new();
    for r in records {
        match r {
            Record::Step { step, loss, .. } => steps.push((*step as f64, *loss)),
            Record::Epoch { epoch, step, train_loss, train_accuracy, test_loss, test_accuracy, .. } => {
                epochs.push((*epoch as f64, *step as f64, *train_loss, *train_accuracy, *test_loss, *test_accuracy))
            }
        }
    }
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 22))?;
    let (left, right) = root.split_horizontally(600);

    let max_step = steps.iter().map(|s| s.0).chain(epochs.iter().map(|e| e.1)).fold(1.0, f64::max);
    let losses = steps.iter().map(|s| s.1).chain(epochs.iter().flat_map(|e| [e.2, e.4]));
    let max_loss = losses.filter(|l| l.is_finite()).fold(0.1, f64::max) * 1.05;
    let mut chart = ChartBuilder::on(&left)
        .caption("loss", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0.0..max_step, 0.0..max_loss)?;
    chart.configure_mesh().x_desc("update").y_desc("cross-entropy").draw()?;
    chart
        .draw_series(LineSeries::new(steps.iter().copied(), BLUE.mix(0.6)))?
        .label("train (batch)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLUE));
    let test_loss: Vec<(f64, f64)> = epochs.iter().map(|e| (e.1, e.4)).collect();
    chart
        .draw_series(LineSeries::new(test_loss.iter().copied(), RED.stroke_width(2)))?
        .label("test (epoch)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RED));
    chart.draw_series(test_loss.iter().map(|&p| Circle::new(p, 4, RED.filled())))?;
    let (depths, marks) = timeline(decisions, max_step);
    let deepest = depths.iter().map(|p| p.1).fold(0.0, f64::max);
    if !marks.is_empty() {
        let scale = max_loss * 0.9 / deepest.max(1.0);
        let green = RGBColor(0, 140, 60);
        chart
            .draw_series(LineSeries::new(depths.iter().map(|&(x, d)| (x, d * scale)), green.stroke_width(2)))?
            .label(format!("frozen layers (top = {deepest:.0})"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], green));
        for &x in &marks {
            chart.draw_series(DashedLineSeries::new([(x, 0.0), (x, max_loss)], 4, 4, green.mix(0.5).into()))?;
        }
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;

    let max_epoch = epochs.iter().map(|e| e.0).fold(1.0, f64::max);
    let min_acc = epochs.iter().flat_map(|e| [e.3, e.5]).fold(1.0, f64::min);
    let low = (min_acc * 100.0 - 2.0).floor().clamp(0.0, 90.0);
    let mut chart = ChartBuilder::on(&right)
        .caption("accuracy", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0.0..max_epoch + 0.5, low..100.0)?;
    chart.configure_mesh().x_desc("epoch").y_desc("%").draw()?;
    for (series, color, label) in [(3usize, BLUE, "train"), (5, RED, "test")] {
        let points: Vec<(f64, f64)> =
            epochs.iter().map(|e| (e.0, 100.0 * if series == 3 { e.3 } else { e.5 })).collect();
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    // The timeline against epochs: an update's position is its fraction of the epoch it ends in.
    let steps_per_epoch = epochs.first().map_or(1.0, |e| e.1.max(1.0));
    if !marks.is_empty() {
        let green = RGBColor(0, 140, 60);
        let scale = (100.0 - low) * 0.9 / deepest.max(1.0);
        let to_epoch = |s: f64| s / steps_per_epoch;
        chart.draw_series(LineSeries::new(
            depths.iter().map(|&(x, d)| (to_epoch(x), low + d * scale)),
            green.stroke_width(2),
        ))?;
        for &x in &marks {
            chart.draw_series(DashedLineSeries::new(
                [(to_epoch(x), low), (to_epoch(x), 100.0)],
                4,
                4,
                green.mix(0.5).into(),
            ))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
