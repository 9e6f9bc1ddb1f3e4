//! When a schedule's slots fall: a cron expression read on a time zone's
//! wall clock, or a fixed interval in real time.
//!
//! Slots are found by searching forward only, so every process that runs a
//! schedule finds the same instants whatever time it starts from.
//!
//! # Daylight saving time
//!
//! Cron expressions follow the wall clock of their zone, as `croner` reads
//! it (the Open Cron Pattern Specification's rules):
//!
//! - a wall-clock time the clocks skip (spring forward, 02:30 in a gap from
//!   02:00 to 03:00) does not exist: an expression with one fixed second,
//!   minute and hour (`30 2 * * *`) runs at the first instant after the gap
//!   that day (03:00); one with wildcards or steps in those fields
//!   (`*/15 * * * *`) skips the times in the gap;
//! - a wall-clock time the clocks repeat (fall back, 01:30 twice): a fixed
//!   time runs once, at its first occurrence; wildcards and steps run at
//!   both.
//!
//! An interval counts real time from its anchor, midnight of 1 January 1970
//! on the zone's clock (so `every 1h` in a zone half an hour off UTC falls
//! on its whole hours), and daylight saving time does not move it: its slots
//! keep their spacing and their wall-clock times shift by the change.

use chrono::{DateTime, NaiveDate, SubsecRound, TimeZone, Utc};
use chrono_tz::Tz;

/// The cadence of a checked schedule.
#[derive(Debug, Clone)]
pub(crate) enum Cadence {
    /// A cron expression, read in the zone; boxed, as a parsed pattern is
    /// twenty times an interval's size.
    Cron(Box<croner::Cron>),
    /// A fixed interval, from the zone's 1970 midnight; positive.
    Every(chrono::Duration),
}

/// The slots of one schedule.
#[derive(Debug, Clone)]
pub(crate) struct Slots {
    /// Its cadence.
    cadence: Cadence,
    /// The zone the cadence is read in.
    zone: Tz,
    /// Where an interval counts from.
    anchor: DateTime<Utc>,
}

impl Slots {
    pub(crate) fn new(cadence: Cadence, zone: Tz) -> Self {
        let midnight = NaiveDate::from_ymd_opt(1970, 1, 1)
            .and_then(|date| date.and_hms_opt(0, 0, 0))
            .expect("a valid date");
        let anchor = zone
            .from_local_datetime(&midnight)
            .earliest()
            .map_or(DateTime::UNIX_EPOCH, |at| at.with_timezone(&Utc));
        Slots {
            cadence,
            zone,
            anchor,
        }
    }

    /// The first slot strictly after `t`; `None` when there is none before
    /// the year 5000 (a cron expression that never matches again).
    pub(crate) fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.cadence {
            Cadence::Cron(cron) => {
                // The search works in whole seconds and starts at the next
                // one; from `t` rounded down, that is after `t`.
                let from = t.trunc_subsecs(0).with_timezone(&self.zone);
                cron.find_next_occurrence(&from, false)
                    .ok()
                    .map(|at| at.with_timezone(&Utc))
            }
            Cadence::Every(interval) => {
                let step = interval.num_microseconds()?;
                let since = (t - self.anchor).num_microseconds()?;
                let index = since.div_euclid(step) + 1;
                let offset = index.checked_mul(step)?;
                self.anchor
                    .checked_add_signed(chrono::Duration::microseconds(offset))
            }
        }
    }

    /// The first slot at or after `t`.
    pub(crate) fn first_from(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let just_before = t - chrono::Duration::microseconds(1);
        self.next_after(just_before)
    }
}

#[cfg(test)]
mod tests;
