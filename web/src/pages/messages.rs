//! GET `/messages`: one page of a list, by status, name, kind, ordering key
//! and creation time, paged by keyset (`after_at`, `after_id`).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, SecondsFormat, Utc};
use maud::html;
use outbox::{
    ListCursor, ListMessages, MessageKind, MessageStatus, OutboxAdmin, OutboxMessage,
    UnreadableMessage,
};

use super::{Shared, now};
use crate::guard::{csrf_field, require_access};
use crate::input::{non_blank, parse_time};
use crate::refusal::Refusal;
use crate::render::{error_line, query_value, status_label, time};
use crate::response;

/// At most this many store pages are read for one page of a list filtered
/// by something the store does not filter on (kind, ordering key), so a
/// rare kind or key cannot make one request scan the whole table.
const MAX_SCANNED_PAGES: usize = 20;

/// The filters of a list, as given in its query string.
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct ListQuery {
    status: Option<String>,
    name: Option<String>,
    kind: Option<String>,
    key: Option<String>,
    from: Option<String>,
    to: Option<String>,
    after_at: Option<String>,
    after_id: Option<String>,
}

/// A list's filters, parsed.
struct ListFilters {
    status: Option<MessageStatus>,
    name: Option<String>,
    kind: Option<MessageKind>,
    key: Option<String>,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    after: Option<ListCursor>,
}

impl ListQuery {
    /// The filters, or why one of them does not parse.
    fn parse(&self) -> Result<ListFilters, String> {
        let status = non_blank(&self.status)
            .map(|s| {
                s.parse::<MessageStatus>().map_err(|_| {
                    format!("`status` is {s:?}: give pending, claimed, delivered or dead_lettered")
                })
            })
            .transpose()?;
        let kind = non_blank(&self.kind)
            .map(|k| {
                k.parse::<MessageKind>()
                    .map_err(|_| format!("`kind` is {k:?}: give event or job"))
            })
            .transpose()?;
        let from = non_blank(&self.from)
            .map(|t| parse_time("from", t))
            .transpose()?;
        let to = non_blank(&self.to)
            .map(|t| parse_time("to", t))
            .transpose()?;
        let after = match (non_blank(&self.after_at), self.after_id.as_deref()) {
            (Some(at), Some(id)) => Some(ListCursor {
                created_at: parse_time("after_at", at)?,
                id: id.to_owned(),
            }),
            (None, None) => None,
            _ => return Err("`after_at` and `after_id` go together".to_owned()),
        };
        Ok(ListFilters {
            status,
            name: non_blank(&self.name).map(str::to_owned),
            kind,
            key: non_blank(&self.key).map(str::to_owned),
            from,
            to,
            after,
        })
    }

    /// This query continued after `cursor`.
    fn next_link(&self, cursor: &ListCursor) -> String {
        let mut link = form_urlencoded::Serializer::new(String::new());
        for (key, value) in [
            ("status", &self.status),
            ("name", &self.name),
            ("kind", &self.kind),
            ("key", &self.key),
            ("from", &self.from),
            ("to", &self.to),
        ] {
            if let Some(value) = non_blank(value) {
                link.append_pair(key, value);
            }
        }
        link.append_pair(
            "after_at",
            &cursor
                .created_at
                .to_rfc3339_opts(SecondsFormat::AutoSi, true),
        );
        link.append_pair("after_id", &cursor.id);
        format!("messages?{}", link.finish())
    }
}

