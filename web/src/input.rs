//! What the operator sends, read the same way on every page: a POSTed
//! form's fields, blank values taken as absent, and times in the two
//! notations a person types or a `datetime-local` input sends.

use chrono::{DateTime, NaiveDateTime, Utc};

/// A POSTed form's fields, in the order sent. A name may repeat: the list
/// page sends one `id` per ticked row.
pub(crate) struct Form {
    fields: Vec<(String, String)>,
}

impl Form {
    /// The fields of an `application/x-www-form-urlencoded` body.
    pub(crate) fn parse(body: &[u8]) -> Form {
        Form {
            fields: form_urlencoded::parse(body).into_owned().collect(),
        }
    }

    /// The first value of `name` exactly as sent, blank or not, so that a
    /// check can tell an empty value from a missing field.
    pub(crate) fn raw(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// The first value of `name`, trimmed; `None` when it is missing or
    /// blank.
    pub(crate) fn field(&self, name: &str) -> Option<&str> {
        self.raw(name).map(str::trim).filter(|v| !v.is_empty())
    }

    /// Every value of `name` that is not blank, trimmed, in the order sent.
    pub(crate) fn all(&self, name: &str) -> Vec<&str> {
        self.fields
            .iter()
            .filter(|(key, value)| key == name && !value.trim().is_empty())
            .map(|(_, value)| value.trim())
            .collect()
    }
}

/// A query or form value, trimmed; `None` when it is missing or blank, so an
/// empty filter box filters nothing.
pub(crate) fn non_blank(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// A time from a query or form: RFC 3339, or `YYYY-MM-DDTHH:MM[:SS]` in UTC
/// (what a `datetime-local` input sends). `what` names the field in the
/// refusal.
pub(crate) fn parse_time(what: &str, text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(at) = DateTime::parse_from_rfc3339(text) {
        return Ok(at.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S"] {
        if let Ok(at) = NaiveDateTime::parse_from_str(text, format) {
            return Ok(at.and_utc());
        }
    }
    Err(format!(
        "`{what}` is {text:?}, which is not a time: give RFC 3339 (2026-01-31T12:00:00Z) or \
         2026-01-31T12:00 (UTC)"
    ))
}
