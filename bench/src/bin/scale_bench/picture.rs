//! The PNG of a run: throughput against the number of drain processes, and
//! what each message cost the server's CPU and the processes' own.

use std::path::Path;

use plotters::coord::combinators::IntoLogRange;
use plotters::prelude::*;

use crate::Point;

const THROUGHPUT: RGBColor = RGBColor(214, 39, 40);
const SERVER: RGBColor = RGBColor(31, 119, 180);
const WORKERS: RGBColor = RGBColor(44, 160, 44);

/// Draws `points` into a PNG at `path`; `note` goes under the title.
pub(crate) fn draw(path: &Path, points: &[Point], note: &str) -> Result<(), String> {
    draw_inner(path, points, note).map_err(|e| format!("--plot {}: {e}", path.display()))
}

fn draw_inner(path: &Path, points: &[Point], note: &str) -> Result<(), Box<dyn std::error::Error>> {
    if points.is_empty() {
        return Err("no points to draw".into());
    }
    let most = points.iter().map(|p| p.processes).max().unwrap_or(1) as f64;
    let x_range = || (0.8f64..most * 1.25).log_scale().base(2.0);
    let processes_label = |x: &f64| format!("{x:.0}");

    let root = BitMapBackend::new(path, (1400, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(70);
    title.draw(&Text::new(
        "Drain processes on one PostgreSQL primary: throughput, and CPU per message",
        (20, 12),
        ("sans-serif", 22).into_font(),
    ))?;
    title.draw(&Text::new(
        note.to_owned(),
        (20, 42),
        ("sans-serif", 15).into_font().color(&RGBColor(90, 90, 90)),
    ))?;
    let (left, right) = body.split_horizontally(700);

    let rates: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.processes as f64, p.per_sec))
        .collect();
    let high = rates.iter().map(|&(_, y)| y).fold(0.0, f64::max);
    let mut throughput = ChartBuilder::on(&left)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .caption(
            "messages per second (median of the rounds)",
            ("sans-serif", 18),
        )
        .build_cartesian_2d(x_range(), 0.0..high * 1.25)?;
    throughput
        .configure_mesh()
        .x_desc("drain processes")
        .x_label_formatter(&processes_label)
        .y_label_formatter(&|y: &f64| format!("{y:.0}"))
        .light_line_style(RGBColor(238, 238, 238))
        .label_style(("sans-serif", 14))
        .draw()?;
    throughput.draw_series(LineSeries::new(rates.clone(), THROUGHPUT.stroke_width(3)))?;
    throughput.draw_series(
        rates
            .iter()
            .map(|&(x, y)| Circle::new((x, y), 5, THROUGHPUT.filled())),
    )?;

    let server: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|p| Some((p.processes as f64, p.server_cpu_us_per_message?)))
        .collect();
    let workers: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|p| Some((p.processes as f64, p.workers_cpu_us_per_message?)))
        .collect();
    let high = server
        .iter()
        .chain(&workers)
        .map(|&(_, y)| y)
        .fold(1.0, f64::max);
    let mut cpu = ChartBuilder::on(&right)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .caption("CPU per message, µs", ("sans-serif", 18))
        .build_cartesian_2d(x_range(), 0.0..high * 1.25)?;
    cpu.configure_mesh()
        .x_desc("drain processes")
        .x_label_formatter(&processes_label)
        .y_label_formatter(&|y: &f64| format!("{y:.0}"))
        .light_line_style(RGBColor(238, 238, 238))
        .label_style(("sans-serif", 14))
        .draw()?;
    for (series, colour, label) in [
        (&server, SERVER, "PostgreSQL server"),
        (&workers, WORKERS, "drain processes"),
    ] {
        cpu.draw_series(LineSeries::new(series.clone(), colour.stroke_width(3)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], colour.stroke_width(3)));
        cpu.draw_series(
            series
                .iter()
                .map(|&(x, y)| Circle::new((x, y), 4, colour.filled())),
        )?;
    }
    cpu.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()?;
    Ok(())
}
