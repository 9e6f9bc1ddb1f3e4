//! The Redis Streams transport against a real `redis-server`
//! (`REDIS_URL`, and `WITH_SERVICES_CTL` to stop and start it).

mod harness;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use harness::{
    claimed, coordinator, count, counting, ctl, delivery_of, enqueue, serial, service_url, settled,
    shutdown, unique, wait_for,
};
use outbox::{Delivery, MemoryOutbox, MessageKind, MessageStatus, OutboxAdmin, Payload};
use outbox_brokers::redis::{Appended, RedisConfig, RedisTransport};
use outbox_brokers::{FailureClass, NameMap};
use redis::aio::MultiplexedConnection;
use redis::streams::StreamRangeReply;

async fn client() -> MultiplexedConnection {
    redis::Client::open(service_url("REDIS_URL"))
        .expect("REDIS_URL is a Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to REDIS_URL")
}

/// A stream's entries as field maps, oldest first.
async fn entries(stream: &str) -> Vec<HashMap<String, String>> {
    let mut connection = client().await;
    let reply: StreamRangeReply = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(&mut connection)
        .await
        .expect("XRANGE");
    reply
        .ids
        .iter()
        .map(|entry| {
            entry
                .map
                .keys()
                .map(|field| {
                    let value: String = entry.get(field).expect("a string field");
                    (field.clone(), value)
                })
                .collect()
        })
        .collect()
}

fn config(prefix: &str) -> RedisConfig {
    RedisConfig::new()
        .streams(NameMap::new(prefix))
        .dedup_prefix(format!("{prefix}dedup:"))
}

async fn transport(config: RedisConfig) -> RedisTransport {
    RedisTransport::connect(&service_url("REDIS_URL"), config)
        .await
        .expect("connect the transport")
}

#[test]
fn redeliveries_inside_the_window_add_nothing_and_outside_it_add_a_copy() {
    let _serial = serial();
    harness::run(|| async {
        const N: usize = 200;
        for (window, copies) in [
            (Duration::from_secs(3600), 1),
            (Duration::from_millis(1), 2),
        ] {
            let prefix = format!("test:{}:", unique());
            let store = MemoryOutbox::new();
            let ids = enqueue(&store, "orders.placed", N).await;
            let (bus, stats) =
                counting(transport(config(&prefix).dedup_window(window)).await, true);
            let coordinator = coordinator(&store, bus);
            let limit = Duration::from_secs(60);
            wait_for("every message delivered", limit, || async {
                count(&store, MessageStatus::Delivered).await == N
            })
            .await;
            shutdown(coordinator).await;

            // Every message was published twice and acknowledged twice.
            assert_eq!(stats.acked(), 2 * N as u64);
            let entries = entries(&format!("{prefix}orders.placed")).await;
            assert_eq!(entries.len(), copies * N, "window {window:?}");
            let mut seen: HashMap<&str, usize> = HashMap::new();
            for entry in &entries {
                *seen.entry(entry["Outbox-Message-Id"].as_str()).or_default() += 1;
            }
            assert_eq!(seen.len(), N);
            assert!(ids.iter().all(|id| seen.get(id.as_str()) == Some(&copies)));
        }
    });
}

#[test]
fn a_restarted_redis_loses_nothing_and_the_drain_resumes_by_itself() {
    let _serial = serial();
    harness::run(|| async {
        const N: usize = 3_000;
        let prefix = format!("test:{}:", unique());
        let store = MemoryOutbox::new();
        enqueue(&store, "orders.placed", N).await;
        let (bus, stats) = counting(transport(config(&prefix)).await, false);
        let coordinator = coordinator(&store, bus);
        let limit = Duration::from_secs(60);
        wait_for("a tenth delivered", limit, || async {
            count(&store, MessageStatus::Delivered).await >= N / 10
        })
        .await;
        ctl("stop", "redis");
        wait_for("a publish to fail", limit, || async { stats.failed() > 0 }).await;
        let delivered_while_down = count(&store, MessageStatus::Delivered).await;
        ctl("start", "redis");
        wait_for(
            "every message delivered",
            Duration::from_secs(120),
            || async { count(&store, MessageStatus::Delivered).await == N },
        )
        .await;
        shutdown(coordinator).await;

        let entries = entries(&format!("{prefix}orders.placed")).await;
        let distinct: std::collections::HashSet<&str> = entries
            .iter()
            .map(|e| e["Outbox-Message-Id"].as_str())
            .collect();
        let lost = N - distinct.len();
        println!(
            "redis restart: N={N} delivered_before_stop={delivered_while_down} \
             failed_publishes={} acked_publishes={} stream_entries={} distinct_ids={} lost={lost} \
             duplicates_before_dedup={} duplicates_after_dedup={}",
            stats.failed(),
            stats.acked(),
            entries.len(),
            distinct.len(),
            // Acknowledged publishes that added nothing: the copies a
            // consumer would have seen without the dedup script.
            stats.acked() - entries.len() as u64,
            entries.len() - distinct.len(),
        );
        assert!(stats.failed() > 0, "the outage was seen");
        assert_eq!(lost, 0);
        assert_eq!(
            entries.len(),
            N,
            "the dedup window absorbed every redelivery"
        );
        assert_eq!(count(&store, MessageStatus::DeadLettered).await, 0);
    });
}

