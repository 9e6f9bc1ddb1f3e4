//! The one JSON line each benchmark ends with.

use serde::Serialize;

/// Prints `value` as one line of compact JSON on standard output.
///
/// # Panics
///
/// When `value` does not serialize (a map with keys that are not strings).
pub fn print_json(value: &impl Serialize) {
    println!(
        "{}",
        serde_json::to_string(value).expect("the figures serialize")
    );
}
