//! Small figures from many samples: the median, the mean, percentiles, and
//! rounding for the JSON lines.

use std::time::Duration;

/// The middle sample (the upper one of an even count).
///
/// # Panics
///
/// On no samples, or on samples that do not compare (a NaN).
pub fn median<T: Copy + PartialOrd>(mut samples: Vec<T>) -> T {
    samples.sort_by(|a, b| a.partial_cmp(b).expect("samples that compare"));
    samples[samples.len() / 2]
}

/// The arithmetic mean; NaN for no values.
pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// The `p`-th percentile (0..=100) of `sorted` microseconds, in
/// milliseconds, by nearest rank; 0 for no values.
pub fn percentile_ms(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)] as f64 / 1000.0
}

/// `x` rounded to `places` decimal places, so a JSON line does not carry
/// digits the measurement cannot back.
pub fn round(x: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (x * scale).round() / scale
}

/// A duration in microseconds, to two places.
pub fn micros(duration: Duration) -> f64 {
    round(duration.as_secs_f64() * 1e6, 2)
}

/// Events per second over `elapsed`.
pub fn per_sec(events: u64, elapsed: Duration) -> f64 {
    events as f64 / elapsed.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_sample() {
        assert_eq!(median(vec![3, 1, 2]), 2);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let sorted: Vec<u64> = (1..=100).map(|ms| ms * 1000).collect();
        assert_eq!(percentile_ms(&sorted, 50.0), 51.0);
        assert_eq!(percentile_ms(&sorted, 100.0), 100.0);
        assert_eq!(percentile_ms(&[], 99.0), 0.0);
    }

    #[test]
    fn rounding_keeps_the_places_asked_for() {
        assert_eq!(round(1.23456, 2), 1.23);
        assert_eq!(micros(Duration::from_nanos(12_346)), 12.35);
    }
}
