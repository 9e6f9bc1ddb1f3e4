//! Generated input through the broker transports: messages whose id, name
//! and trace carrier hold whatever a database row can (line breaks, NULs,
//! wildcards, kilobytes of text), published to the real brokers that
//! `scripts/with-services` starts, and broker URLs of every shape. A
//! transport answers a delivery or a typed [`BrokerError`], never a panic.
//!
//! Every target counts its cases; CI adds the counts of all packages up.
//!
//! Run with `scripts/with-services cargo test -p outbox-brokers
//! --all-features --test fuzz`.

#[path = "../../tests/fuzzing/mod.rs"]
mod fuzzing;
mod harness;

use std::fmt::Debug;
use std::time::Duration;

use outbox::{ClaimedMessage, Delivery, MessageKind, Payload, TraceCarrier};
use outbox_brokers::{
    AmqpConfig, AmqpTransport, BrokerError, NameMap, NatsConfig, NatsTransport, RedisConfig,
    RedisTransport,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use fuzzing::{ensure, fuzz};
use harness::{claimed, delivery_of};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn service_url(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: run this test under scripts/with-services, e.g. \
             `scripts/with-services cargo test -p outbox-brokers --all-features --test fuzz`"
        )
    })
}

/// Text a stored column may hold.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z0-9._-]{1,12}",
        2 => prop::sample::select(vec![
            "line\nbreak", "carriage\rreturn", "nul\u{0}", "sp ace", "wild.*", "wild.>",
            "tab\there", "colon:", "", ".", "..", "a..b", "ünïcode", "\u{7f}",
        ])
        .prop_map(str::to_owned),
        1 => ".{0,20}",
        1 => "[a-z]{250,300}",
    ]
}

#[derive(Debug, Clone)]
struct Generated {
    id: String,
    kind: MessageKind,
    name: String,
    payload: String,
    trace: Option<(String, Option<String>)>,
    attempts: u32,
}

fn message() -> impl Strategy<Value = Generated> {
    let payload = prop_oneof![
        Just("{}".to_owned()),
        "[1-9][0-9]{0,5}".prop_map(|n| format!("{{\"n\":{n}}}")),
        ".{0,20}".prop_map(|s| serde_json::Value::String(s).to_string()),
    ];
    (
        text(),
        prop_oneof![Just(MessageKind::Event), Just(MessageKind::Job)],
        text(),
        payload,
        prop::option::of((text(), prop::option::of(text()))),
        any::<u32>(),
    )
        .prop_map(|(id, kind, name, payload, trace, attempts)| Generated {
            id,
            kind,
            name,
            payload,
            trace,
            attempts,
        })
}

impl Generated {
    fn claimed(&self) -> ClaimedMessage {
        claimed(
            &self.id,
            self.kind,
            &self.name,
            Payload::from_json(self.payload.clone()).expect("JSON"),
            self.trace
                .clone()
                .map(|(traceparent, tracestate)| TraceCarrier {
                    traceparent,
                    tracestate,
                }),
            self.attempts,
        )
    }

    fn delivery(&self) -> Delivery {
        delivery_of(self.claimed())
    }
}

/// A refusal says which broker and what it was doing.
fn typed(error: &BrokerError) -> Result<(), TestCaseError> {
    ensure(
        !error.broker.is_empty() && !error.operation.is_empty(),
        || format!("an error that names nothing: {error:?}"),
    )
}

#[test]
fn names_and_headers() {
    let strategy = (
        text(),
        prop::collection::vec((text(), text()), 0..3),
        message(),
    );
    fuzz("names", 20_000, strategy, |(prefix, renames, generated)| {
        let mut names = NameMap::new(prefix.clone());
        for (from, to) in &renames {
            names = names.rename(from.clone(), to.clone());
        }
        let destination = names.destination(&generated.name);
        ensure(destination.starts_with(&prefix), || {
            format!("{destination:?} lost the prefix {prefix:?}")
        })?;
        let message = generated.claimed();
        let headers = outbox_brokers::headers(&message);
        ensure(headers[0].1 == message.id, || "the id header".into())
    });
}

#[test]
fn nats_publishes() {
    let rt = runtime();
    let transport = rt.block_on(async {
        let client = async_nats::connect(service_url("NATS_URL"))
            .await
            .expect("connect to NATS_URL");
        let js = async_nats::jetstream::new(client);
        let stream = format!("OUTBOX_FUZZ_{}", std::process::id());
        let prefix = format!("fuzz{}.", std::process::id());
        js.create_stream(async_nats::jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}>")],
            max_messages: 1_000,
            ..Default::default()
        })
        .await
        .expect("a stream");
        let config =
            NatsConfig::new(&stream, NameMap::new(prefix)).ack_timeout(Duration::from_secs(5));
        NatsTransport::connect(&service_url("NATS_URL"), config)
            .await
            .expect("a transport")
    });
    fuzz("nats", 1_500, message(), |generated| {
        rt.block_on(async {
            match transport.publish_message(&generated.claimed()).await {
                Ok(()) => Ok(()),
                Err(error) => typed(&error),
            }
        })
    });
}

#[test]
fn redis_publishes() {
    let rt = runtime();
    let transport = rt.block_on(async {
        let config = RedisConfig::new()
            .streams(NameMap::new(format!("fuzz{}:", std::process::id())))
            .max_len(100);
        RedisTransport::connect(&service_url("REDIS_URL"), config)
            .await
            .expect("a transport")
    });
    fuzz("redis", 1_500, message(), |generated| {
        rt.block_on(async {
            match transport.send(&generated.delivery()).await {
                Ok(_) => Ok(()),
                Err(error) => typed(&error),
            }
        })
    });
}