#[test]
fn a_wrongtype_stream_key_dead_letters_at_once_with_the_reason() {
    let _serial = serial();
    harness::run(|| async {
        let prefix = format!("test:{}:", unique());
        let mut connection = client().await;
        let _: () = redis::cmd("SET")
            .arg(format!("{prefix}orders.placed"))
            .arg("not a stream")
            .query_async(&mut connection)
            .await
            .expect("SET");
        let store = MemoryOutbox::new();
        let ids = enqueue(&store, "orders.placed", 1).await;
        let coordinator = coordinator(&store, transport(config(&prefix)).await);
        let message = settled(&store, &ids[0], Duration::from_secs(30)).await;
        shutdown(coordinator).await;

        assert_eq!(message.status, MessageStatus::DeadLettered);
        assert_eq!(message.attempts, 1, "dead-lettered at once");
        let error = message.last_error.expect("the reason is kept");
        assert!(error.message.contains("WRONGTYPE"), "{error:?}");
        // The script removed its dedup key: a requeue is published, not
        // taken for a duplicate.
        let exists: u32 = redis::cmd("EXISTS")
            .arg(format!("{prefix}dedup:{}", ids[0]))
            .query_async(&mut connection)
            .await
            .expect("EXISTS");
        assert_eq!(exists, 0);
    });
}

