//! The HTML: one layout, and the pieces the pages share. Everything from the
//! store goes through maud's escaping; nothing is spliced in raw except the
//! dashboard's own constant script and style.

use chrono::{DateTime, SecondsFormat, Utc};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use outbox::{MessageStatus, MinuteActivity, OutboxMessage};

const STYLE: &str = "
body{font-family:system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:.6rem 1.2rem;display:flex;gap:1.2rem;align-items:center}
header a{color:#cfd8ea;text-decoration:none}header strong{margin-right:1rem}
main{padding:1rem 1.2rem;max-width:76rem}
table{border-collapse:collapse;background:#fff;margin:.5rem 0 1rem}
td,th{border:1px solid #dde1e8;padding:.3rem .6rem;text-align:left;vertical-align:top}
th{background:#eef1f5}
.cards{display:flex;gap:.8rem;flex-wrap:wrap;margin-bottom:1rem}
.card{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:.6rem 1rem;min-width:8rem}
.card b{display:block;font-size:1.6rem}
.card a{color:inherit;text-decoration:none}
pre{background:#fff;border:1px solid #dde1e8;padding:.6rem;overflow:auto;max-height:30rem}
.notice{background:#e7f5e9;border:1px solid #9ccfa4;padding:.5rem .8rem}
.refused{background:#fdecea;border:1px solid #e6a39b;padding:.5rem .8rem}
form.inline{display:inline}
.muted{color:#687085}
.paused{color:#a15c00}
#queues form{margin:0}
.overdue{color:#a5281b}
";

/// Attaches the confirmation dialogs: a form with `data-confirm` asks first.
const SCRIPT: &str = "document.querySelectorAll('form[data-confirm]').forEach(function(f){\
f.addEventListener('submit',function(e){if(!window.confirm(f.dataset.confirm)){e.preventDefault();}});});";

/// A whole page. `nonce` lets the dashboard's own script run under the
/// page's Content-Security-Policy; `refresh` reloads the page that often.
pub(crate) fn layout(title: &str, nonce: &str, refresh: Option<u64>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                @if let Some(secs) = refresh {
                    meta http-equiv="refresh" content=(secs);
                }
                title { (title) " · outbox" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    strong { "outbox" }
                    a href="./" { "Overview" }
                    a href="messages?status=pending" { "Pending" }
                    a href="messages?status=claimed" { "Claimed" }
                    a href="messages?status=dead_lettered" { "Dead letters" }
                    a href="messages?status=delivered" { "Delivered" }
                    a href="messages?status=cancelled" { "Cancelled" }
                    a href="schedules" { "Schedules" }
                    a href="purge" { "Purge" }
                }
                main {
                    h1 { (title) }
                    (body)
                }
                script nonce=(nonce) { (PreEscaped(SCRIPT)) }
            }
        }
    }
}

/// A status as the pages name it in prose.
pub(crate) fn status_label(status: MessageStatus) -> &'static str {
    match status {
        MessageStatus::Pending => "pending",
        MessageStatus::Claimed => "claimed",
        MessageStatus::Delivered => "delivered",
        MessageStatus::DeadLettered => "dead-lettered",
        MessageStatus::Cancelled => "cancelled",
    }
}

/// A time as the CLI prints it, with its distance from `now`.
pub(crate) fn time(at: DateTime<Utc>, now: DateTime<Utc>) -> Markup {
    let text = at.to_rfc3339_opts(SecondsFormat::Millis, true);
    html! { time datetime=(text) { (text) } " " span.muted { "(" (ago(at, now)) ")" } }
}

/// `3m 20s ago` or `in 5s`.
pub(crate) fn ago(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let delta = now.signed_duration_since(at);
    let secs = delta.num_seconds();
    let span = humantime::format_duration(std::time::Duration::from_secs(secs.unsigned_abs()));
    if secs >= 0 {
        format!("{span} ago")
    } else {
        format!("in {span}")
    }
}

/// The first line of a message's last error, if it has one.
pub(crate) fn error_line(message: &OutboxMessage) -> String {
    message
        .last_error
        .as_ref()
        .map(|e| e.message.lines().next().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

/// The payload as indented JSON; as stored when it does not parse.
pub(crate) fn pretty_payload(message: &OutboxMessage) -> String {
    serde_json::from_str::<serde_json::Value>(message.payload.as_str())
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| message.payload.as_str().to_owned())
}

/// The trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`).
pub(crate) fn trace_id(traceparent: &str) -> Option<&str> {
    traceparent.split('-').nth(1).filter(|id| id.len() == 32)
}

/// Delivered and dead-lettered per minute over the hour before `now`, as
/// stacked bars: one per minute, oldest on the left.
pub(crate) fn activity_chart(activity: &[MinuteActivity], now: DateTime<Utc>) -> Markup {
    const MINUTES: i64 = 60;
    const BAR: i64 = 10;
    const HEIGHT: f64 = 120.0;
    let this_minute = now.timestamp() - now.timestamp().rem_euclid(60);
    let first = this_minute - (MINUTES - 1) * 60;
    let mut bars = vec![(0u64, 0u64); MINUTES as usize];
    for minute in activity {
        let index = (minute.minute.timestamp() - first).div_euclid(60);
        if let Some(bar) = usize::try_from(index).ok().and_then(|i| bars.get_mut(i)) {
            bar.0 += minute.delivered;
            bar.1 += minute.dead_lettered;
        }
    }
    let peak = bars.iter().map(|(d, x)| d + x).max().unwrap_or(0).max(1);
    let scale = |n: u64| n as f64 / peak as f64 * HEIGHT;
    let delivered: u64 = bars.iter().map(|b| b.0).sum();
    let dead: u64 = bars.iter().map(|b| b.1).sum();
    html! {
        svg role="img" width=(MINUTES * BAR + 40) height=(HEIGHT + 30.0)
            viewBox=(format!("0 0 {} {}", MINUTES * BAR + 40, HEIGHT + 30.0))
            xmlns="http://www.w3.org/2000/svg" {
            title { "Delivered and dead-lettered per minute over the last hour" }
            text x="0" y="12" font-size="11" fill="#687085" { (peak) "/min" }
            line x1="36" y1=(HEIGHT + 10.0) x2=(MINUTES * BAR + 40) y2=(HEIGHT + 10.0) stroke="#aab" {}
            @for (i, (d, x)) in bars.iter().enumerate() {
                @let left = 38 + i as i64 * BAR;
                @let dh = scale(*d);
                @let xh = scale(*x);
                @if *d > 0 {
                    rect x=(left) y=(HEIGHT + 10.0 - dh) width=(BAR - 2) height=(dh) fill="#3b8a4a" {
                        title { (d) " delivered" }
                    }
                }
                @if *x > 0 {
                    rect x=(left) y=(HEIGHT + 10.0 - dh - xh) width=(BAR - 2) height=(xh) fill="#c0392b" {
                        title { (x) " dead-lettered" }
                    }
                }
            }
            text x="36" y=(HEIGHT + 26.0) font-size="11" fill="#687085" { "60 min ago" }
            text x=(MINUTES * BAR - 10) y=(HEIGHT + 26.0) font-size="11" fill="#687085" { "now" }
        }
        p.muted {
            "Last hour: " span style="color:#3b8a4a" { (delivered) " delivered" }
            ", " span style="color:#c0392b" { (dead) " dead-lettered" } "."
        }
    }
}

/// Percent-encodes a query value.
pub(crate) fn query_value(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}