/// The messages that match, up to the page size, the rows that do not read
/// back as messages, and a link on when there may be more. A list of dead
/// letters on a writable dashboard also has the requeue forms.
pub(crate) async fn page<S: OutboxAdmin>(
    req: HttpRequest,
    dashboard: Shared<S>,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, Refusal> {
    require_access(&req, &dashboard.config)?;
    let filters = query.parse().map_err(Refusal::BadFilter)?;
    let limit = dashboard.config.page_size.clamp(1, 1_000);
    // `(created_at, id) > (from, "")` is every message created at or after
    // `from`: ids are never empty.
    let mut after = filters
        .after
        .clone()
        .or(filters.from.map(|from| ListCursor {
            created_at: from,
            id: String::new(),
        }));
    let mut shown: Vec<OutboxMessage> = Vec::new();
    let mut unreadable: Vec<UnreadableMessage> = Vec::new();
    let mut next = None;
    let mut scanned = 0;
    'pages: loop {
        let batch = dashboard
            .store
            .list_messages(ListMessages {
                status: filters.status,
                name: filters.name.clone(),
                limit,
                after: after.clone(),
            })
            .await?;
        scanned += 1;
        unreadable.extend(batch.unreadable);
        for message in batch.messages {
            if filters.to.is_some_and(|to| message.created_at >= to) {
                break 'pages;
            }
            if filters.kind.is_some_and(|kind| kind != message.kind) {
                continue;
            }
            if filters
                .key
                .as_deref()
                .is_some_and(|key| message.ordering_key.as_deref() != Some(key))
            {
                continue;
            }
            shown.push(message);
            if shown.len() == limit {
                let last = shown.last().expect("just pushed");
                next = Some(ListCursor {
                    created_at: last.created_at,
                    id: last.id.clone(),
                });
                break 'pages;
            }
        }
        match batch.next {
            Some(cursor) if scanned < MAX_SCANNED_PAGES => after = Some(cursor),
            Some(cursor) => {
                next = Some(cursor);
                break;
            }
            None => break,
        }
    }
    let now = now();
    let title = match filters.status {
        Some(status) => format!("Messages: {}", status_label(status)),
        None => "Messages".to_owned(),
    };
    let dead_letters = filters.status == Some(MessageStatus::DeadLettered);
    let show_actions = !dashboard.config.read_only;
    let status_value = filters.status.map(MessageStatus::as_str).unwrap_or("");
    let selectable = dead_letters && show_actions;
    let table = html! {
        table #messages {
            tr {
                @if selectable { th { } }
                th { "Id" } th { "Kind" } th { "Name" } th { "Key" } th { "Status" } th { "Attempts" }
                th { "Created" } th { "Available" } th { "Last error" }
            }
            @for message in &shown {
                tr {
                    @if selectable {
                        td { input type="checkbox" name="id" value=(message.id); }
                    }
                    td { a href=(format!("message?id={}", query_value(&message.id))) { (message.id) } }
                    td { (message.kind) } td { (message.name) }
                    td { (message.ordering_key.as_deref().unwrap_or("")) }
                    td { (message.status) }
                    td { (message.attempts) "/" (message.effective_max_attempts(dashboard.config.max_attempts)) }
                    td { (time(message.created_at, now)) }
                    td { (time(message.available_at, now)) }
                    td { (error_line(message)) }
                }
            }
        }
    };
    Ok(response::page(StatusCode::OK, &title, None, || {
        html! {
            form method="get" action="messages" {
                input type="hidden" name="status" value=(status_value);
                label { "Name " input type="text" name="name" value=[filters.name.as_deref()]; } " "
                label { "Kind " select name="kind" {
                    option value="" { "any" }
                    option value="event" selected[filters.kind == Some(MessageKind::Event)] { "event" }
                    option value="job" selected[filters.kind == Some(MessageKind::Job)] { "job" }
                } } " "
                label { "Key " input type="text" name="key" value=[filters.key.as_deref()]; } " "
                label { "Created from " input type="text" name="from" placeholder="2026-01-31T12:00Z" value=[non_blank(&query.from)]; } " "
                label { "to " input type="text" name="to" placeholder="2026-01-31T13:00Z" value=[non_blank(&query.to)]; } " "
                button type="submit" { "Filter" }
            }
            @if shown.is_empty() && unreadable.is_empty() {
                p #empty { "No messages match." }
            }
            @if !shown.is_empty() {
                @if dead_letters && show_actions {
                    form method="post" action="requeue" id="selected"
                        data-confirm="Requeue the selected dead letters?" {
                        (csrf_field())
                        (table)
                        button type="submit" { "Requeue selected" }
                    }
                } @else {
                    (table)
                }
            }
            @if !unreadable.is_empty() {
                h2 { "Rows that do not read back as messages" }
                table { tr { th { "Id" } th { "Created" } th { "Why" } }
                    @for row in &unreadable {
                        tr { td { (row.id) } td {
                            @if let Some(at) = row.created_at { (time(at, now)) }
                        } td { (row.reason) } }
                    }
                }
            }
            @if let Some(cursor) = &next {
                p { a #next href=(query.next_link(cursor)) { "Next page →" } }
            }
            @if dead_letters && show_actions {
                h2 { "Requeue every dead letter" }
                form method="post" action="requeue" data-confirm="Requeue every dead letter of this name (every dead letter when no name is given)?" {
                    (csrf_field())
                    input type="hidden" name="all" value="1";
                    label { "Name (empty: every name) " input type="text" name="name" value=[filters.name.as_deref()]; } " "
                    button type="submit" { "Requeue all" }
                }
            }
        }
    }))
}
