//! Draws a sweep of the `bench` binary as a PNG, from its JSON line, without
//! measuring anything again: to redraw a run's figures, or draw them on
//! another machine than the one that measured them.
//!
//! ```text
//! cargo run --release -p outbox-bench --bin bench -- --store memory,sqlite \
//!     --messages 20000 --sweep 1,4,16,64,256 | tee sweep.txt
//! cargo run --release -p outbox-bench --bin bench_plot -- --input sweep.txt --plot sweep.png
//! ```
//!
//! `--input FILE` is `bench --sweep`'s output, or only its last line (the
//! sweep's JSON object, `outbox_bench::throughput::SweepSummary`); `-` reads
//! standard input. The last line that parses as a sweep is drawn.
//! `--plot FILE.png` is where the picture goes (required). The note under
//! the title says how many messages each point drained and what drove the
//! runtime; `--note TEXT` replaces it (`bench --plot` adds the server's
//! durability and the machine's cores, which a sweep's JSON does not
//! record).
//!
//! The picture: throughput against concurrency for each store (both axes
//! logarithmic), the runtime solid and its same-run baseline dashed, and
//! beside it the runtime over the baseline. Labels need DejaVu Sans
//! (`fonts-dejavu-core`) or a TrueType file in `BENCH_FONT`.
//!
//! # Output
//!
//! One JSON object: `plot` (the file written), `stores` (in the order
//! drawn) and `points` (how many were drawn).

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use outbox_bench::args::{Flags, refuse};
use outbox_bench::plot;
use outbox_bench::report::print_json;
use outbox_bench::throughput::SweepSummary;
use serde::Serialize;

/// The command line.
struct Args {
    /// A file holding a sweep's JSON line; `-` for standard input.
    input: String,
    /// The PNG to write.
    plot: PathBuf,
    /// The note under the title, when given.
    note: Option<String>,
}

fn parse_args(mut flags: Flags) -> Result<Args, String> {
    let usage = "usage: bench_plot --input FILE|- --plot FILE.png [--note TEXT]";
    let (mut input, mut plot, mut note) = (None, None, None);
    while let Some(flag) = flags.next_flag() {
        match flag.as_str() {
            "--input" => input = Some(flags.value(&flag)?),
            "--plot" => plot = Some(PathBuf::from(flags.value(&flag)?)),
            "--note" => note = Some(flags.value(&flag)?),
            "--help" | "-h" => return Err(usage.into()),
            other => return Err(format!("unknown argument {other:?}; {usage}")),
        }
    }
    let (Some(input), Some(plot)) = (input, plot) else {
        return Err(format!("--input and --plot are required; {usage}"));
    };
    if plot.extension().and_then(|e| e.to_str()) != Some("png") {
        return Err(format!(
            "--plot writes a PNG: name it *.png, not {}",
            plot.display()
        ));
    }
    Ok(Args { input, plot, note })
}

/// The last line of `text` that is a sweep's JSON object.
fn last_sweep(text: &str) -> Option<SweepSummary> {
    text.lines()
        .rev()
        .find_map(|line| serde_json::from_str(line.trim()).ok())
}

/// The JSON line.
#[derive(Serialize)]
struct Drawn<'a> {
    plot: String,
    stores: Vec<&'a str>,
    points: usize,
}

fn main() {
    let Args { input, plot, note } =
        parse_args(Flags::from_env()).unwrap_or_else(|message| refuse(message));
    let text = if input == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .unwrap_or_else(|e| refuse(format!("--input -: cannot read standard input: {e}")));
        text
    } else {
        std::fs::read_to_string(&input).unwrap_or_else(|e| refuse(format!("--input {input}: {e}")))
    };
    let sweep = last_sweep(&text).unwrap_or_else(|| {
        refuse(format!(
            "--input {input}: no line is a sweep's JSON object (the last line of `bench --sweep`)"
        ))
    });
    plot::prepare(&plot).unwrap_or_else(|message| refuse(message));
    let schedule = sweep
        .points
        .first()
        .and_then(|point| point.schedule_ms)
        .map(Duration::from_millis);
    let note = note.unwrap_or_else(|| plot::settings_note(sweep.messages, schedule));
    let points = plot::points(&sweep.points);
    if let Err(message) = plot::draw(&plot, &points, &note) {
        eprintln!("{message}");
        std::process::exit(1);
    }
    let mut stores: Vec<&str> = Vec::new();
    for point in &points {
        if !stores.contains(&point.store) {
            stores.push(point.store);
        }
    }
    print_json(&Drawn {
        plot: plot.display().to_string(),
        stores,
        points: points.len(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_sweep_line_is_found_among_the_others() {
        let text = "memory: 100 messages, ...\n\
            {\"store\":\"memory\"}\n\
            {\"messages\":100,\"concurrencies\":[1],\"plot\":null,\"points\":[]}\n";
        let sweep = last_sweep(text).expect("a sweep");
        assert_eq!(sweep.messages, 100);
        assert_eq!(sweep.concurrencies, [1]);
        assert!(last_sweep("not json\n").is_none());
    }
}
