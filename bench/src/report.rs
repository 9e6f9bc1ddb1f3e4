//! The one JSON line each benchmark ends with.

use serde::Serialize;

/// Prints `value` as one line of compact JSON on standard output (see
/// [`json_line`]).
///
/// # Panics
///
/// When `value` does not serialize (a map with keys that are not strings).
pub fn print_json(value: &impl Serialize) {
    println!("{}", json_line(value));
}

/// `value` as one line of compact JSON, with the allocator that ran
/// ([`ALLOCATOR`](crate::ALLOCATOR)) as its `allocator` when it is an
/// object: the same code measures differently under another allocator.
///
/// # Panics
///
/// When `value` does not serialize (a map with keys that are not strings).
pub fn json_line(value: &impl Serialize) -> String {
    let mut value = serde_json::to_value(value).expect("the figures serialize");
    if let Some(object) = value.as_object_mut() {
        object.insert("allocator".to_owned(), crate::ALLOCATOR.into());
    }
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_names_the_allocator_and_keeps_its_figures() {
        #[derive(Serialize)]
        struct Figures {
            per_sec: f64,
        }
        let line: serde_json::Value =
            serde_json::from_str(&json_line(&Figures { per_sec: 1.5 })).unwrap();
        assert_eq!(
            line,
            serde_json::json!({ "per_sec": 1.5, "allocator": crate::ALLOCATOR })
        );
        assert_eq!(
            crate::ALLOCATOR,
            if cfg!(feature = "mimalloc") {
                "mimalloc"
            } else {
                "system"
            }
        );
    }

    #[test]
    fn anything_else_is_left_as_it_is() {
        assert_eq!(json_line(&[1, 2]), "[1,2]");
    }
}
