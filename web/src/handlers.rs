//! The pages and actions. Every handler checks access first; every POST also
//! checks read-only mode and the CSRF token before it reads anything else.

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, NaiveDateTime, SecondsFormat, Utc};
use maud::{Markup, html};
use outbox::{
    Error, ListCursor, ListMessages, MessageKind, MessageStatus, OutboxAdmin, OutboxMessage,
    PurgeMessages, RequeueDeadLetters, RetryNow, UnreadableMessage,
};

use crate::render::{self, activity_chart, error_line, layout, query_value, time};
use crate::{Ctx, WebConfig, authorized, csrf_token, random_hex, same_secret};

type Data<S> = web::Data<Ctx<S>>;

/// A finished page, with the headers every page carries.
fn respond(
    status: StatusCode,
    title: &str,
    refresh: Option<u64>,
    body: impl FnOnce() -> Markup,
) -> HttpResponse {
    let nonce = random_hex(16);
    let page = layout(title, &nonce, refresh, body());
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .insert_header((
            header::CONTENT_SECURITY_POLICY,
            format!(
                "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; \
                 img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
            ),
        ))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        .body(page.into_string())
}

/// A page that only says why a request was refused.
fn refusal(status: StatusCode, title: &str, why: String) -> HttpResponse {
    respond(status, title, None, || {
        html! { p.refused { (why) } p { a href="./" { "Back to the overview" } } }
    })
}

/// The answer for a store error: what went wrong, with a fitting status.
fn store_error(error: &Error) -> HttpResponse {
    let status = match error {
        Error::NotFound { .. } => StatusCode::NOT_FOUND,
        Error::Admin(_) => StatusCode::CONFLICT,
        Error::InvalidInput { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    refusal(status, "Refused", error.to_string())
}

/// 401 unless the request carries the configured token.
fn check_access(req: &HttpRequest, config: &WebConfig) -> Result<(), Box<HttpResponse>> {
    if authorized(req, config) {
        return Ok(());
    }
    Err(Box::new(HttpResponse::Unauthorized()
        .insert_header((
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"outbox\", charset=\"UTF-8\""),
        ))
        .content_type("text/plain; charset=utf-8")
        .body(
            "401 Unauthorized: this dashboard needs its token, as `Authorization: Bearer <token>` \
             or as the password of basic auth (any user name).\n",
        )))
}

/// The fields of a POSTed form, after access, read-only mode and the CSRF
/// token are checked.
fn check_post(
    req: &HttpRequest,
    config: &WebConfig,
    body: &[u8],
) -> Result<Vec<(String, String)>, Box<HttpResponse>> {
    check_access(req, config)?;
    if config.read_only {
        return Err(Box::new(refusal(
            StatusCode::FORBIDDEN,
            "Read-only",
            "403 Forbidden: this dashboard is read-only; nothing was changed.".to_owned(),
        )));
    }
    let fields: Vec<(String, String)> = form_urlencoded::parse(body).into_owned().collect();
    let token = fields
        .iter()
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.as_str());
    match token {
        Some(token) if same_secret(token.as_bytes(), csrf_token().as_bytes()) => Ok(fields),
        Some(_) => Err(Box::new(refusal(
            StatusCode::FORBIDDEN,
            "Refused",
            "403 Forbidden: the form's CSRF token is wrong (the dashboard restarted since the page \
             was loaded, or the request did not come from the dashboard); reload the page and try \
             again. Nothing was changed."
                .to_owned(),
        ))),
        None => Err(Box::new(refusal(
            StatusCode::FORBIDDEN,
            "Refused",
            "403 Forbidden: the request has no CSRF token; changes must be sent from the \
             dashboard's own forms. Nothing was changed."
                .to_owned(),
        ))),
    }
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// The hidden CSRF field every action form carries.
fn csrf_field() -> Markup {
    html! { input type="hidden" name="csrf" value=(csrf_token()); }
}

fn now() -> DateTime<Utc> {
    Utc::now()
}

/// GET `/`: counts, claims, the oldest due message, the last hour.
pub(crate) async fn overview<S: OutboxAdmin>(req: HttpRequest, ctx: Data<S>) -> HttpResponse {
    if let Err(denied) = check_access(&req, &ctx.config) {
        return *denied;
    }
    let now = now();
    let stats = match ctx.store.stats(now).await {
        Ok(stats) => stats,
        Err(e) => return store_error(&e),
    };
    let activity = match ctx
        .store
        .activity(now - chrono::Duration::minutes(59))
        .await
    {
        Ok(activity) => activity,
        Err(e) => return store_error(&e),
    };
    let blocked = if stats.blocked_keys > 0 {
        match ctx.store.blocked_keys(BLOCKED_SHOWN).await {
            Ok(blocked) => blocked,
            Err(e) => return store_error(&e),
        }
    } else {
        Vec::new()
    };
    let refresh = ctx.config.refresh.map(|every| every.as_secs().max(1));
    respond(StatusCode::OK, "Overview", refresh, || {
        html! {
            div.cards {
                @for status in STATUSES {
                    div.card id=(format!("count-{}", status.as_str())) {
                        a href=(format!("messages?status={}", status.as_str())) {
                            b { (stats.count(status)) } (label(status))
                        }
                    }
                }
            }
            table {
                tr { th { "Oldest due message" } td {
                    @match stats.oldest_due_at {
                        Some(at) => (time(at, now)),
                        None => "none due",
                    }
                } }
                tr { th { "Live claims" } td id="live-claims" { (stats.live_claims) } }
                tr { th { "Expired claims" } td id="expired-claims" {
                    (stats.expired_claims)
                    @if stats.expired_claims > 0 {
                        " " span.muted { "(their workers are gone or stuck; the next claim takes them over)" }
                    }
                } }
                tr { th { "All messages" } td { (stats.total()) } }
                tr { th { "Blocked ordering keys" } td id="blocked-keys" { (stats.blocked_keys) } }
            }
            @if !blocked.is_empty() {
                h2 { "Blocked ordering keys" }
                p.muted {
                    "Each key waits on a dead letter; requeue it (it runs again) or skip it "
                    "(`outbox skip ID`: the key moves on without it)."
                }
                table #blocked {
                    tr { th { "Key" } th { "Dead letter at its head" } th { "Name" } th { "Waiting" } }
                    @for key in &blocked {
                        tr {
                            td { a href=(format!("messages?key={}", query_value(&key.ordering_key))) { (key.ordering_key) } }
                            td { a href=(format!("message?id={}", query_value(&key.head_id))) { (key.head_id) } }
                            td { (key.head_name) }
                            td { (key.waiting) }
                        }
                    }
                }
                @if stats.blocked_keys > blocked.len() as u64 {
                    p.muted { "The first " (blocked.len()) " of " (stats.blocked_keys) " by key." }
                }
            }
            h2 { "Delivered and dead-lettered per minute" }
            (activity_chart(&activity, now))
            @if let Some(secs) = refresh {
                p.muted { "This page reloads every " (secs) " s." }
            }
        }
    })
}

