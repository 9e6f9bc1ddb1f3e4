//! Trace propagation: the W3C trace context a message carries from enqueue
//! to delivery.
//!
//! With the `opentelemetry` feature, [`NewMessage::new`] (and so
//! [`NewMessage::event`] and [`NewMessage::job`]) stores the trace context
//! of the current span as a [`TraceCarrier`], unless the caller sets one
//! with [`NewMessage::with_trace`]. The drain runtime parents each delivery
//! span on it. The carrier is always W3C `traceparent`/`tracestate`, whatever
//! propagator the application installed, because those are the fields a
//! stored message has; encoding it here keeps an enqueue-only process on the
//! OpenTelemetry API alone, with no SDK.
//!
//! Without the feature nothing is captured, and a carrier set with
//! [`NewMessage::with_trace`] is stored and handed to handlers unchanged.
//! [`TraceCarrier::current`], [`TraceCarrier::from_span`],
//! [`TraceCarrier::set_parent_of`] and [`NewMessage::with_current_trace`]
//! exist either way and do nothing without it, so a crate built on this one
//! (the `outbox-actors` runtime is) follows stored traces as soon as any
//! crate in the build turns the feature on.
//!
//! A handler continues the trace in its own outgoing calls from
//! [`DeliveryContext::trace`](crate::DeliveryContext::trace):
//!
//! ```
//! use outbox::DeliveryContext;
//!
//! /// W3C headers for an outgoing request made while handling a message.
//! fn trace_headers(context: &DeliveryContext) -> Vec<(&'static str, String)> {
//!     let Some(trace) = context.trace() else { return Vec::new() };
//!     let mut headers = vec![("traceparent", trace.traceparent.clone())];
//!     headers.extend(trace.tracestate.clone().map(|state| ("tracestate", state)));
//!     headers
//! }
//! ```
//!
//! [`NewMessage::event`]: crate::NewMessage::event
//! [`NewMessage::job`]: crate::NewMessage::job
//! [`NewMessage::new`]: crate::NewMessage::new
//! [`NewMessage::with_current_trace`]: crate::NewMessage::with_current_trace
//! [`NewMessage::with_trace`]: crate::NewMessage::with_trace

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// W3C trace context captured at enqueue, so a delivery can join the trace
/// of the request that produced it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceCarrier {
    /// The `traceparent` header value.
    pub traceparent: String,
    /// The `tracestate` header value, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

// Available without the feature (see the module docs for why).
impl TraceCarrier {
    /// The trace context of the current span: the current `tracing` span as
    /// the OpenTelemetry layer sees it, else OpenTelemetry's own current
    /// context. `None` when neither has a valid span, and always `None`
    /// without the `opentelemetry` feature.
    pub fn current() -> Option<TraceCarrier> {
        #[cfg(feature = "opentelemetry")]
        {
            TraceCarrier::from_span(&tracing::Span::current())
                .or_else(|| TraceCarrier::from_context(&opentelemetry::Context::current()))
        }
        #[cfg(not(feature = "opentelemetry"))]
        {
            None
        }
    }

    /// The trace context of `span`, when an OpenTelemetry layer records it.
    /// Always `None` without the `opentelemetry` feature.
    #[cfg_attr(not(feature = "opentelemetry"), allow(unused_variables))]
    pub fn from_span(span: &tracing::Span) -> Option<TraceCarrier> {
        #[cfg(feature = "opentelemetry")]
        {
            use tracing_opentelemetry::OpenTelemetrySpanExt;
            TraceCarrier::from_context(&span.context())
        }
        #[cfg(not(feature = "opentelemetry"))]
        {
            None
        }
    }

    /// Make the trace context in this carrier the parent of `span`, which
    /// must not have been entered yet. Does nothing when no OpenTelemetry
    /// layer records `span`, and nothing at all without the `opentelemetry`
    /// feature.
    ///
    /// Fails with [`Error::InvalidInput`](crate::Error::InvalidInput) when
    /// the feature is on and `traceparent` is not a valid W3C trace context;
    /// `span` is then left as it was.
    #[cfg_attr(not(feature = "opentelemetry"), allow(unused_variables))]
    pub fn set_parent_of(&self, span: &tracing::Span) -> Result<()> {
        #[cfg(feature = "opentelemetry")]
        {
            use tracing_opentelemetry::OpenTelemetrySpanExt;
            // `set_parent` fails only when no layer records the span (or it
            // already started), and then there is nothing to parent.
            let _ = span.set_parent(self.to_context()?);
        }
        Ok(())
    }
}

#[cfg(feature = "opentelemetry")]
mod w3c {
    use std::str::FromStr;

