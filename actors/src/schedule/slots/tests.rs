//! Slots across daylight saving time, intervals in odd zones, and the
//! search's edges. Europe/Paris moves to summer time on 29 March 2026 at
//! 02:00 (to 03:00, 01:00 UTC) and back on 25 October 2026 at 03:00 (to
//! 02:00, 01:00 UTC).

use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;

use super::{Cadence, Slots};

fn utc(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .expect("an RFC 3339 time")
        .with_timezone(&Utc)
}

fn cron(expression: &str, zone: &str) -> Slots {
    let cron = croner::Cron::from_str(expression).expect("a cron expression");
    Slots::new(
        Cadence::Cron(Box::new(cron)),
        zone.parse::<Tz>().expect("a zone"),
    )
}

fn every(interval: chrono::Duration, zone: &str) -> Slots {
    Slots::new(
        Cadence::Every(interval),
        zone.parse::<Tz>().expect("a zone"),
    )
}

/// The slots after `from` up to and including `to`.
fn between(slots: &Slots, from: &str, to: &str) -> Vec<String> {
    let (mut at, to) = (utc(from), utc(to));
    let mut found = Vec::new();
    while let Some(next) = slots.next_after(at).filter(|&next| next <= to) {
        found.push(next.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
        at = next;
    }
    found
}

#[test]
fn a_fixed_time_in_the_spring_gap_runs_right_after_it() {
    let slots = cron("30 2 * * *", "Europe/Paris");
    assert_eq!(
        between(&slots, "2026-03-27T12:00:00Z", "2026-03-30T12:00:00Z"),
        [
            "2026-03-28T01:30:00Z", // 02:30 CET
            "2026-03-29T01:00:00Z", // 02:30 does not exist: 03:00 CEST
            "2026-03-30T00:30:00Z", // 02:30 CEST
        ]
    );
}

#[test]
fn steps_skip_the_times_in_the_spring_gap() {
    let slots = cron("*/30 * * * *", "Europe/Paris");
    assert_eq!(
        between(&slots, "2026-03-29T00:00:00Z", "2026-03-29T01:30:00Z"),
        [
            "2026-03-29T00:30:00Z", // 01:30 CET
            "2026-03-29T01:00:00Z", // 03:00 CEST; 02:00 and 02:30 never were
            "2026-03-29T01:30:00Z", // 03:30 CEST
        ]
    );
}

#[test]
fn a_fixed_time_in_the_autumn_repeat_runs_once() {
    let slots = cron("30 2 * * *", "Europe/Paris");
    assert_eq!(
        between(&slots, "2026-10-24T12:00:00Z", "2026-10-26T12:00:00Z"),
        [
            "2026-10-25T00:30:00Z", // the first 02:30, CEST
            "2026-10-26T01:30:00Z", // the next day's, CET; not 01:30Z on the 25th
        ]
    );
}

#[test]
fn steps_run_in_both_passes_of_the_autumn_repeat() {
    let slots = cron("*/30 * * * *", "Europe/Paris");
    assert_eq!(
        between(&slots, "2026-10-24T23:45:00Z", "2026-10-25T02:00:00Z"),
        [
            "2026-10-25T00:00:00Z", // 02:00 CEST
            "2026-10-25T00:30:00Z", // 02:30 CEST
            "2026-10-25T01:00:00Z", // 02:00 CET, the second pass
            "2026-10-25T01:30:00Z", // 02:30 CET
            "2026-10-25T02:00:00Z", // 03:00 CET
        ]
    );
}

#[test]
fn cron_fields_are_read_on_the_zones_wall_clock() {
    let slots = cron("0 9 * * MON", "America/New_York");
    assert_eq!(
        between(&slots, "2026-03-01T00:00:00Z", "2026-03-10T00:00:00Z"),
        [
            "2026-03-02T14:00:00Z", // 09:00 EST
            "2026-03-09T13:00:00Z", // 09:00 EDT, after the 8 March change
        ]
    );
}

#[test]
fn an_interval_keeps_real_spacing_across_a_change() {
    let slots = every(chrono::Duration::hours(6), "Europe/Paris");
    assert_eq!(
        between(&slots, "2026-03-28T12:00:00Z", "2026-03-29T12:00:00Z"),
        [
            "2026-03-28T17:00:00Z", // 18:00 CET
            "2026-03-28T23:00:00Z", // 00:00 CET
            "2026-03-29T05:00:00Z", // 07:00 CEST: the wall clock moved, the slots did not
            "2026-03-29T11:00:00Z",
        ]
    );
}

#[test]
fn an_interval_counts_from_the_zones_midnight() {
    let slots = every(chrono::Duration::hours(1), "Asia/Kolkata");
    assert_eq!(
        between(&slots, "2026-01-01T00:00:00Z", "2026-01-01T02:00:00Z"),
        ["2026-01-01T00:30:00Z", "2026-01-01T01:30:00Z"]
    );
    let utc_slots = every(chrono::Duration::minutes(15), "UTC");
    assert_eq!(
        utc_slots.next_after(utc("2026-01-01T00:14:59.999999Z")),
        Some(utc("2026-01-01T00:15:00Z"))
    );
    assert_eq!(
        utc_slots.next_after(utc("2026-01-01T00:15:00Z")),
        Some(utc("2026-01-01T00:30:00Z"))
    );
}

#[test]
fn first_from_includes_a_slot_at_the_start() {
    let slots = cron("* * * * *", "UTC");
    let minute = Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 0).unwrap();
    assert_eq!(slots.first_from(minute), Some(minute));
    let later = minute + chrono::Duration::milliseconds(1);
    assert_eq!(
        slots.first_from(later),
        Some(minute + chrono::Duration::minutes(1))
    );
    assert_eq!(
        slots.next_after(later),
        Some(minute + chrono::Duration::minutes(1)),
        "a time within a second is past that second's slot"
    );
    let every = every(chrono::Duration::minutes(1), "UTC");
    assert_eq!(every.first_from(minute), Some(minute));
    assert_eq!(
        every.first_from(later),
        Some(minute + chrono::Duration::minutes(1))
    );
}

#[test]
fn seconds_are_optional() {
    let slots = cron("*/20 * * * * *", "UTC");
    assert_eq!(
        between(&slots, "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"),
        [
            "2026-01-01T00:00:20Z",
            "2026-01-01T00:00:40Z",
            "2026-01-01T00:01:00Z"
        ]
    );
}

#[test]
fn an_expression_that_never_matches_has_no_slot() {
    let slots = cron("0 0 30 2 *", "UTC");
    assert_eq!(slots.next_after(utc("2026-01-01T00:00:00Z")), None);
}
