//! The operator commands: `migrate`, `status`, `list`, `show`, `requeue`, `skip`, `purge`.

use std::io::{BufRead, IsTerminal, Write};

use chrono::{DateTime, Utc};
use outbox::kit::check;
use outbox::{
    AnyOutbox, BlockedKey, Clock, ListCursor, ListMessages, MessagePage, OutboxAdmin,
    OutboxMessage, OutboxStats, PurgeMessages, QueueState, RequeueDeadLetters, ScheduleState,
    SkipDeadLetter, SystemClock, UnreadableMessage,
};
use serde::Serialize;

use crate::cli::{ListArgs, PurgeArgs, RequeueArgs, ShowArgs, SkipArgs, StatusArgs};
use crate::fail::Failure;
use crate::output::{Table, age, pretty, pretty_json, relative, relative_short, time, truncate};
use crate::schedules;

/// Most blocked keys `status` prints.
const BLOCKED_SHOWN: usize = 20;

type Outcome = Result<(), Failure>;

/// `migrate`: create or upgrade the table and say which migrations ran.
pub(crate) async fn migrate(store: &AnyOutbox) -> Outcome {
    let table = store.table().to_string();
    let existed = store.table_exists().await?;
    let before = store.applied_migrations().await?;
    store.setup().await?;
    let after = store.applied_migrations().await?;
    let known = store.migrator();
    let describe = |version: i64| {
        let description = known
            .iter()
            .find(|migration| migration.version == version)
            .map_or("", |migration| &*migration.description);
        format!("{version:04} {description}").trim_end().to_owned()
    };
    let applied: Vec<i64> = after
        .iter()
        .copied()
        .filter(|v| !before.contains(v))
        .collect();
    if applied.is_empty() {
        outln!(
            "table {table} is up to date: {} of {} migrations applied earlier; nothing to do",
            after.len(),
            known.iter().count()
        );
        return Ok(());
    }
    let verb = if existed { "upgraded" } else { "created" };
    outln!(
        "{verb} table {table}: applied {} migration{}",
        applied.len(),
        plural(applied.len() as u64)
    );
    for version in applied {
        outln!("  {}", describe(version));
    }
    Ok(())
}

/// `status`: counts per status and the health figures.
pub(crate) async fn status(store: &AnyOutbox, args: StatusArgs) -> Outcome {
    let now = SystemClock.now();
    let stats = store.stats(now).await?;
    let blocked = if stats.blocked_keys > 0 {
        store.blocked_keys(BLOCKED_SHOWN).await?
    } else {
        Vec::new()
    };
    let queues = store.queues().await?;
    let oldest_age = stats
        .oldest_due_at
        .map(|at| (now - at).to_std().unwrap_or_default());
    let schedules = schedules::read(store).await?;
    if args.json {
        let document = StatusDocument {
            table: store.table().to_string(),
            now,
            total: stats.total(),
            stats,
            oldest_due_age_seconds: oldest_age.map(|age| age.as_secs_f64()),
            blocked: &blocked,
            queues: &queues,
            schedules: schedules.states(),
        };
        outln!("{}", pretty(&document));
        return Ok(());
    }
    let due = match (stats.oldest_due_at, oldest_age) {
        (Some(at), Some(span)) => format!(
            "oldest due message waiting {} (since {})",
            age(span, usize::MAX),
            time(at)
        ),
        _ => "none due".to_owned(),
    };
    let claims = format!(
        "{} live, {} past their lease",
        stats.live_claims, stats.expired_claims
    );
    let pending = stats.pending.to_string();
    let mut table = Table::new(&["pending", &pending, &due]);
    table.row(vec!["claimed".into(), stats.claimed.to_string(), claims]);
    table.row(vec![
        "delivered".into(),
        stats.delivered.to_string(),
        String::new(),
    ]);
    table.row(vec![
        "dead_lettered".into(),
        stats.dead_lettered.to_string(),
        String::new(),
    ]);
    table.row(vec![
        "cancelled".into(),
        stats.cancelled.to_string(),
        String::new(),
    ]);
    table.row(vec![
        "total".into(),
        stats.total().to_string(),
        String::new(),
    ]);
    outln!("outbox table {}", store.table());
    out!("{}", table.render());
    // One queue, served, is the usual case: a table of it says nothing.
    let only_default = matches!(
        &queues[..],
        [] | [QueueState {
            paused_at: None,
            ..
        }]
    ) && queues.iter().all(|q| q.queue == outbox::DEFAULT_QUEUE);
    if !only_default {
        outln!("\nqueues:");
        let mut rows = Table::new(&["QUEUE", "PENDING", "CLAIMED", "STATE"]);
        for queue in &queues {
            let state = match queue.paused_at {
                Some(at) => format!(
                    "paused since {} (`outbox resume {}`)",
                    time(at),
                    queue.queue
                ),
                None => "served".to_owned(),
            };
            rows.row(vec![
                queue.queue.clone(),
                queue.pending.to_string(),
                queue.claimed.to_string(),
                state,
            ]);
        }
        out!("{}", rows.render());
    }
    if !blocked.is_empty() {
        outln!(
            "\n{} ordering key{} held by a dead letter (under ordering.on_dead_letter = \"block\" \
             their later messages wait; `outbox requeue ID` retries the head, `outbox skip ID` \
             lets the key go on without it):",
            stats.blocked_keys,
            plural(stats.blocked_keys)
        );
        let mut keys = Table::new(&["KEY", "HEAD (DEAD LETTER)", "NAME", "WAITING"]);
        for key in &blocked {
            keys.row(vec![
                truncate(&key.ordering_key, 40),
                key.head_id.clone(),
                key.head_name.clone(),
                key.waiting.to_string(),
            ]);
        }
        out!("{}", keys.render());
        if stats.blocked_keys > blocked.len() as u64 {
            outln!("... and {} more", stats.blocked_keys - blocked.len() as u64);
        }
    }
    if stats.expired_claims > 0 {
        outln!(
            "\n{} claimed message{} outlived {} lease (its worker stopped or stalled); \
             the next drain takes {} over.",
            stats.expired_claims,
            plural(stats.expired_claims),
            if stats.expired_claims == 1 {
                "its"
            } else {
                "their"
            },
            if stats.expired_claims == 1 {
                "it"
            } else {
                "them"
            },
        );
    }
    schedules::print(&schedules, now);
    Ok(())
}