    use opentelemetry::Context;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };

    use super::TraceCarrier;
    use crate::error::{Error, Result};

    /// The only `traceparent` version this crate writes.
    const VERSION: &str = "00";

    #[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
    impl TraceCarrier {
        /// The trace context of `cx`'s span, if it has a valid one.
        pub fn from_context(cx: &Context) -> Option<TraceCarrier> {
            let span = cx.span();
            let span_context = span.span_context();
            if !span_context.is_valid() {
                return None;
            }
            let traceparent = format!(
                "{VERSION}-{}-{}-{:02x}",
                span_context.trace_id(),
                span_context.span_id(),
                span_context.trace_flags() & TraceFlags::SAMPLED
            );
            let tracestate = span_context.trace_state().header();
            Some(TraceCarrier {
                traceparent,
                tracestate: (!tracestate.is_empty()).then_some(tracestate),
            })
        }

        /// A context whose (remote) span is the one this carrier names, to
        /// parent a span on, for example with
        /// `tracing_opentelemetry::OpenTelemetrySpanExt::set_parent`.
        ///
        /// Fails with [`Error::InvalidInput`] when `traceparent` is not a
        /// valid W3C trace context. An invalid `tracestate` is dropped, as
        /// the W3C specification asks, and does not fail.
        pub fn to_context(&self) -> Result<Context> {
            Ok(Context::new().with_remote_span_context(self.span_context()?))
        }

        fn span_context(&self) -> Result<SpanContext> {
            let invalid = |why: &str| {
                Error::invalid("trace", format!("traceparent {:?} {why}", self.traceparent))
            };
            let parts: Vec<&str> = self.traceparent.trim().split('-').collect();
            let [version, trace_id, span_id, flags, rest @ ..] = parts.as_slice() else {
                return Err(invalid("does not have four fields"));
            };
            if !is_lower_hex(version, 2) || *version == "ff" {
                return Err(invalid("has an invalid version"));
            }
            // Later versions may append fields; version 00 has exactly four.
            if *version == VERSION && !rest.is_empty() {
                return Err(invalid("has more than four fields"));
            }
            for (field, len, what) in [
                (*trace_id, 32, "trace id"),
                (*span_id, 16, "parent id"),
                (*flags, 2, "flags field"),
            ] {
                if !is_lower_hex(field, len) {
                    return Err(invalid(&format!("has an invalid {what}")));
                }
            }
            // Checked above: these are hex of the right length.
            let trace_id = TraceId::from_hex(trace_id).unwrap_or(TraceId::INVALID);
            let span_id = SpanId::from_hex(span_id).unwrap_or(SpanId::INVALID);
            let flags = u8::from_str_radix(flags, 16).unwrap_or_default();
            if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
                return Err(invalid("has an all-zero trace id or parent id"));
            }
            let trace_state = self
                .tracestate
                .as_deref()
                .and_then(|state| TraceState::from_str(state).ok())
                .unwrap_or_default();
            Ok(SpanContext::new(
                trace_id,
                span_id,
                // Unknown flags are accepted and cleared, as W3C asks.
                TraceFlags::new(flags) & TraceFlags::SAMPLED,
                true,
                trace_state,
            ))
        }
    }

    fn is_lower_hex(field: &str, len: usize) -> bool {
        field.len() == len
            && field
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn carrier(traceparent: &str, tracestate: Option<&str>) -> TraceCarrier {
            TraceCarrier {
                traceparent: traceparent.to_owned(),
                tracestate: tracestate.map(str::to_owned),
            }
        }

        const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

        #[test]
        fn a_carrier_round_trips_through_a_context() {
            let stored = carrier(PARENT, Some("vendor=opaque,other=1"));
            let cx = stored.to_context().unwrap();
            let span_context = cx.span().span_context().clone();
            assert!(span_context.is_remote());
            assert!(span_context.is_sampled());
            assert_eq!(
                span_context.trace_id(),
                TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap()
            );
            assert_eq!(span_context.trace_state().get("vendor"), Some("opaque"));
            assert_eq!(TraceCarrier::from_context(&cx), Some(stored));
        }

        #[test]
        fn an_empty_tracestate_is_not_stored() {
            let cx = carrier(PARENT, None).to_context().unwrap();
            assert_eq!(TraceCarrier::from_context(&cx).unwrap().tracestate, None);
        }

        #[test]
        fn unknown_flags_are_cleared_and_later_versions_accepted() {
            let cx = carrier(
                "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03-extra",
                None,
            )
            .to_context()
            .unwrap();
            let written = TraceCarrier::from_context(&cx).unwrap();
            assert_eq!(written.traceparent, PARENT);
        }

        #[test]
        fn an_invalid_tracestate_is_dropped() {
            let cx = carrier(PARENT, Some("not a tracestate"))
                .to_context()
                .unwrap();
            assert_eq!(cx.span().span_context().trace_state().header(), "");
        }

        #[test]
        fn invalid_traceparents_are_refused() {
            for bad in [
                "",
                "garbage",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
                "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
                "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",
                "00-+af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "00-00000000000000000000000000000000-b7ad6b7169203331-01",
                "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
            ] {
                let error = carrier(bad, None).to_context().unwrap_err();
                assert!(
                    matches!(error, Error::InvalidInput { field: "trace", .. }),
                    "{bad:?}: {error}"
                );
            }
        }

        #[test]
        fn agrees_with_the_sdk_propagator() {
            use std::collections::HashMap;

            use opentelemetry::propagation::TextMapPropagator;
            use opentelemetry_sdk::propagation::TraceContextPropagator;

            let stored = carrier(PARENT, Some("vendor=opaque"));
            let cx = stored.to_context().unwrap();
            let mut headers = HashMap::new();
            TraceContextPropagator::new().inject_context(&cx, &mut headers);
            assert_eq!(headers["traceparent"], stored.traceparent);
            assert_eq!(headers.get("tracestate"), stored.tracestate.as_ref());
            let extracted = TraceContextPropagator::new().extract(&headers);
            assert_eq!(extracted.span().span_context(), cx.span().span_context());
        }

        #[test]
        fn no_span_means_no_carrier() {
            assert_eq!(TraceCarrier::from_context(&Context::new()), None);
            assert_eq!(TraceCarrier::current(), None);
        }
    }
}