#[test]
fn the_entry_carries_the_payload_the_headers_and_the_trace_context() {
    let _serial = serial();
    harness::run(|| async {
        let prefix = format!("test:{}:", unique());
        let store = MemoryOutbox::new();
        let ids = enqueue(&store, "orders.placed", 1).await;
        let coordinator = coordinator(&store, transport(config(&prefix).max_len(1_000)).await);
        let message = settled(&store, &ids[0], Duration::from_secs(30)).await;
        shutdown(coordinator).await;
        assert_eq!(message.status, MessageStatus::Delivered);

        let entries = entries(&format!("{prefix}orders.placed")).await;
        assert_eq!(entries.len(), 1);
        let entry = &entries[0];
        let trace = harness::trace();
        assert_eq!(entry["payload"], r#"{"n":0}"#);
        assert_eq!(entry["Outbox-Message-Id"], ids[0]);
        assert_eq!(entry["Outbox-Name"], "orders.placed");
        assert_eq!(entry["Outbox-Kind"], "event");
        assert_eq!(entry["Outbox-Attempt"], "1");
        assert_eq!(entry["traceparent"], trace.traceparent);
        assert_eq!(Some(&entry["tracestate"]), trace.tracestate.as_ref());
    });
}

#[test]
fn connect_errors_are_classified() {
    let _serial = serial();
    harness::run(|| async {
        let bad = RedisTransport::connect("http://127.0.0.1:1", RedisConfig::new())
            .await
            .expect_err("not a Redis URL");
        assert_eq!(bad.class, FailureClass::Permanent, "{bad}");

        let unreachable = RedisTransport::connect(
            "redis://127.0.0.1:1/0",
            RedisConfig::new().timeout(Duration::from_secs(2)),
        )
        .await
        .expect_err("nothing listens on port 1");
        assert_eq!(unreachable.class, FailureClass::Transient, "{unreachable}");
    });
}

/// Puts `maxmemory` back to unlimited, even when the test fails.
struct MaxMemoryReset;

impl Drop for MaxMemoryReset {
    fn drop(&mut self) {
        let mut connection = redis::Client::open(service_url("REDIS_URL"))
            .and_then(|client| client.get_connection())
            .expect("connect to reset maxmemory");
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg("0")
            .query(&mut connection)
            .expect("reset maxmemory");
    }
}

#[test]
fn oom_is_transient_back_pressure_and_the_message_goes_out_once_memory_frees() {
    let _serial = serial();
    harness::run(|| async {
        let prefix = format!("test:{}:", unique());
        let transport = transport(config(&prefix)).await;
        let mut connection = client().await;
        let reset = MaxMemoryReset;
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg("1")
            .query_async(&mut connection)
            .await
            .expect("CONFIG SET maxmemory");
        let store = MemoryOutbox::new();
        let ids = enqueue(&store, "orders.placed", 1).await;
        let (bus, stats) = counting(transport, false);
        let coordinator = coordinator(&store, bus);
        wait_for("a refused publish", Duration::from_secs(30), || async {
            stats.failed() >= 2
        })
        .await;
        let message = store.get_message(&ids[0]).await.expect("message exists");
        assert_ne!(
            message.status,
            MessageStatus::DeadLettered,
            "retried, not dead-lettered"
        );
        let error = message.last_error.expect("the refusal is recorded");
        assert!(error.message.contains("OOM"), "{error:?}");

        drop(reset);
        let message = settled(&store, &ids[0], Duration::from_secs(30)).await;
        shutdown(coordinator).await;
        assert_eq!(message.status, MessageStatus::Delivered);
        assert_eq!(entries(&format!("{prefix}orders.placed")).await.len(), 1);
    });
}

/// A claimed message of `name` with `id`, as the runtime hands it over.
fn delivery(id: &str, name: &str) -> Delivery {
    let payload = Payload::from_json(format!(r#"{{"id":"{id}"}}"#)).expect("JSON");
    delivery_of(claimed(id, MessageKind::Event, name, payload, None, 1))
}

/// How many script calls (`EVALSHA`) the server has answered so far.
async fn script_calls(connection: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(connection)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().expect("a count"))
}

#[test]
fn publishes_made_together_share_script_calls_and_each_gets_its_own_answer() {
    let _serial = serial();
    harness::run(|| async {
        let prefix = format!("test:{}:", unique());
        let mut connection = client().await;
        // Appends to this stream key are refused: it holds a string.
        let _: () = redis::cmd("SET")
            .arg(format!("{prefix}broken"))
            .arg("not a stream")
            .query_async(&mut connection)
            .await
            .expect("SET");
        let transport = transport(config(&prefix)).await;
        // More than one call takes; every tenth to the broken stream; the
        // last 50 repeat the first 50 ids (and their streams).
        let deliveries: Vec<Delivery> = (0..300)
            .map(|n| {
                let name = if n % 10 == 9 {
                    "broken"
                } else {
                    "orders.placed"
                };
                delivery(&format!("m-{}", n % 250), name)
            })
            .collect();
        let calls_before = script_calls(&mut connection).await;
        let answers =
            futures_util::future::join_all(deliveries.iter().map(|d| transport.send(d))).await;
        let calls = script_calls(&mut connection).await - calls_before;

        for (n, answer) in answers.iter().enumerate() {
            match answer {
                // A refused append removes its dedup key, so the repeat is
                // tried and refused again.
                Err(error) if n % 10 == 9 => {
                    assert_eq!(error.class, FailureClass::Permanent, "{error}");
                    assert!(error.reason.starts_with("WRONGTYPE"), "{error}");
                }
                Ok(Appended::Duplicate) if n >= 250 => {}
                Ok(Appended::Entry(entry)) if n < 250 => assert!(!entry.is_empty()),
                other => panic!("publish {n}: {other:?}"),
            }
        }
        assert!(
            (5..=20).contains(&calls),
            "300 publishes made at once took {calls} script calls"
        );
        let stored = entries(&format!("{prefix}orders.placed")).await;
        assert_eq!(
            stored.len(),
            225,
            "each id once, the refused ones not at all"
        );
        let ids: HashSet<&str> = stored
            .iter()
            .map(|entry| entry["Outbox-Message-Id"].as_str())
            .collect();
        assert_eq!(ids.len(), 225);
    });
}

#[test]
fn a_transport_outlives_the_runtime_its_calls_ran_on() {
    let _serial = serial();
    let prefix = format!("test:{}:", unique());
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    };
    let first = runtime();
    let transport = first.block_on(async {
        let transport = transport(config(&prefix)).await;
        let appended = transport
            .send(&delivery("m-1", "orders.placed"))
            .await
            .expect("published");
        assert!(matches!(appended, Appended::Entry(_)), "{appended:?}");
        transport
    });
    // Its calls ran on this runtime, and so did its connection.
    drop(first);
    runtime().block_on(async {
        // The connection went with the runtime: the first call may fail as
        // transient, and the next one connects again.
        let mut answers = Vec::new();
        for _ in 0..3 {
            let answer = transport.send(&delivery("m-2", "orders.placed")).await;
            let done = answer.is_ok();
            answers.push(answer);
            if done {
                break;
            }
        }
        match answers.as_slice() {
            [.., Ok(Appended::Entry(_))] => {}
            other => panic!("not published again: {other:?}"),
        }
        for answer in &answers[..answers.len() - 1] {
            let error = answer.as_ref().expect_err("only the last one succeeded");
            assert_eq!(error.class, FailureClass::Transient, "{error}");
        }
        assert_eq!(entries(&format!("{prefix}orders.placed")).await.len(), 2);
    });
}

#[test]
fn a_script_the_server_forgot_is_loaded_again_and_the_publish_goes_out() {
    let _serial = serial();
    harness::run(|| async {
        let prefix = format!("test:{}:", unique());
        let transport = transport(config(&prefix)).await;
        let mut connection = client().await;
        // As a restart or a failover to a replica without it would.
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut connection)
            .await
            .expect("SCRIPT FLUSH");
        let appended = transport
            .send(&delivery("m-1", "orders.placed"))
            .await
            .expect("appended after loading the script again");
        assert!(matches!(appended, Appended::Entry(_)), "{appended:?}");
        let entries = entries(&format!("{prefix}orders.placed")).await;
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0]["Outbox-Message-Id"], "m-1");
        assert_eq!(entries[0]["payload"], r#"{"id":"m-1"}"#);
    });
}
