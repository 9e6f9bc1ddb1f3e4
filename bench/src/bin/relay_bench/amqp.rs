//! RabbitMQ: an exchange and a queue per destination, persistent and
//! mandatory publishes on a confirm-mode channel.

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox_brokers::{AmqpConfig, AmqpTransport, NameMap};

use super::*;

/// Routing keys are this prefix and the message name; each destination
/// is an exchange of its own with one queue bound to `bench.#`.
const PREFIX: &str = "bench.";

pub(super) struct Amqp {
    url: String,
    connection: Connection,
    channel: Channel,
    names: Vec<String>,
}

/// A connection to `url` and a channel on it in confirm mode.
async fn confirm_channel(url: &str) -> (Connection, Channel) {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect to AMQP_URL");
    let channel = connection.create_channel().await.expect("a channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm mode");
    (connection, channel)
}

impl Amqp {
    pub(super) async fn connect() -> Amqp {
        let url = service_url("AMQP_URL", "amqp");
        let (connection, channel) = confirm_channel(&url).await;
        Amqp {
            url,
            connection,
            channel,
            names: Vec::new(),
        }
    }

    /// A durable topic exchange and a durable queue bound to it, both
    /// named after the run.
    async fn fresh(&mut self) -> String {
        let name = format!("relay_bench_{}_{}", std::process::id(), self.names.len());
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        self.channel
            .exchange_declare(&name, ExchangeKind::Topic, durable, FieldTable::default())
            .await
            .expect("declare the bench exchange");
        let queue = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        self.channel
            .queue_declare(&name, queue, FieldTable::default())
            .await
            .expect("declare the bench queue");
        self.channel
            .queue_bind(
                &name,
                &name,
                &format!("{PREFIX}#"),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind the bench queue");
        self.names.push(name.clone());
        name
    }
}

/// The raw loop.
async fn publish(channel: &Channel, exchange: &str, payloads: Vec<String>, window: usize) {
    let routing_key = format!("{PREFIX}orders.placed");
    let mandatory = BasicPublishOptions {
        mandatory: true,
        immediate: false,
    };
    let acked = |confirmed: lapin::Result<Confirmation>| {
        let confirmed = confirmed.expect("confirmed");
        assert!(
            matches!(confirmed, Confirmation::Ack(None)),
            "{confirmed:?}"
        );
    };
    let mut confirms = FuturesUnordered::new();
    for (n, payload) in payloads.iter().enumerate() {
        // The properties the transport sends, built per message as it does.
        let id = format!("raw-{n}");
        let mut headers = FieldTable::default();
        for (name, value) in [
            ("Outbox-Message-Id", id.as_str()),
            ("Outbox-Name", "orders.placed"),
            ("Outbox-Kind", "event"),
            ("Outbox-Attempt", "1"),
        ] {
            headers.insert(
                ShortString::from(name),
                AMQPValue::LongString(LongString::from(value)),
            );
        }
        let properties = BasicProperties::default()
            .with_message_id(ShortString::from(id))
            .with_type(ShortString::from("orders.placed"))
            .with_content_type(ShortString::from("application/json"))
            .with_delivery_mode(2)
            .with_headers(headers);
        let confirm = channel
            .basic_publish(
                exchange,
                &routing_key,
                mandatory,
                payload.as_bytes(),
                properties,
            )
            .await
            .expect("publish");
        confirms.push(confirm.into_future());
        if confirms.len() >= window {
            acked(confirms.next().await.expect("a confirm"));
        }
    }
    while let Some(confirmed) = confirms.next().await {
        acked(confirmed);
    }
}

impl Broker for Amqp {
    const NAME: &'static str = "amqp";
    type Transport = AmqpTransport;

    async fn transport(&mut self) -> AmqpTransport {
        let name = self.fresh().await;
        let config = AmqpConfig::new(name).routing(NameMap::new(PREFIX));
        AmqpTransport::connect(&self.url, config)
            .await
            .expect("the bench exchange")
    }

    async fn raw(&mut self, messages: u64, window: usize) -> Spent {
        let exchange = self.fresh().await;
        let url = self.url.clone();
        let connect = move || async move { confirm_channel(&url).await };
        let payloads = (0..messages).map(payload_json).collect();
        raw_on_own_runtime(connect, move |(connection, channel)| async move {
            publish(&channel, &exchange, payloads, window).await;
            let _ = connection.close(200, "done").await;
        })
    }

    async fn stored(&mut self) -> u64 {
        let name = self.names.last().expect("a queue");
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let queue = self
            .channel
            .queue_declare(name, passive, FieldTable::default())
            .await
            .expect("the bench queue");
        u64::from(queue.message_count())
    }

    async fn clean_up(&mut self) {
        for name in self.names.drain(..) {
            let _ = self
                .channel
                .queue_delete(&name, QueueDeleteOptions::default())
                .await;
            let _ = self
                .channel
                .exchange_delete(&name, ExchangeDeleteOptions::default())
                .await;
        }
        let _ = self.connection.close(200, "done").await;
    }
}