#[test]
fn amqp_publishes() {
    let rt = runtime();
    let transport = rt.block_on(async {
        // A built-in exchange: nothing to declare, and what it cannot
        // route comes back as a refusal of its own.
        let config = AmqpConfig::new("amq.topic").confirm_timeout(Duration::from_secs(5));
        AmqpTransport::connect(&service_url("AMQP_URL"), config)
            .await
            .expect("a transport")
    });
    fuzz("amqp", 800, message(), |generated| {
        rt.block_on(async {
            match transport.send(&generated.delivery()).await {
                Ok(()) => Ok(()),
                Err(error) => typed(&error),
            }
        })
    });
}

/// Broker URLs of every shape, none of which reaches a server: a port
/// nothing listens on, or text no client can parse.
fn broker_url() -> impl Strategy<Value = String> {
    let scheme = prop::sample::select(vec![
        "nats",
        "tls",
        "redis",
        "rediss",
        "redis+unix",
        "amqp",
        "amqps",
        "http",
        "",
        "NATS",
    ]);
    let separator = prop::sample::select(vec!["://", ":", ":/", ""]);
    let authority = prop_oneof![
        Just("127.0.0.1:1".to_owned()),
        Just("user:secret@127.0.0.1:1".to_owned()),
        Just("[::1]:1".to_owned()),
        Just("127.0.0.1:99999".to_owned()),
        Just("127.0.0.1:-1".to_owned()),
        Just("@:".to_owned()),
        "[%@:\\[\\]0-9]{0,10}",
    ];
    let rest = prop_oneof![
        Just(String::new()),
        "/[a-z0-9%]{0,6}",
        Just("/%2f?heartbeat=x".to_owned()),
        Just("/99999999999999999999".to_owned()),
        Just(",nats://127.0.0.1:1".to_owned()),
    ];
    (scheme, separator, authority, rest).prop_map(|(scheme, separator, authority, rest)| {
        format!("{scheme}{separator}{authority}{rest}")
    })
}

#[test]
fn broker_urls() {
    let rt = runtime();
    fuzz("urls", 300, broker_url(), |url| {
        rt.block_on(async {
            let limit = Duration::from_secs(20);
            let nats = tokio::time::timeout(
                limit,
                NatsTransport::connect(&url, NatsConfig::new("S", NameMap::new("p."))),
            );
            let redis =
                tokio::time::timeout(limit, RedisTransport::connect(&url, RedisConfig::new()));
            let amqp =
                tokio::time::timeout(limit, AmqpTransport::connect(&url, AmqpConfig::new("")));
            for outcome in [
                nats.await.map(|r| r.map(|_| ())),
                redis.await.map(|r| r.map(|_| ())),
                amqp.await.map(|r| r.map(|_| ())),
            ] {
                match outcome {
                    Ok(Ok(())) => return Err(TestCaseError::fail(format!("{url:?} connected"))),
                    Ok(Err(error)) => {
                        typed(&error)?;
                        ensure(!error.to_string().contains("secret"), || {
                            format!("{url:?} shown as {error}")
                        })?;
                    }
                    Err(_) => return Err(TestCaseError::fail(format!("{url:?} hung"))),
                }
            }
            Ok(())
        })
    });
}

/// Found by `nats_publishes`: a line break in a stored id, name or trace
/// carrier panicked in the NATS client's header encoding.
#[test]
fn a_line_break_in_a_nats_header_is_a_permanent_refusal() {
    let rt = runtime();
    rt.block_on(async {
        let client = async_nats::connect(service_url("NATS_URL")).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let stream = format!("OUTBOX_FUZZ_LB_{}", std::process::id());
        let prefix = format!("fuzzlb{}.", std::process::id());
        js.create_stream(async_nats::jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}>")],
            ..Default::default()
        })
        .await
        .unwrap();
        let transport = NatsTransport::connect(
            &service_url("NATS_URL"),
            NatsConfig::new(&stream, NameMap::new(prefix)),
        )
        .await
        .unwrap();
        for (id, trace) in [
            ("line\nbreak", None),
            ("fine", Some(("00-a\r\n".to_owned(), None))),
        ] {
            let generated = Generated {
                id: id.to_owned(),
                kind: MessageKind::Event,
                name: "orders".to_owned(),
                payload: "{}".to_owned(),
                trace,
                attempts: 1,
            };
            let error = transport
                .publish_message(&generated.claimed())
                .await
                .unwrap_err();
            assert_eq!(
                error.class,
                outbox_brokers::FailureClass::Permanent,
                "{error}"
            );
            assert!(error.reason.contains("line break"), "{error}");
        }
        js.delete_stream(&stream).await.unwrap();
    });
}

/// Found by `broker_urls`: a URL with credentials but no `//` after its
/// scheme was shown whole, password included, by the NATS transport's
/// connect error and by the AMQP client's "invalid URL".
#[test]
fn credentials_stay_out_of_connect_errors() {
    let rt = runtime();
    rt.block_on(async {
        let url = "nats:user:secret@127.0.0.1:1";
        let nats = NatsTransport::connect(url, NatsConfig::new("S", NameMap::new("p.")))
            .await
            .expect_err("nothing listens there");
        let amqp = AmqpTransport::connect(url, AmqpConfig::new(""))
            .await
            .expect_err("not an AMQP URL");
        for error in [nats, amqp] {
            assert!(!error.to_string().contains("secret"), "{error}");
        }
    });
}
