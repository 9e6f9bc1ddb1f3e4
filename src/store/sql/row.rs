//! Message rows: the columns every statement selects, in their order, where
//! a result holds them, and a row's values checked into a message; also the
//! few other columns the shared half writes or reads (a trace carrier, the
//! activity counts).

use chrono::{DateTime, Utc};
use sqlx::{Column, ColumnIndex, Decode, Row};

use crate::error::{Error, ErrorRecord, Result};
use crate::kind::{MessageKind, MessageStatus};
use crate::message::{ClaimedMessage, OutboxMessage};
use crate::payload::Payload;
use crate::trace::TraceCarrier;

/// A stored row with its columns decoded to plain values, before the values
/// are checked.
#[derive(Debug)]
pub(crate) struct MessageRow {
    pub(crate) seq: i64,
    pub(crate) id: String,
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) payload: String,
    pub(crate) trace: Option<String>,
    pub(crate) status: String,
    pub(crate) attempts: i64,
    pub(crate) max_attempts: i64,
    pub(crate) max_attempts_set: bool,
    pub(crate) available_at: DateTime<Utc>,
    pub(crate) claim_token: Option<String>,
    pub(crate) claimed_at: Option<DateTime<Utc>>,
    pub(crate) locked_until: Option<DateTime<Utc>>,
    pub(crate) last_error: Option<String>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
    pub(crate) delivered_at: Option<DateTime<Utc>>,
    pub(crate) ordering_key: Option<String>,
    pub(crate) skipped_at: Option<DateTime<Utc>>,
    pub(crate) queue: String,
    pub(crate) priority: i16,
    pub(crate) cancel_requested_at: Option<DateTime<Utc>>,
}

impl MessageRow {
    fn corrupt(&self, reason: impl Into<String>) -> Error {
        Error::CorruptRow {
            id: self.id.clone(),
            reason: reason.into(),
        }
    }

    fn count(&self, column: &str, value: i64) -> Result<u32> {
        u32::try_from(value).map_err(|_| self.corrupt(format!("{column} is {value}")))
    }

    /// Check the values and build the message.
    pub(crate) fn into_message(mut self) -> Result<OutboxMessage> {
        let kind: MessageKind = self
            .kind
            .parse()
            .map_err(|_| self.corrupt(format!("kind is {:?}", self.kind)))?;
        let status: MessageStatus = self
            .status
            .parse()
            .map_err(|_| self.corrupt(format!("status is {:?}", self.status)))?;
        // Taken, not copied: an error names the row by its id alone.
        let payload = Payload::from_json(std::mem::take(&mut self.payload))
            .map_err(|e| self.corrupt(format!("payload: {e}")))?;
        let trace = match &self.trace {
            Some(text) => Some(
                serde_json::from_str::<TraceCarrier>(text)
                    .map_err(|e| self.corrupt(format!("trace: {e}")))?,
            ),
            None => None,
        };
        let attempts = self.count("attempts", self.attempts)?;
        let max_attempts = self.count("max_attempts", self.max_attempts)?;
        Ok(OutboxMessage {
            id: self.id,
            kind,
            name: self.name,
            payload,
            trace,
            status,
            attempts,
            max_attempts,
            max_attempts_set: self.max_attempts_set,
            available_at: self.available_at,
            claim_token: self.claim_token,
            claimed_at: self.claimed_at,
            locked_until: self.locked_until,
            last_error: self.last_error.as_deref().map(ErrorRecord::from_json),
            created_at: self.created_at,
            updated_at: self.updated_at,
            delivered_at: self.delivered_at,
            ordering_key: self.ordering_key,
            skipped_at: self.skipped_at,
            queue: self.queue,
            priority: self.priority,
            cancel_requested_at: self.cancel_requested_at,
        })
    }
}