/// What `status --json` prints.
#[derive(Serialize)]
struct StatusDocument<'a> {
    table: String,
    now: DateTime<Utc>,
    #[serde(flatten)]
    stats: OutboxStats,
    total: u64,
    oldest_due_age_seconds: Option<f64>,
    /// The first blocked ordering keys, by key.
    blocked: &'a [BlockedKey],
    /// Every queue with pending or claimed messages, and every paused one.
    queues: &'a [QueueState],
    /// The periodic schedules, by name.
    schedules: &'a [ScheduleState],
}

/// What `list --json` prints.
#[derive(Serialize)]
struct PageDocument<'a> {
    messages: &'a [OutboxMessage],
    /// Rows that do not read back as messages, with their raw columns.
    unreadable: &'a [UnreadableMessage],
    next: Option<String>,
}

/// What `show --json` prints for a row that does not read back as a message.
#[derive(Serialize)]
struct UnreadableDocument<'a> {
    unreadable: bool,
    #[serde(flatten)]
    row: &'a UnreadableMessage,
}

/// A row of the listing: its `created_at` (when readable) and id, which
/// order it, and its cells.
type ListedRow<'a> = (Option<DateTime<Utc>>, &'a str, Vec<String>);

/// `list`: one page, oldest first, and how to get the next.
pub(crate) async fn list(store: &AnyOutbox, table_flag: Option<&str>, args: ListArgs) -> Outcome {
    let after = args.after.as_deref().map(decode_cursor).transpose()?;
    let page = store
        .list_messages(ListMessages {
            status: args.status,
            name: args.name.clone(),
            limit: usize::from(args.limit),
            after,
        })
        .await?;
    let page = MessagePage::new(
        page.messages
            .iter()
            .map(|message| effective(message, args.max_attempts))
            .collect(),
        page.next.clone(),
    )
    .with_unreadable(page.unreadable);
    let next = page.next.as_ref().map(encode_cursor);
    if args.json {
        let document = PageDocument {
            messages: &page.messages,
            unreadable: &page.unreadable,
            next,
        };
        outln!("{}", pretty(&document));
        return Ok(());
    }
    if page.messages.is_empty() && page.unreadable.is_empty() {
        outln!("no messages{}", filters(&args));
        return Ok(());
    }
    let now = SystemClock.now();
    let mut table = Table::new(&[
        "ID",
        "NAME",
        "KIND",
        "STATUS",
        "ATTEMPTS",
        "AVAILABLE",
        "UPDATED",
        "LAST ERROR",
        "KEY",
    ]);
    // The store's order, (created_at, id), with the unreadable rows in
    // their place; a row whose time cannot be read comes last.
    let mut rows: Vec<ListedRow<'_>> = Vec::new();
    for message in &page.messages {
        let cells = vec![
            message.id.clone(),
            message.name.clone(),
            message.kind.to_string(),
            message.status.to_string(),
            format!("{}/{}", message.attempts, message.max_attempts),
            relative_short(now, message.available_at),
            relative_short(now, message.updated_at),
            message
                .last_error
                .as_ref()
                .map_or_else(|| "-".to_owned(), |e| truncate(&e.message, 60)),
            message
                .ordering_key
                .as_deref()
                .map_or_else(|| "-".to_owned(), |key| truncate(key, 30)),
        ];
        rows.push((Some(message.created_at), &message.id, cells));
    }
    for row in &page.unreadable {
        let raw = |column: &str| truncate(row.column(column).unwrap_or("-"), 30);
        let cells = vec![
            row.id.clone(),
            raw("name"),
            raw("kind"),
            "UNREADABLE".to_owned(),
            format!("{}/{}", raw("attempts"), raw("max_attempts")),
            "-".to_owned(),
            "-".to_owned(),
            truncate(&format!("does not decode: {}", row.reason), 60),
            raw("ordering_key"),
        ];
        rows.push((row.created_at, &row.id, cells));
    }
    rows.sort_by(|a, b| (a.0.is_none(), a.0, a.1).cmp(&(b.0.is_none(), b.0, b.1)));
    for (_, _, cells) in rows {
        table.row(cells);
    }
    out!("{}", table.render());
    if let Some(first) = page.unreadable.first() {
        outln!(
            "\n{} row{} cannot be read as a message (marked UNREADABLE); see the raw columns \
             with `outbox show {}`",
            page.unreadable.len(),
            plural(page.unreadable.len() as u64),
            first.id
        );
    }
    let shown = (page.messages.len() + page.unreadable.len()) as u64;
    match next {
        Some(cursor) => {
            let mut command = String::from("outbox");
            if let Some(table) = table_flag {
                command.push_str(&format!(" --table {table}"));
            }
            command.push_str(" list");
            if let Some(status) = args.status {
                command.push_str(&format!(" --status {status}"));
            }
            if let Some(name) = &args.name {
                command.push_str(&format!(" --name {}", shell_quote(name)));
            }
            command.push_str(&format!(" --limit {} --after {cursor}", args.limit));
            outln!(
                "\n{shown} message{} shown; next page: {command}",
                plural(shown)
            );
        }
        None => outln!("\n{shown} message{}; no more pages", plural(shown)),
    }
    Ok(())
}

