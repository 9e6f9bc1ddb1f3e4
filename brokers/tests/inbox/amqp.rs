//! The RabbitMQ consumer, on a SQLite inbox.

use std::time::Duration;

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox::MemoryOutbox;
use outbox_brokers::NameMap;
use outbox_brokers::amqp::{AmqpConfig, AmqpTransport};
use outbox_brokers::consume::AmqpInboxConsumer;

use crate::harness::{
    self, coordinator, counting, enqueue, service_url, shutdown, unique, wait_for,
};
use crate::{Behaviour, Running, WAIT, applied, assert_once, sqlite, sqlite_handler, stopped};

async fn channel() -> (Connection, Channel) {
    let connection = Connection::connect(&service_url("AMQP_URL"), ConnectionProperties::default())
        .await
        .expect("connect to AMQP_URL");
    let channel = connection.create_channel().await.expect("open a channel");
    (connection, channel)
}

/// A queue `name` (durable, with `arguments`), bound to a topic exchange
/// also named `name` for every key under `outbox.`.
async fn topology(channel: &Channel, name: &str, arguments: FieldTable) {
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
        .queue_declare(name, queue, arguments)
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
}

/// `(ready messages, consumers)` of queue `name`.
async fn queue_state(channel: &Channel, name: &str) -> (u32, u32) {
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let queue = channel
        .queue_declare(name, passive, FieldTable::default())
        .await
        .expect("the queue exists");
    (queue.message_count(), queue.consumer_count())
}

#[test]
fn relayed_messages_with_lost_confirms_are_applied_once_through_failures() {
    harness::run(|| async {
        const N: usize = 30;
        let name = format!("inbox-{}", unique());
        let (_connection, channel) = channel().await;
        topology(&channel, &name, FieldTable::default()).await;
        let (inbox, effects) = sqlite().await;

        // The relay loses every first confirm: each message is published
        // twice, and RabbitMQ keeps both copies.
        let store = MemoryOutbox::new();
        let ids = enqueue(&store, "orders.placed", N).await;
        let transport = AmqpTransport::connect(
            &service_url("AMQP_URL"),
            AmqpConfig::new(&name).routing(NameMap::new("outbox.")),
        )
        .await
        .expect("connect the transport");
        let (bus, stats) = counting(transport, true);
        let relay = coordinator(&store, bus);
        wait_for("the relay to publish everything", WAIT, || async {
            harness::count(&store, outbox::MessageStatus::Delivered).await == N
        })
        .await;
        shutdown(relay).await;
        let copies = stats.acked();
        assert_eq!(copies, 2 * N as u64, "each message published twice");

        let consumer = AmqpInboxConsumer::connect(
            &service_url("AMQP_URL"),
            &name,
            inbox.clone(),
            "billing",
            sqlite_handler(&effects, Behaviour::FailFirst),
        )
        .await
        .expect("connect the consumer")
        .prefetch(1)
        .retry_delay(Duration::from_millis(50));
        let running = Running::start(|signal| consumer.run(stopped(signal)));
        wait_for("every copy to be consumed", WAIT, || async {
            applied(inbox.pool(), &effects).await.len() == N
                && queue_state(&channel, &name).await.0 == 0
        })
        .await;
        let report = running.stop().await;
        // A copy delivered but not yet taken when the consumer stopped goes
        // back to the queue once its connection is gone.
        wait_for("the consumer to leave the queue", WAIT, || async {
            queue_state(&channel, &name).await.1 == 0
        })
        .await;
        let left = u64::from(queue_state(&channel, &name).await.0);

        assert_once(&applied(inbox.pool(), &effects).await, &ids);
        assert_eq!(
            (report.processed, report.failed),
            (N as u64, N as u64),
            "{report:?}"
        );
        assert_eq!(
            report.processed + report.duplicates + left,
            copies,
            "every copy applied, skipped or still queued: {report:?}"
        );
    });
}

#[tokio::test]
async fn a_message_without_an_id_is_dead_lettered() {
    let name = format!("inbox-{}", unique());
    let dead = format!("{name}.dead");
    let (_connection, channel) = channel().await;
    channel
        .queue_declare(&dead, QueueDeclareOptions::default(), FieldTable::default())
        .await
        .expect("declare the dead-letter queue");
    let mut arguments = FieldTable::default();
    arguments.insert(
        ShortString::from("x-dead-letter-exchange"),
        AMQPValue::LongString(LongString::from("")),
    );
    arguments.insert(
        ShortString::from("x-dead-letter-routing-key"),
        AMQPValue::LongString(LongString::from(dead.as_str())),
    );
    topology(&channel, &name, arguments).await;
    let (inbox, effects) = sqlite().await;

    let publish = |properties: BasicProperties, body: &'static [u8]| {
        let channel = channel.clone();
        let name = name.clone();
        async move {
            channel
                .basic_publish(
                    &name,
                    "outbox.orders.placed",
                    BasicPublishOptions::default(),
                    body,
                    properties,
                )
                .await
                .expect("publish")
                .await
                .expect("confirmed");
        }
    };
    publish(BasicProperties::default(), b"{\"anonymous\":true}").await;
    publish(
        BasicProperties::default().with_message_id(ShortString::from("m-1")),
        b"{}",
    )
    .await;

    let consumer = AmqpInboxConsumer::connect(
        &service_url("AMQP_URL"),
        &name,
        inbox.clone(),
        "billing",
        sqlite_handler(&effects, Behaviour::Apply),
    )
    .await
    .expect("connect the consumer");
    let running = Running::start(|signal| consumer.run(stopped(signal)));
    wait_for("the refused message to be dead-lettered", WAIT, || async {
        queue_state(&channel, &dead).await.0 == 1
            && applied(inbox.pool(), &effects).await.len() == 1
    })
    .await;
    let report = running.stop().await;
    assert_eq!((report.processed, report.refused), (1, 1), "{report:?}");
    let refused = channel
        .basic_get(&dead, BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get")
        .expect("the refused message");
    assert_eq!(refused.delivery.data, b"{\"anonymous\":true}");
}