/// A just-claimed message as a delivery sees it, under the claim's attempt
/// cap `cap` when the message has none of its own.
pub(crate) fn claimed_view(message: OutboxMessage, cap: u32) -> Result<ClaimedMessage> {
    let max_attempts = message.effective_max_attempts(cap);
    let (Some(claim_token), Some(claimed_at), Some(locked_until)) = (
        message.claim_token,
        message.claimed_at,
        message.locked_until,
    ) else {
        return Err(Error::CorruptRow {
            id: message.id,
            reason: "claimed without a token, claim time or lease".into(),
        });
    };
    Ok(ClaimedMessage {
        id: message.id,
        kind: message.kind,
        name: message.name,
        payload: message.payload,
        trace: message.trace,
        attempts: message.attempts,
        max_attempts,
        max_attempts_set: message.max_attempts_set,
        available_at: message.available_at,
        created_at: message.created_at,
        ordering_key: message.ordering_key,
        queue: message.queue,
        priority: message.priority,
        claim_token,
        claimed_at,
        locked_until,
    })
}

/// `(status, minute since the epoch, count)` rows as per-minute activity.
pub(crate) fn activity_rows(
    rows: Vec<(String, i64, i64)>,
) -> Result<Vec<crate::store::MinuteActivity>> {
    let mut merged = Vec::with_capacity(rows.len());
    for (status, minute, count) in rows {
        let status: MessageStatus = status.parse()?;
        let minute = DateTime::from_timestamp(minute.saturating_mul(60), 0).ok_or_else(|| {
            Error::store(
                "activity",
                std::io::Error::other(format!("minute {minute} is out of range")),
            )
        })?;
        merged.push((minute, status, u64::try_from(count).unwrap_or(0)));
    }
    Ok(crate::store::merge_activity(merged))
}

/// A JSON text column for an optional trace carrier.
pub(crate) fn trace_json(trace: Option<&TraceCarrier>) -> Option<String> {
    trace.map(|t| serde_json::to_string(t).expect("a trace carrier serializes"))
}

/// The columns of a message row, in the order the stores' statements
/// select them (after any columns of their own, such as a claim's outcome).
pub(crate) const MESSAGE_COLUMNS: [&str; 23] = [
    "seq",
    "id",
    "kind",
    "name",
    "payload",
    "trace",
    "status",
    "attempts",
    "max_attempts",
    "available_at",
    "claim_token",
    "claimed_at",
    "locked_until",
    "last_error",
    "created_at",
    "updated_at",
    "delivered_at",
    "ordering_key",
    "skipped_at",
    "max_attempts_set",
    "queue",
    "priority",
    "cancel_requested_at",
];

/// Where a row holds the [`MESSAGE_COLUMNS`].
///
/// A column read by name is a hashed lookup in the row's column map; read
/// by position it is not, and a claim reads twenty columns of every row it
/// claims. Positions are taken from the column named `seq` when every one of
/// the columns follows it in order, checked by name once per result; a
/// statement that selects them in another order is still read right, by
/// name.
pub(crate) struct ColumnPositions {
    /// The position of `seq`, when the columns follow it in order.
    first: Option<usize>,
}

impl ColumnPositions {
    /// Where `row`, and every row of the same result, holds the columns.
    pub(crate) fn of<R: Row>(row: &R) -> Self {
        let columns = row.columns();
        let first = columns
            .iter()
            .position(|c| c.name() == MESSAGE_COLUMNS[0])
            .filter(|&first| {
                MESSAGE_COLUMNS
                    .iter()
                    .enumerate()
                    .all(|(k, name)| columns.get(first + k).is_some_and(|c| c.name() == *name))
            });
        ColumnPositions { first }
    }

    /// The value of the `k`th of [`MESSAGE_COLUMNS`].
    pub(super) fn get<'r, R, T>(&self, row: &'r R, k: usize) -> sqlx::Result<T>
    where
        R: Row,
        T: Decode<'r, R::Database> + sqlx::Type<R::Database>,
        usize: ColumnIndex<R>,
        for<'a> &'a str: ColumnIndex<R>,
    {
        let name = MESSAGE_COLUMNS[k];
        match self.first {
            // Named as a read by name names it: an unreadable row's reason
            // says which column to fix.
            Some(first) => row.try_get(first + k).map_err(|e| match e {
                sqlx::Error::ColumnDecode { source, .. } => sqlx::Error::ColumnDecode {
                    index: format!("{name:?}"),
                    source,
                },
                other => other,
            }),
            None => row.try_get(name),
        }
    }
}