fn filters(args: &ListArgs) -> String {
    let mut out = String::new();
    if let Some(status) = args.status {
        out.push_str(&format!(" with status {status}"));
    }
    if let Some(name) = &args.name {
        out.push_str(&format!(" named {name:?}"));
    }
    if args.after.is_some() {
        out.push_str(" after this cursor");
    }
    out
}

/// `message` with the attempt cap that applies to it under drains capped at
/// `drain_cap`, rather than the one stored.
fn effective(message: &OutboxMessage, drain_cap: u32) -> OutboxMessage {
    OutboxMessage {
        max_attempts: message.effective_max_attempts(drain_cap),
        ..message.clone()
    }
}

/// `show`: every field of one message.
pub(crate) async fn show(store: &AnyOutbox, args: ShowArgs) -> Outcome {
    let message = match store.get_message(&args.id).await {
        Err(outbox::Error::Unreadable(row)) => {
            if args.json {
                let document = UnreadableDocument {
                    unreadable: true,
                    row: &row,
                };
                outln!("{}", pretty(&document));
            } else {
                out!("{}", describe_unreadable(&row));
            }
            return Ok(());
        }
        other => effective(&other?, args.max_attempts),
    };
    if args.json {
        outln!("{}", pretty(&message));
        return Ok(());
    }
    out!("{}", describe(&message, SystemClock.now()));
    Ok(())
}