/// Blocked keys listed on the overview; the count covers the rest.
const BLOCKED_SHOWN: usize = 20;

const STATUSES: [MessageStatus; 4] = [
    MessageStatus::Pending,
    MessageStatus::Claimed,
    MessageStatus::DeadLettered,
    MessageStatus::Delivered,
];

fn label(status: MessageStatus) -> &'static str {
    match status {
        MessageStatus::Pending => "pending",
        MessageStatus::Claimed => "claimed",
        MessageStatus::Delivered => "delivered",
        MessageStatus::DeadLettered => "dead-lettered",
    }
}

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

fn blank(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// A time from a query: RFC 3339, or `YYYY-MM-DDTHH:MM[:SS]` in UTC (what a
/// `datetime-local` input sends).
fn parse_time(what: &str, text: &str) -> Result<DateTime<Utc>, String> {
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

/// The list's parsed filters.
struct Filters {
    status: Option<MessageStatus>,
    name: Option<String>,
    kind: Option<MessageKind>,
    key: Option<String>,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    after: Option<ListCursor>,
}

impl ListQuery {
    fn parse(&self) -> Result<Filters, String> {
        let status = blank(&self.status)
            .map(|s| {
                s.parse::<MessageStatus>().map_err(|_| {
                    format!("`status` is {s:?}: give pending, claimed, delivered or dead_lettered")
                })
            })
            .transpose()?;
        let kind = blank(&self.kind)
            .map(|k| {
                k.parse::<MessageKind>()
                    .map_err(|_| format!("`kind` is {k:?}: give event or job"))
            })
            .transpose()?;
        let from = blank(&self.from)
            .map(|t| parse_time("from", t))
            .transpose()?;
        let to = blank(&self.to).map(|t| parse_time("to", t)).transpose()?;
        let after = match (blank(&self.after_at), self.after_id.as_deref()) {
            (Some(at), Some(id)) => Some(ListCursor {
                created_at: parse_time("after_at", at)?,
                id: id.to_owned(),
            }),
            (None, None) => None,
            _ => return Err("`after_at` and `after_id` go together".to_owned()),
        };
        Ok(Filters {
            status,
            name: blank(&self.name).map(str::to_owned),
            kind,
            key: blank(&self.key).map(str::to_owned),
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
            if let Some(value) = blank(value) {
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

/// At most this many store pages are read for one page of a list filtered
/// by something the store does not filter on (kind, ordering key), so a
/// rare kind or key cannot make one request scan the whole table.
const MAX_SCANNED_PAGES: usize = 20;

/// GET `/messages`: one page of a list.
pub(crate) async fn list<S: OutboxAdmin>(
    req: HttpRequest,
    ctx: Data<S>,
    query: web::Query<ListQuery>,
) -> HttpResponse {
    if let Err(denied) = check_access(&req, &ctx.config) {
        return *denied;
    }
    let filters = match query.parse() {
        Ok(filters) => filters,
        Err(why) => return refusal(StatusCode::BAD_REQUEST, "Bad filter", why),
    };
    let limit = ctx.config.page_size.clamp(1, 1_000);
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
        let page = match ctx
            .store
            .list_messages(ListMessages {
                status: filters.status,
                name: filters.name.clone(),
                limit,
                after: after.clone(),
            })
            .await
        {
            Ok(page) => page,
            Err(e) => return store_error(&e),
        };
        scanned += 1;
        unreadable.extend(page.unreadable);
        for message in page.messages {
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
        match page.next {
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
        Some(status) => format!("Messages: {}", label(status)),
        None => "Messages".to_owned(),
    };
    let dead_letters = filters.status == Some(MessageStatus::DeadLettered);
    let actions = !ctx.config.read_only;
    let status_value = filters.status.map(MessageStatus::as_str).unwrap_or("");
    let selectable = dead_letters && actions;
    let table = html! {
        table #messages {
            tr {
                @if selectable { th { } }
                th { "Id" } th { "Kind" } th { "Name" } th { "Key" } th { "Status" } th { "Attempts" }
                th { "Created" } th { "Available" } th { "Last error" }
            }
            @for m in &shown {
                tr {
                    @if selectable {
                        td { input type="checkbox" name="id" value=(m.id); }
                    }
                    td { a href=(format!("message?id={}", query_value(&m.id))) { (m.id) } }
                    td { (m.kind) } td { (m.name) }
                    td { (m.ordering_key.as_deref().unwrap_or("")) }
                    td { (m.status) }
                    td { (m.attempts) "/" (m.effective_max_attempts(ctx.config.max_attempts)) }
                    td { (time(m.created_at, now)) }
                    td { (time(m.available_at, now)) }
                    td { (error_line(m)) }
                }
            }
        }
    };
    respond(StatusCode::OK, &title, None, || {
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
                label { "Created from " input type="text" name="from" placeholder="2026-01-31T12:00Z" value=[blank(&query.from)]; } " "
                label { "to " input type="text" name="to" placeholder="2026-01-31T13:00Z" value=[blank(&query.to)]; } " "
                button type="submit" { "Filter" }
            }
            @if shown.is_empty() && unreadable.is_empty() {
                p #empty { "No messages match." }
            }
            @if !shown.is_empty() {
                @if dead_letters && actions {
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
            @if dead_letters && actions {
                h2 { "Requeue every dead letter" }
                form method="post" action="requeue" data-confirm="Requeue every dead letter of this name (every dead letter when no name is given)?" {
                    (csrf_field())
                    input type="hidden" name="all" value="1";
                    label { "Name (empty: every name) " input type="text" name="name" value=[filters.name.as_deref()]; } " "
                    button type="submit" { "Requeue all" }
                }
            }
        }
    })
}

/// The query of the message page.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct MessageQuery {
    id: String,
}

/// GET `/message?id=…`: every field of one message.
pub(crate) async fn message<S: OutboxAdmin>(
    req: HttpRequest,
    ctx: Data<S>,
    query: web::Query<MessageQuery>,
) -> HttpResponse {
    if let Err(denied) = check_access(&req, &ctx.config) {
        return *denied;
    }
    let m = match ctx.store.get_message(&query.id).await {
        Ok(m) => m,
        Err(Error::Unreadable(row)) => return unreadable_page(&row),
        Err(e) => return store_error(&e),
    };
    let now = now();
    let live = m.has_live_claim(now);
    let actions = !ctx.config.read_only;
    respond(StatusCode::OK, &format!("Message {}", m.id), None, || {
        html! {
            table #fields {
                tr { th { "Id" } td { (m.id) } }
                tr { th { "Kind" } td { (m.kind) } }
                tr { th { "Name" } td { (m.name) } }
                tr { th { "Status" } td #status { (m.status) } }
                tr { th { "Attempts" } td {
                    (m.attempts) " of " (m.effective_max_attempts(ctx.config.max_attempts))
                    @if !m.max_attempts_set { " " span.muted { "(the drain's cap)" } }
                } }
                @if let Some(key) = &m.ordering_key {
                    tr { th { "Ordering key" } td {
                        a href=(format!("messages?key={}", query_value(key))) { (key) }
                        @if m.skipped_at.is_some() { " " span.muted { "(skipped: its key moved on)" } }
                    } }
                }
                tr { th { "Available at" } td { (time(m.available_at, now)) } }
                tr { th { "Created at" } td { (time(m.created_at, now)) } }
                tr { th { "Updated at" } td { (time(m.updated_at, now)) } }
                tr { th { "Delivered at" } td { @if let Some(at) = m.delivered_at { (time(at, now)) } @else { "—" } } }
                tr { th { "Claimed at" } td { @if let Some(at) = m.claimed_at { (time(at, now)) } @else { "—" } } }
                tr { th { "Locked until" } td {
                    @if let Some(at) = m.locked_until {
                        (time(at, now)) " " (if live { "(live claim)" } else { "(expired)" })
                    } @else { "—" }
                } }
                tr { th { "Trace" } td {
                    @if let Some(trace) = &m.trace {
                        @if let Some(id) = render::trace_id(&trace.traceparent) {
                            "trace id " code #trace-id { (id) } br;
                        }
                        "traceparent " code { (trace.traceparent) }
                        @if let Some(state) = &trace.tracestate { br; "tracestate " code { (state) } }
                    } @else { "—" }
                } }
            }
            h2 { "Payload" }
            pre #payload { (render::pretty_payload(&m)) }
            h2 { "Last error" }
            @if let Some(error) = &m.last_error {
                p { code { (error.type_name) } }
                pre #last-error { (error.message) }
                @if !error.causes.is_empty() {
                    p { "Caused by:" }
                    ol #causes { @for cause in &error.causes { li { pre { (cause) } } } }
                }
                @if error.truncated { p.muted { "(cut to fit the stored size bound)" } }
            } @else { p { "none" } }
            @if actions && !live {
                @if m.status == MessageStatus::DeadLettered {
                    form method="post" action="requeue" data-confirm="Requeue this dead letter? It becomes pending with its attempts reset." {
                        (csrf_field())
                        input type="hidden" name="id" value=(m.id);
                        button #requeue type="submit" { "Requeue" }
                    }
                }
                @if m.status == MessageStatus::Pending {
                    form method="post" action="retry" data-confirm="Make this message due now?" {
                        (csrf_field())
                        input type="hidden" name="id" value=(m.id);
                        button #retry type="submit" { "Retry now" }
                    }
                }
            }
            p { a href=(format!("messages?status={}", m.status.as_str())) { "All " (label(m.status)) " messages" } }
        }
    })
}

fn unreadable_page(row: &UnreadableMessage) -> HttpResponse {
    respond(
        StatusCode::OK,
        &format!("Message {} (unreadable)", row.id),
        None,
        || {
            html! {
                p.refused { "This row does not read back as a message: " (row.reason) }
                table { @for (column, value) in &row.columns {
                    tr { th { (column) } td { pre { (value.as_deref().unwrap_or("NULL")) } } }
                } }
            }
        },
    )
}

/// POST `/requeue`: dead letters by id (one or selected), or all of a name.
pub(crate) async fn requeue<S: OutboxAdmin>(
    req: HttpRequest,
    ctx: Data<S>,
    body: web::Bytes,
) -> HttpResponse {
    let fields = match check_post(&req, &ctx.config, &body) {
        Ok(fields) => fields,
        Err(refused) => return *refused,
    };
    let now = now();
    let ids: Vec<&str> = fields
        .iter()
        .filter(|(k, v)| k == "id" && !v.trim().is_empty())
        .map(|(_, v)| v.trim())
        .collect();
    if field(&fields, "all").is_some() {
        if !ids.is_empty() {
            return refusal(
                StatusCode::BAD_REQUEST,
                "Bad request",
                "give either ids or `all`, not both; nothing was changed".to_owned(),
            );
        }
        let name = field(&fields, "name").map(str::to_owned);
        let params = RequeueDeadLetters {
            id: None,
            name: name.clone(),
            now,
        };
        return match ctx.store.requeue_dead_letters(params).await {
            Ok(n) => done(match name {
                Some(name) => format!("Requeued {n} dead letter(s) named {name:?}."),
                None => format!("Requeued {n} dead letter(s)."),
            }),
            Err(e) => store_error(&e),
        };
    }
    if ids.is_empty() {
        return refusal(
            StatusCode::BAD_REQUEST,
            "Bad request",
            "no dead letter was selected; tick at least one, or requeue all of a name".to_owned(),
        );
    }
    let mut requeued = Vec::new();
    let mut refused = Vec::new();
    for id in ids {
        let params = RequeueDeadLetters {
            id: Some(id.to_owned()),
            name: None,
            now,
        };
        match ctx.store.requeue_dead_letters(params).await {
            Ok(_) => requeued.push(id.to_owned()),
            Err(e) => refused.push(e.to_string()),
        }
    }
    let status = if requeued.is_empty() {
        StatusCode::CONFLICT
    } else {
        StatusCode::OK
    };
    respond(status, "Requeue", None, || {
        html! {
            @if !requeued.is_empty() {
                p.notice #done { "Requeued " (requeued.len()) " dead letter(s): "
                    @for (i, id) in requeued.iter().enumerate() {
                        @if i > 0 { ", " }
                        a href=(format!("message?id={}", query_value(id))) { (id) }
                    }
                }
            }
            @for why in &refused { p.refused { (why) } }
            p { a href="./" { "Back to the overview" } " · " a href="messages?status=dead_lettered" { "Dead letters" } }
        }
    })
}

fn done(what: String) -> HttpResponse {
    respond(StatusCode::OK, "Done", None, || {
        html! {
            p.notice #done { (what) }
            p { a href="./" { "Back to the overview" } }
        }
    })
}

/// POST `/retry`: make a pending message due now.
pub(crate) async fn retry<S: OutboxAdmin>(
    req: HttpRequest,
    ctx: Data<S>,
    body: web::Bytes,
) -> HttpResponse {
    let fields = match check_post(&req, &ctx.config, &body) {
        Ok(fields) => fields,
        Err(refused) => return *refused,
    };
    let Some(id) = field(&fields, "id") else {
        return refusal(
            StatusCode::BAD_REQUEST,
            "Bad request",
            "the form has no message `id`; nothing was changed".to_owned(),
        );
    };
    let params = RetryNow {
        id: id.to_owned(),
        now: now(),
    };
    match ctx.store.retry_now(params).await {
        Ok(()) => done(format!("Message {id:?} is due now.")),
        Err(e) => store_error(&e),
    }
}

/// The purge form's fields.
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct PurgeQuery {
    older_than: Option<String>,
    status: Option<String>,
}

/// `delivered`, `dead_lettered`, or both (`None`), from a form value.
fn purge_status(text: Option<&str>) -> Result<Option<MessageStatus>, String> {
    match text.unwrap_or("both") {
        "both" => Ok(None),
        "delivered" => Ok(Some(MessageStatus::Delivered)),
        "dead_lettered" => Ok(Some(MessageStatus::DeadLettered)),
        other => Err(format!(
            "`status` is {other:?}: only delivered, dead_lettered or both can be purged"
        )),
    }
}

/// GET `/purge`: the form, and with its fields the dry-run count and the
/// confirmation.
pub(crate) async fn purge_page<S: OutboxAdmin>(
    req: HttpRequest,
    ctx: Data<S>,
    query: web::Query<PurgeQuery>,
) -> HttpResponse {
    if let Err(denied) = check_access(&req, &ctx.config) {
        return *denied;
    }
    let older_than = blank(&query.older_than).unwrap_or("30d").to_owned();
    let status_text = blank(&query.status).unwrap_or("both").to_owned();
    let mut counted = None;
    if query.older_than.is_some() {
        let status = match purge_status(Some(&status_text)) {
            Ok(status) => status,
            Err(why) => return refusal(StatusCode::BAD_REQUEST, "Bad purge", why),
        };
        let horizon = match horizon(&older_than) {
            Ok(horizon) => horizon,
            Err(why) => return refusal(StatusCode::BAD_REQUEST, "Bad purge", why),
        };
        let params = PurgeMessages {
            status,
            older_than: horizon,
        };
        match ctx.store.count_purgeable(params).await {
            Ok(n) => counted = Some((n, horizon)),
            Err(e) => return store_error(&e),
        }
    }
    let actions = !ctx.config.read_only;
    let now = now();
    respond(StatusCode::OK, "Purge settled messages", None, || {
        html! {
            p { "Deletes delivered and dead-lettered messages whose last change is older than the horizon. Pending and claimed messages are never purged." }
            form method="get" action="purge" {
                label { "Older than " input type="text" name="older_than" value=(older_than); } " "
                label { "Status " select name="status" {
                    option value="both" selected[status_text == "both"] { "delivered and dead-lettered" }
                    option value="delivered" selected[status_text == "delivered"] { "delivered" }
                    option value="dead_lettered" selected[status_text == "dead_lettered"] { "dead-lettered" }
                } } " "
                button type="submit" { "Count (dry run)" }
            }
            @if let Some((n, horizon)) = counted {
                p.notice #count { (n) " message(s) last changed before " (time(horizon, now)) " would be purged." }
                @if actions && n > 0 {
                    form method="post" action="purge"
                        data-confirm=(format!("Delete {n} message(s) for good? This cannot be undone.")) {
                        (csrf_field())
                        input type="hidden" name="status" value=(status_text);
                        input type="hidden" name="horizon" value=(horizon.to_rfc3339_opts(SecondsFormat::AutoSi, true));
                        button #purge type="submit" { "Purge" }
                    }
                }
            }
        }
    })
}

/// `now - older_than`, for a human duration such as `7d` or `12h`.
fn horizon(older_than: &str) -> Result<DateTime<Utc>, String> {
    let span = humantime::parse_duration(older_than).map_err(|e| {
        format!("`older than` is {older_than:?}, which is not a duration ({e}): give one such as 7d or 12h")
    })?;
    let span = chrono::Duration::from_std(span)
        .map_err(|_| format!("`older than` is {older_than:?}, which is too long"))?;
    now().checked_sub_signed(span).ok_or_else(|| {
        format!("`older than` is {older_than:?}, which reaches before the calendar starts")
    })
}

/// POST `/purge`: delete what the dry run counted (by the same horizon).
pub(crate) async fn purge<S: OutboxAdmin>(
    req: HttpRequest,
    ctx: Data<S>,
    body: web::Bytes,
) -> HttpResponse {
    let fields = match check_post(&req, &ctx.config, &body) {
        Ok(fields) => fields,
        Err(refused) => return *refused,
    };
    let status = match purge_status(field(&fields, "status")) {
        Ok(status) => status,
        Err(why) => return refusal(StatusCode::BAD_REQUEST, "Bad purge", why),
    };
    let Some(horizon) = field(&fields, "horizon") else {
        return refusal(
            StatusCode::BAD_REQUEST,
            "Bad purge",
            "the form has no `horizon`; count first on the purge page; nothing was changed"
                .to_owned(),
        );
    };
    let horizon = match parse_time("horizon", horizon) {
        Ok(horizon) => horizon,
        Err(why) => return refusal(StatusCode::BAD_REQUEST, "Bad purge", why),
    };
    let params = PurgeMessages {
        status,
        older_than: horizon,
    };
    match ctx.store.purge(params).await {
        Ok(n) => done(format!(
            "Purged {n} message(s) last changed before {}.",
            horizon.to_rfc3339_opts(SecondsFormat::Millis, true)
        )),
        Err(e) => store_error(&e),
    }
}

/// Anything else under the mount point.
pub(crate) async fn not_found<S: OutboxAdmin>(req: HttpRequest, ctx: Data<S>) -> HttpResponse {
    if let Err(denied) = check_access(&req, &ctx.config) {
        return *denied;
    }
    refusal(
        StatusCode::NOT_FOUND,
        "Not found",
        format!("There is no dashboard page at {}.", req.path()),
    )
}
