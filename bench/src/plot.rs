//! The picture of a sweep (`bench --sweep … --plot FILE.png`, or
//! `bench_plot` from a sweep's JSON line): throughput against concurrency
//! for each store, the runtime beside its same-run baseline, and the ratio
//! of the two.
//!
//! Text is drawn with `ab_glyph` from a TrueType file read at run time, so
//! the build needs no system font library. The file is `$BENCH_FONT` when
//! set, else DejaVu Sans from the Debian package `fonts-dejavu-core`.

use std::path::Path;
use std::time::Duration;

use plotters::coord::combinators::IntoLogRange;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::throughput::{Summary, driven_by};

/// Where `fonts-dejavu-core` installs DejaVu Sans.
const DEJAVU_SANS: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// One (store, concurrency) point of a sweep.
pub struct Point<'a> {
    /// `memory`, `sqlite` or `postgres`.
    pub store: &'a str,
    /// The runtime's concurrency (the SQL baselines ignore it).
    pub concurrency: usize,
    /// The runtime's messages per second.
    pub runtime_per_sec: f64,
    /// The same-run baseline's messages per second.
    pub baseline_per_sec: f64,
}

/// The points of `summaries` that measured both sides (a sweep refuses
/// `--only`, so that is all of a sweep's).
pub fn points(summaries: &[Summary]) -> Vec<Point<'_>> {
    summaries
        .iter()
        .filter_map(|point| {
            Some(Point {
                store: &point.store,
                concurrency: point.concurrency,
                runtime_per_sec: point.runtime_per_sec?,
                baseline_per_sec: point.baseline_per_sec?,
            })
        })
        .collect()
}

/// The start of the note under the title: what each point measured and
/// what drove the runtime.
pub fn settings_note(messages: u64, schedule: Option<Duration>) -> String {
    format!(
        "{messages} messages a point, no-op handler, {}",
        driven_by(schedule)
    )
}

/// Everything a plot needs before anything is measured: the font loaded
/// and the folder of `path` created, so a missing font or an unwritable
/// path fails a sweep at once rather than after it.
pub fn prepare(path: &Path) -> Result<(), String> {
    load_font()?;
    match path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        Some(dir) => std::fs::create_dir_all(dir)
            .map_err(|e| format!("--plot: cannot create {}: {e}", dir.display())),
        None => Ok(()),
    }
}

/// Loads the labels' font and registers it as plotters' sans-serif face
/// ([`prepare`] calls it).
pub fn load_font() -> Result<(), String> {
    let (path, from_env) = match std::env::var_os("BENCH_FONT") {
        Some(path) => (path.into(), true),
        None => (std::path::PathBuf::from(DEJAVU_SANS), false),
    };
    let bytes = std::fs::read(&path).map_err(|e| {
        if from_env {
            format!(
                "--plot: cannot read the font BENCH_FONT={}: {e}",
                path.display()
            )
        } else {
            format!(
                "--plot: the plot's labels need DejaVu Sans at {DEJAVU_SANS} ({e}); install \
                 the Debian package fonts-dejavu-core (apt-get install -y fonts-dejavu-core) \
                 or set BENCH_FONT to a TrueType file"
            )
        }
    })?;
    // plotters keeps registered fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| {
        format!(
            "--plot: {} is not a TrueType or OpenType font",
            path.display()
        )
    })
}

/// The line colour of a store.
fn colour(store: &str) -> RGBColor {
    match store {
        "memory" => RGBColor(31, 119, 180),
        "sqlite" => RGBColor(44, 160, 44),
        _ => RGBColor(214, 39, 40),
    }
}

/// The store's name in the legend.
fn label(store: &str) -> &str {
    match store {
        "memory" => "memory",
        "sqlite" => "SQLite",
        "postgres" => "PostgreSQL",
        other => other,
    }
}

