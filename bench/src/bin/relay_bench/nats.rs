//! NATS JetStream: a stream per destination, publishes acknowledged by
//! `PubAck`.

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use outbox_brokers::{NameMap, NatsConfig, NatsTransport};

use super::*;

pub(super) struct Nats {
    url: String,
    js: jetstream::Context,
    streams: Vec<String>,
    next: usize,
    window: usize,
}

impl Nats {
    pub(super) async fn connect(window: usize) -> Nats {
        let url = service_url("NATS_URL", "nats");
        let client = async_nats::connect(&url)
            .await
            .expect("connect to NATS_URL");
        Nats {
            url,
            js: jetstream::new(client),
            streams: Vec::new(),
            next: 0,
            window,
        }
    }

    async fn fresh(&mut self) -> (String, String) {
        let id = format!("{}_{}", std::process::id(), self.next);
        self.next += 1;
        let name = format!("BENCH_{id}");
        let prefix = format!("bench{id}.");
        self.js
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{prefix}>")],
                ..Default::default()
            })
            .await
            .expect("create the bench stream");
        self.streams.push(name.clone());
        (name, prefix)
    }
}

impl Broker for Nats {
    const NAME: &'static str = "nats";
    type Transport = NatsTransport;

    async fn transport(&mut self) -> NatsTransport {
        let (name, prefix) = self.fresh().await;
        let config = NatsConfig::new(name, NameMap::new(prefix)).max_ack_inflight(self.window);
        NatsTransport::connect(&self.url, config)
            .await
            .expect("the bench stream")
    }

    async fn raw(&mut self, messages: u64, window: usize) -> Spent {
        let (_, prefix) = self.fresh().await;
        let url = self.url.clone();
        let connect = move || async move {
            let client = async_nats::connect(url).await.expect("connect to NATS_URL");
            jetstream::ContextBuilder::new()
                .max_ack_inflight(window)
                .backpressure_on_inflight(true)
                .build(client)
        };
        let payloads = (0..messages)
            .map(|n| Bytes::from(payload_json(n)))
            .collect();
        raw_on_own_runtime(connect, move |js| publish(js, prefix, payloads, window))
    }

    async fn stored(&mut self) -> u64 {
        let name = self.streams.last().expect("a stream").clone();
        let mut stream = self.js.get_stream(&name).await.expect("the stream");
        stream.info().await.expect("stream info").state.messages
    }

    async fn clean_up(&mut self) {
        for name in self.streams.drain(..) {
            let _ = self.js.delete_stream(&name).await;
        }
    }
}

/// The raw loop.
async fn publish(js: jetstream::Context, prefix: String, payloads: Vec<Bytes>, window: usize) {
    let subject = format!("{prefix}orders.placed");
    let mut acks = FuturesUnordered::new();
    for (n, payload) in payloads.into_iter().enumerate() {
        // The headers the transport sends, built per message as it does.
        let id = format!("raw-{n}");
        let mut headers = HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
        headers.insert("Outbox-Message-Id", id.as_str());
        headers.insert("Outbox-Name", "orders.placed");
        headers.insert("Outbox-Kind", "event");
        headers.insert("Outbox-Attempt", "1");
        let ack = js
            .publish_with_headers(subject.clone(), headers, payload)
            .await
            .expect("publish");
        acks.push(ack.into_future());
        if acks.len() >= window {
            acks.next().await.expect("an ack").expect("acknowledged");
        }
    }
    while let Some(ack) = acks.next().await {
        ack.expect("acknowledged");
    }
}