fn describe(message: &OutboxMessage, now: DateTime<Utc>) -> String {
    let when = |at: DateTime<Utc>| format!("{}  ({})", time(at), relative(now, at));
    let mut fields = Table::new(&["id", &message.id]);
    let mut field = |name: &str, value: String| fields.row(vec![name.to_owned(), value]);
    field("kind", message.kind.to_string());
    field("name", message.name.clone());
    field("status", message.status.to_string());
    field("queue", message.queue.clone());
    field("priority", message.priority.to_string());
    if let Some(requested) = message.cancel_requested_at {
        field("cancel requested", when(requested));
    }
    field(
        "attempts",
        format!(
            "{} of {} ({})",
            message.attempts,
            message.max_attempts,
            if message.max_attempts_set {
                "its own cap"
            } else {
                "the drain's cap"
            }
        ),
    );
    field("available at", when(message.available_at));
    field(
        "ordering key",
        message
            .ordering_key
            .clone()
            .unwrap_or_else(|| "-".to_owned()),
    );
    if let Some(skipped) = message.skipped_at {
        field("skipped at", when(skipped));
    }
    field("created at", when(message.created_at));
    field("updated at", when(message.updated_at));
    field(
        "delivered at",
        message.delivered_at.map_or_else(|| "-".to_owned(), when),
    );
    match (
        &message.claim_token,
        message.claimed_at,
        message.locked_until,
    ) {
        (Some(token), claimed_at, Some(until)) => {
            let lease = if until > now {
                format!(
                    "live for {}",
                    age((until - now).to_std().unwrap_or_default(), 2)
                )
            } else {
                "expired: the next drain takes it over".to_owned()
            };
            field("claim token", token.clone());
            if let Some(claimed_at) = claimed_at {
                field("claimed at", when(claimed_at));
            }
            field("locked until", format!("{}  ({lease})", time(until)));
        }
        _ => field("claim", "-".to_owned()),
    }
    match &message.trace {
        Some(trace) => {
            field("traceparent", trace.traceparent.clone());
            if let Some(state) = &trace.tracestate {
                field("tracestate", state.clone());
            }
        }
        None => field("trace", "-".to_owned()),
    }
    let mut out = fields.render();
    out.push_str("\npayload:\n");
    out.push_str(&indent(&pretty_json(message.payload.as_str())));
    match &message.last_error {
        Some(error) => {
            out.push_str("\nlast error:\n");
            let mut record = Table::new(&["type", &error.type_name]);
            record.row(vec!["message".to_owned(), error.message.clone()]);
            let mut text = record.render();
            for cause in &error.causes {
                text.push_str(&format!("caused by: {cause}\n"));
            }
            if error.truncated {
                text.push_str("(cut to fit the size bound of stored errors)\n");
            }
            out.push_str(&indent(&text));
        }
        None => out.push_str("\nlast error: -\n"),
    }
    out
}

/// A row that does not decode: why, and every column as stored.
fn describe_unreadable(row: &UnreadableMessage) -> String {
    let mut fields = Table::new(&["id", &row.id]);
    fields.row(vec![
        "UNREADABLE".to_owned(),
        format!("the row does not decode: {}", row.reason),
    ]);
    let mut out = fields.render();
    out.push_str("\nraw columns, as stored:\n");
    let mut columns = Table::new(&["COLUMN", "VALUE"]);
    for (name, value) in &row.columns {
        if name == "payload" {
            continue;
        }
        columns.row(vec![
            name.clone(),
            value.clone().unwrap_or_else(|| "NULL".to_owned()),
        ]);
    }
    out.push_str(&indent(&columns.render()));
    out.push_str("\npayload, as stored:\n");
    out.push_str(&indent(row.payload().unwrap_or("NULL")));
    out
}

fn indent(text: &str) -> String {
    text.lines().map(|line| format!("  {line}\n")).collect()
}

/// `requeue`: one dead letter by id, or all of them (of one name).
pub(crate) async fn requeue(store: &AnyOutbox, args: RequeueArgs) -> Outcome {
    let requeued = store
        .requeue_dead_letters(RequeueDeadLetters {
            id: args.id.clone(),
            name: args.name.clone(),
            now: SystemClock.now(),
        })
        .await?;
    match (&args.id, &args.name) {
        (Some(id), _) => outln!("requeued 1 message: {id} is pending again"),
        (None, name) => {
            let named = name
                .as_ref()
                .map(|name| format!(" named {name:?}"))
                .unwrap_or_default();
            if requeued == 0 {
                outln!("no dead-lettered messages{named} to requeue");
            } else {
                outln!(
                    "requeued {requeued} dead-lettered message{}{named}; pending again with \
                     their attempts reset",
                    plural(requeued)
                );
            }
        }
    }
    Ok(())
}

/// `skip`: a dead letter stops holding its ordering key.
pub(crate) async fn skip(store: &AnyOutbox, args: SkipArgs) -> Outcome {
    store
        .skip_dead_letter(SkipDeadLetter {
            id: args.id.clone(),
            now: SystemClock.now(),
        })
        .await?;
    let message = store.get_message(&args.id).await?;
    match message.ordering_key {
        Some(key) => outln!(
            "skipped {}: it stays dead-lettered, and the next message of key {key:?} is \
             delivered without it",
            args.id
        ),
        None => outln!(
            "skipped {}: it stays dead-lettered (it has no ordering key, so nothing waited for it)",
            args.id
        ),
    }
    Ok(())
}