/// Draws `points` into a PNG at `path`: on the left, messages per second
/// against concurrency (both axes logarithmic), the runtime solid and the
/// baseline dashed; on the right, runtime / baseline. `note` goes under the
/// title (the settings the figures were measured on).
pub fn draw(path: &Path, points: &[Point<'_>], note: &str) -> Result<(), String> {
    draw_inner(path, points, note).map_err(|e| format!("--plot {}: {e}", path.display()))
}

fn draw_inner(
    path: &Path,
    points: &[Point<'_>],
    note: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    if points.is_empty() {
        return Err("no points to draw".into());
    }
    let mut stores: Vec<&str> = Vec::new();
    for point in points {
        if !stores.contains(&point.store) {
            stores.push(point.store);
        }
    }
    let series = |store: &str, value: fn(&Point<'_>) -> f64| -> Vec<(f64, f64)> {
        points
            .iter()
            .filter(|p| p.store == store)
            .map(|p| (p.concurrency as f64, value(p)))
            .collect()
    };
    let max_concurrency = points.iter().map(|p| p.concurrency).max().unwrap_or(1) as f64;
    let x_range = || (0.8f64..max_concurrency * 1.25).log_scale().base(2.0);
    let rates = points
        .iter()
        .flat_map(|p| [p.runtime_per_sec, p.baseline_per_sec]);
    let low = rates.clone().fold(f64::INFINITY, f64::min).max(1.0);
    let high = rates.fold(0.0, f64::max).max(low * 10.0);
    let max_ratio = points
        .iter()
        .map(|p| p.runtime_per_sec / p.baseline_per_sec)
        .fold(1.0, f64::max);

    let root = BitMapBackend::new(path, (1400, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(70);
    title.draw(&Text::new(
        "Throughput against concurrency: the runtime (solid) and its same-run baseline (dashed)",
        (20, 12),
        ("sans-serif", 22).into_font(),
    ))?;
    title.draw(&Text::new(
        note.to_owned(),
        (20, 42),
        ("sans-serif", 15).into_font().color(&RGBColor(90, 90, 90)),
    ))?;
    let (left, right) = body.split_horizontally(820);
    let concurrency_label = |x: &f64| format!("{x:.0}");

    let mut throughput = ChartBuilder::on(&left)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .caption("messages per second", ("sans-serif", 18))
        .build_cartesian_2d(x_range(), (low * 0.6..high * 1.6).log_scale())?;
    throughput
        .configure_mesh()
        .x_desc("concurrency")
        .x_label_formatter(&concurrency_label)
        .y_label_formatter(&|y: &f64| thousands(*y))
        .light_line_style(RGBColor(238, 238, 238))
        .label_style(("sans-serif", 14))
        .draw()?;
    for &store in &stores {
        let c = colour(store);
        let runtime = series(store, |p| p.runtime_per_sec);
        throughput
            .draw_series(LineSeries::new(runtime.clone(), c.stroke_width(3)))?
            .label(format!("{} runtime", label(store)))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], c.stroke_width(3)));
        throughput.draw_series(
            runtime
                .iter()
                .map(|&(x, y)| Circle::new((x, y), 4, c.filled())),
        )?;
        let baseline = series(store, |p| p.baseline_per_sec);
        throughput
            .draw_series(DashedLineSeries::new(
                baseline.clone(),
                8,
                5,
                c.stroke_width(2),
            ))?
            .label(format!("{} baseline", label(store)))
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new([(0, 0), (6, 0)], c.stroke_width(2))
                    + PathElement::new([(9, 0), (15, 0)], c.stroke_width(2))
                    + PathElement::new([(18, 0), (24, 0)], c.stroke_width(2))
            });
        throughput.draw_series(
            baseline
                .iter()
                .map(|&(x, y)| TriangleMarker::new((x, y), 5, c.stroke_width(2))),
        )?;
    }
    throughput
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;

    let mut ratio = ChartBuilder::on(&right)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .caption("runtime / baseline", ("sans-serif", 18))
        .build_cartesian_2d(x_range(), 0.0..(max_ratio * 1.15).max(1.2))?;
    ratio
        .configure_mesh()
        .x_desc("concurrency")
        .x_label_formatter(&concurrency_label)
        .y_label_formatter(&|y: &f64| format!("{y:.1}"))
        .light_line_style(RGBColor(238, 238, 238))
        .label_style(("sans-serif", 14))
        .draw()?;
    ratio.draw_series(DashedLineSeries::new(
        [(0.8, 1.0), (max_concurrency * 1.25, 1.0)],
        6,
        6,
        BLACK.stroke_width(1),
    ))?;
    for &store in &stores {
        let c = colour(store);
        let ratios = series(store, |p| p.runtime_per_sec / p.baseline_per_sec);
        ratio
            .draw_series(LineSeries::new(ratios.clone(), c.stroke_width(3)))?
            .label(label(store))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], c.stroke_width(3)));
        ratio.draw_series(
            ratios
                .iter()
                .map(|&(x, y)| Circle::new((x, y), 4, c.filled())),
        )?;
    }
    ratio
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()?;
    Ok(())
}

/// `12345.6` as `12 346`, `850000` as `850 000`.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value);
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(ch);
    }
    out
}
