//! The one JSON line each benchmark ends with.

use serde::Serialize;

/// Prints `value` as one line of compact JSON on standard output, with
/// the allocator that ran ([`ALLOCATOR`](crate::ALLOCATOR)) as its
/// `allocator` when it is an object: the same code measures differently
/// under another allocator.
///
/// # Panics
///
/// When `value` does not serialize (a map with keys that are not strings).
pub fn print_json(value: &impl Serialize) {
    let mut value = serde_json::to_value(value).expect("the figures serialize");
    if let Some(object) = value.as_object_mut() {
        object.insert("allocator".to_owned(), crate::ALLOCATOR.into());
    }
    println!("{value}");
}