/// `purge`: delete terminal messages older than the horizon, after confirmation.
pub(crate) async fn purge(store: &AnyOutbox, args: PurgeArgs) -> Outcome {
    let now = SystemClock.now();
    let span = chrono::Duration::from_std(args.older_than)
        .map_err(|_| Failure::usage("`--older-than` is too long"))?;
    let horizon = now
        .checked_sub_signed(span)
        .ok_or_else(|| Failure::usage("`--older-than` reaches before the calendar starts"))?;
    let params = PurgeMessages {
        status: Some(args.status),
        older_than: horizon,
    };
    // Refuse what the store would refuse before asking anything.
    check::purge(&params)?;
    let what = format!(
        "{} messages that last changed before {} (more than {} ago)",
        args.status,
        time(horizon),
        humantime::format_duration(args.older_than)
    );
    if !args.yes {
        confirm(
            &format!(
                "Delete {what} from table {}? This cannot be undone.",
                store.table()
            ),
            "purge",
        )?;
    }
    let purged = store.purge(params).await?;
    outln!(
        "purged {purged} {} message{} that last changed before {}",
        args.status,
        plural(purged),
        time(horizon)
    );
    Ok(())
}

/// Ask on the terminal before `action`; refuse when there is none to ask
/// on.
pub(crate) fn confirm(question: &str, action: &str) -> Outcome {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::usage(format!(
            "refusing to {action} without confirmation: standard input is not a terminal"
        ))
        .hint(format!("pass --yes to {action} without being asked")));
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush().ok();
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure::operational(format!("cannot read the answer: {e}")))?;
    if matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
        Ok(())
    } else {
        Err(Failure::operational(format!(
            "{action} called off; nothing was changed"
        )))
    }
}

/// A listing cursor as one shell-safe word: `<created_at µs>-<id>` when the
/// id is made of letters, digits, `-`, `_` and `.` (generated ids are), else
/// `<created_at µs>x<id in hex>`.
pub(crate) fn encode_cursor(cursor: &ListCursor) -> String {
    let micros = cursor.created_at.timestamp_micros();
    let plain = !cursor.id.is_empty()
        && cursor
            .id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if plain {
        return format!("{micros}-{}", cursor.id);
    }
    let hex: String = cursor
        .id
        .bytes()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("{micros}x{hex}")
}

fn decode_cursor(text: &str) -> Result<ListCursor, Failure> {
    let invalid = || {
        Failure::usage(format!("invalid `--after` cursor {text:?}"))
            .hint("pass the cursor printed under the previous page (or its `next` in --json)")
    };
    // Listed messages were created after 1970, so the time has no sign.
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(invalid)?;
    let created_at = text[..split]
        .parse::<i64>()
        .ok()
        .and_then(DateTime::from_timestamp_micros)
        .ok_or_else(invalid)?;
    let mut rest = text[split..].chars();
    let id = match (rest.next(), rest.as_str()) {
        (Some('-'), id) if !id.is_empty() => id.to_owned(),
        (Some('x'), hex) if !hex.is_empty() && hex.len() % 2 == 0 => {
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                .collect::<Option<Vec<u8>>>()
                .ok_or_else(invalid)?;
            String::from_utf8(bytes).map_err(|_| invalid())?
        }
        _ => return Err(invalid()),
    };
    Ok(ListCursor { created_at, id })
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `text` as one shell word.
fn shell_quote(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/@".contains(c));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject_garbage() {
        let at = DateTime::from_timestamp_micros(1_746_000_000_123_456).unwrap();
        let cursor = |id: &str| ListCursor {
            created_at: at,
            id: id.to_owned(),
        };
        let generated = cursor("0196a1b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b");
        let text = encode_cursor(&generated);
        assert_eq!(
            text,
            "1746000000123456-0196a1b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b"
        );
        assert_eq!(decode_cursor(&text).unwrap(), generated);
        for id in ["order 7/ü", "it's"] {
            let text = encode_cursor(&cursor(id));
            assert!(text.chars().all(|c| c.is_ascii_alphanumeric()), "{text}");
            assert_eq!(decode_cursor(&text).unwrap(), cursor(id));
        }
        for bad in [
            "", "12", "x61", "12-", "12x", "12x6", "12xzz", "12xff", "12.a", "12üx",
        ] {
            assert!(decode_cursor(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_are_quoted_for_the_shell_when_needed() {
        assert_eq!(shell_quote("order.placed"), "order.placed");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
