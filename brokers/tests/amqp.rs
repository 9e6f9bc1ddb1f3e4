//! The RabbitMQ transport against a real `rabbitmq-server` (`AMQP_URL`, and
//! `WITH_SERVICES_CTL` to stop and start it).

mod harness;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use harness::{
    coordinator, count, counting, ctl, enqueue, serial, service_url, settled, shutdown, unique,
    wait_for,
};
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox::{MemoryOutbox, MessageStatus, OutboxAdmin};
use outbox_brokers::amqp::{AmqpConfig, AmqpTransport};
use outbox_brokers::{FailureClass, NameMap};

/// One message as a consumer received it.
#[derive(Debug)]
struct Received {
    message_id: String,
    delivery_mode: Option<u8>,
    headers: BTreeMap<String, String>,
    payload: String,
}

async fn channel() -> (Connection, Channel) {
    let connection = Connection::connect(&service_url("AMQP_URL"), ConnectionProperties::default())
        .await
        .expect("connect to AMQP_URL");
    let channel = connection.create_channel().await.expect("open a channel");
    (connection, channel)
}

/// A durable topic exchange with a durable queue bound to every key under
/// `outbox.`; both named `name`.
async fn topology(name: &str) {
    let (connection, channel) = channel().await;
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(name, ExchangeKind::Topic, durable, FieldTable::default())
        .await
        .expect("declare the exchange");
    let queue = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(name, queue, FieldTable::default())
        .await
        .expect("declare the queue");
    channel
        .queue_bind(
            name,
            name,
            "outbox.#",
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind the queue");
    let _ = connection.close(200, "done").await;
}

/// Everything in queue `name`, taken off it.
async fn consume(name: &str) -> Vec<Received> {
    let (connection, channel) = channel().await;
    let mut received = Vec::new();
    let take = BasicGetOptions { no_ack: true };
    while let Some(message) = channel.basic_get(name, take).await.expect("basic.get") {
        let properties = &message.delivery.properties;
        let headers = properties
            .headers()
            .as_ref()
            .map(|table| {
                table
                    .inner()
                    .iter()
                    .map(|(key, value)| {
                        let value = value
                            .as_long_string()
                            .map(ToString::to_string)
                            .unwrap_or_else(|| format!("{value:?}"));
                        (key.to_string(), value)
                    })
                    .collect()
            })
            .unwrap_or_default();
        received.push(Received {
            message_id: properties
                .message_id()
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            delivery_mode: *properties.delivery_mode(),
            headers,
            payload: String::from_utf8(message.delivery.data.clone()).expect("UTF-8"),
        });
    }
    let _ = connection.close(200, "done").await;
    received
}

async fn transport(exchange: &str) -> AmqpTransport {
    AmqpTransport::connect(
        &service_url("AMQP_URL"),
        AmqpConfig::new(exchange)
            .routing(NameMap::new("outbox."))
            .confirm_timeout(Duration::from_secs(5)),
    )
    .await
    .expect("connect the transport")
}

#[test]
fn redeliveries_carry_the_same_message_id_for_consumers_to_dedup_on() {
    let _serial = serial();
    harness::run(|| async {
        const N: usize = 200;
        let name = format!("outbox.test.{}", unique());
        topology(&name).await;
        let store = MemoryOutbox::new();
        let ids = enqueue(&store, "orders.placed", N).await;
        let (bus, stats) = counting(transport(&name).await, true);
        let coordinator = coordinator(&store, bus);
        wait_for(
            "every message delivered",
            Duration::from_secs(60),
            || async { count(&store, MessageStatus::Delivered).await == N },
        )
        .await;
        shutdown(coordinator).await;
        assert_eq!(stats.acked(), 2 * N as u64);

        // RabbitMQ routes both copies; the consumer tells them apart only by
        // message_id, which every copy carries.
        let received = consume(&name).await;
        assert_eq!(received.len(), 2 * N);
        let mut copies: HashMap<&str, Vec<&Received>> = HashMap::new();
        for message in &received {
            copies.entry(&message.message_id).or_default().push(message);
        }
        assert_eq!(copies.len(), N, "deduplicated on message_id");
        for id in &ids {
            let copies = &copies[id.as_str()];
            assert_eq!(copies.len(), 2);
            let mut attempts: Vec<&str> = copies
                .iter()
                .map(|m| m.headers["Outbox-Attempt"].as_str())
                .collect();
            attempts.sort_unstable();
            assert_eq!(attempts, ["1", "2"]);
            for copy in copies {
                assert_eq!(copy.headers["Outbox-Message-Id"], *id);
                assert_eq!(copy.delivery_mode, Some(2), "persistent");
            }
        }
    });
}

#[test]
fn a_restarted_rabbitmq_loses_nothing_and_the_drain_resumes_by_itself() {
    let _serial = serial();
    harness::run(|| async {
        const N: usize = 3_000;
        let name = format!("outbox.test.{}", unique());
        topology(&name).await;
        let store = MemoryOutbox::new();
        enqueue(&store, "orders.placed", N).await;
        let (bus, stats) = counting(transport(&name).await, false);
        let coordinator = coordinator(&store, bus);
        let limit = Duration::from_secs(60);
        wait_for("a tenth delivered", limit, || async {
            count(&store, MessageStatus::Delivered).await >= N / 10
        })
        .await;
        ctl("stop", "rabbitmq");
        wait_for("a publish to fail", limit, || async { stats.failed() > 0 }).await;
        let delivered_before_start = count(&store, MessageStatus::Delivered).await;
        ctl("start", "rabbitmq");
        wait_for(
            "every message delivered",
            Duration::from_secs(180),
            || async { count(&store, MessageStatus::Delivered).await == N },
        )
        .await;
        shutdown(coordinator).await;

        let received = consume(&name).await;
        let distinct: HashSet<&str> = received.iter().map(|m| m.message_id.as_str()).collect();
        let lost = N - distinct.len();
        println!(
            "rabbitmq restart: N={N} delivered_before_start={delivered_before_start} \
             failed_publishes={} acked_publishes={} received={} distinct_message_ids={} \
             lost={lost} duplicates_before_dedup={} duplicates_after_dedup=0",
            stats.failed(),
            stats.acked(),
            received.len(),
            distinct.len(),
            received.len() - distinct.len(),
        );
        assert!(stats.failed() > 0, "the outage was seen");
        assert_eq!(lost, 0);
        assert_eq!(count(&store, MessageStatus::DeadLettered).await, 0);
    });
}

#[test]
fn an_unroutable_message_dead_letters_at_once_with_the_reason() {
    let _serial = serial();
    harness::run(|| async {
        let name = format!("outbox.test.{}", unique());
        // The exchange exists, but no queue is bound to it.
        let (connection, channel) = channel().await;
        channel
            .exchange_declare(
                &name,
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    auto_delete: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare the exchange");
        let store = MemoryOutbox::new();
        let ids = enqueue(&store, "orders.placed", 1).await;
        let coordinator = coordinator(&store, transport(&name).await);
        let message = settled(&store, &ids[0], Duration::from_secs(30)).await;
        shutdown(coordinator).await;
        let _ = connection.close(200, "done").await;

        assert_eq!(message.status, MessageStatus::DeadLettered);
        assert_eq!(message.attempts, 1, "dead-lettered at once");
        let error = message.last_error.expect("the reason is kept");
        assert!(error.message.contains("NO_ROUTE"), "{error:?}");
        assert!(error.message.contains("outbox.orders.placed"), "{error:?}");
    });
}

#[test]
fn the_trace_context_arrives_in_the_headers() {
    let _serial = serial();
    harness::run(|| async {
        let name = format!("outbox.test.{}", unique());
        topology(&name).await;
        let store = MemoryOutbox::new();
        let ids = enqueue(&store, "orders.placed", 1).await;
        let coordinator = coordinator(&store, transport(&name).await);
        let message = settled(&store, &ids[0], Duration::from_secs(30)).await;
        shutdown(coordinator).await;
        assert_eq!(message.status, MessageStatus::Delivered);

        let received = consume(&name).await;
        assert_eq!(received.len(), 1);
        let got = &received[0];
        let trace = harness::trace();
        assert_eq!(got.message_id, ids[0]);
        assert_eq!(got.payload, r#"{"n":0}"#);
        assert_eq!(got.headers["traceparent"], trace.traceparent);
        assert_eq!(Some(&got.headers["tracestate"]), trace.tracestate.as_ref());
        assert_eq!(got.headers["Outbox-Name"], "orders.placed");
        assert_eq!(got.headers["Outbox-Kind"], "event");
    });
}

#[test]
fn a_missing_exchange_is_a_connect_error_not_a_retry_loop() {
    let _serial = serial();
    harness::run(|| async {
        let name = format!("outbox.test.missing.{}", unique());
        let error = AmqpTransport::connect(&service_url("AMQP_URL"), AmqpConfig::new(&name))
            .await
            .expect_err("the exchange does not exist");
        assert_eq!(error.class, FailureClass::Permanent, "{error}");
        assert_eq!(error.operation, "declare exchange");
        assert!(error.reason.contains("NOT_FOUND"), "{error}");

        let unreachable = AmqpTransport::connect("amqp://127.0.0.1:1/%2f", AmqpConfig::new(""))
            .await
            .expect_err("nothing listens on port 1");
        assert_eq!(unreachable.class, FailureClass::Transient, "{unreachable}");
    });
}

#[test]
fn a_nack_is_retried_and_the_message_goes_out_once_a_queue_takes_it() {
    let _serial = serial();
    harness::run(|| async {
        let name = format!("outbox.test.{}", unique());
        let (connection, channel) = channel().await;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        channel
            .exchange_declare(&name, ExchangeKind::Topic, durable, FieldTable::default())
            .await
            .expect("declare the exchange");
        // A queue that refuses every message: the broker nacks the publish.
        let mut full = FieldTable::default();
        full.insert("x-max-length".into(), AMQPValue::LongLongInt(0));
        full.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        let refusing = format!("{name}.full");
        channel
            .queue_declare(&refusing, QueueDeclareOptions::default(), full)
            .await
            .expect("declare the refusing queue");
        channel
            .queue_bind(
                &refusing,
                &name,
                "outbox.#",
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind the refusing queue");

        let store = MemoryOutbox::new();
        let ids = enqueue(&store, "orders.placed", 1).await;
        let (bus, stats) = counting(transport(&name).await, false);
        let coordinator = coordinator(&store, bus);
        wait_for("a nacked publish", Duration::from_secs(30), || async {
            stats.failed() >= 2
        })
        .await;
        let message = store.get_message(&ids[0]).await.expect("message exists");
        assert_ne!(message.status, MessageStatus::DeadLettered, "retried");
        let error = message.last_error.expect("the nack is recorded");
        assert!(error.message.contains("nacked"), "{error:?}");

        // Bind a queue that takes messages, then remove the refusing one
        // (in this order, so the message is never unroutable).
        topology(&name).await;
        channel
            .queue_delete(&refusing, QueueDeleteOptions::default())
            .await
            .expect("delete the refusing queue");
        let _ = connection.close(200, "done").await;
        let message = settled(&store, &ids[0], Duration::from_secs(30)).await;
        shutdown(coordinator).await;
        assert_eq!(message.status, MessageStatus::Delivered);
        // A retry published while both queues were bound reached the
        // taking queue and was still nacked by the refusing one, so it went
        // out again: the taking queue may hold copies, all with the id a
        // consumer deduplicates on.
        let received = consume(&name).await;
        assert!(!received.is_empty(), "the message went out");
        assert!(
            received.iter().all(|copy| copy.message_id == ids[0]),
            "{received:?}"
        );
    });
}
