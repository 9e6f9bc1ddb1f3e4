//! The five-minute tour, on embedded SQLite:
//!
//! ```text
//! cargo run --example quickstart                # ./quickstart.db
//! cargo run --example quickstart -- --db /tmp/shop.db --orders 500
//! ```
//!
//! It places orders, each an `orders` row and an `OrderPlaced` event written
//! in one transaction, then drains them inside an actix system to two handler
//! actors: billing fails now and then (retried) and always for one customer
//! (dead-lettered), shipping sometimes runs longer than `max_active` (its
//! lease is given up and a subscriber hears of it; the message is delivered
//! again once the lease ends). It shows progress, prints a summary and exits.
//! Running it again adds orders to the same database.

use std::collections::{BTreeMap, HashSet};
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use outbox::{
    Clock, MessageStatus, OutboxAdmin, OutboxStats, RetryPolicy, SqliteOutbox, SystemClock,
};
use outbox_actors::prelude::*;
use serde::{Deserialize, Serialize};

/// The event every order emits, committed with the order row.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: i64,
    customer: String,
    total_cents: i64,
}

impl Event for OrderPlaced {
    const NAME: &'static str = "order.placed";
}

/// Charges the card. Idempotent: delivery is at-least-once, so a retried
/// message must not charge twice.
struct Billing {
    charged: HashSet<String>,
    duplicates: Arc<Mutex<u64>>,
}

impl Actor for Billing {
    type Context = Context<Self>;
}

impl Handler<DeliverEvent<OrderPlaced>> for Billing {
    type Result = DeliveryResult;

    fn handle(
        &mut self,
        order: DeliverEvent<OrderPlaced>,
        _: &mut Context<Self>,
    ) -> DeliveryResult {
        if order.event.customer == "mallory" {
            return Err(DeliveryError::msg("card declined: reported stolen"));
        }
        // A flaky payment provider: about one first attempt in twelve times out.
        if order.context.attempt() == 1 && order.event.order_id % 12 == 5 {
            return Err(DeliveryError::msg("payment provider timed out"));
        }
        if !self.charged.insert(order.context.id().to_owned()) {
            // Charged on an earlier attempt whose outcome was not stored.
            *self.duplicates.lock().unwrap() += 1;
        }
        Ok(())
    }
}

/// Books the courier. Now and then the courier API hangs on a first attempt.
struct Shipping;

impl Actor for Shipping {
    type Context = Context<Self>;
}

impl Handler<DeliverEvent<OrderPlaced>> for Shipping {
    type Result = ResponseFuture<DeliveryResult>;

    fn handle(&mut self, order: DeliverEvent<OrderPlaced>, _: &mut Context<Self>) -> Self::Result {
        let hangs = order.context.attempt() == 1 && order.event.order_id % 97 == 13;
        Box::pin(async move {
            let work = if hangs {
                Duration::from_secs(60)
            } else {
                Duration::from_millis(2)
            };
            tokio::time::sleep(work).await;
            Ok(())
        })
    }
}

/// Collects what a subscriber hears.
#[derive(Default)]
struct Heard {
    leases: Vec<LeaseLost>,
    dead_letters: Vec<DeadLetter>,
}

struct Listener(Arc<Mutex<Heard>>);

impl Actor for Listener {
    type Context = Context<Self>;
}

impl Handler<LeaseLost> for Listener {
    type Result = ();
    fn handle(&mut self, lost: LeaseLost, _: &mut Context<Self>) {
        self.0.lock().unwrap().leases.push(lost);
    }
}

impl Handler<OutcomeNotice> for Listener {
    type Result = ();
    fn handle(&mut self, notice: OutcomeNotice, _: &mut Context<Self>) {
        if let OutcomeNotice::DeadLettered(dead) = notice {
            self.0.lock().unwrap().dead_letters.push(dead);
        }
    }
}

struct Args {
    db: String,
    orders: u32,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        db: "quickstart.db".into(),
        orders: 300,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--db" => args.db = value()?,
            "--orders" => {
                args.orders = value()?
                    .parse()
                    .map_err(|e| format!("--orders must be a number: {e}"))?
            }
            "--help" | "-h" => return Err("usage: quickstart [--db PATH] [--orders N]".into()),
            other => return Err(format!("unknown argument {other:?}; see --help")),
        }
    }
    if args.orders == 0 || args.orders > 100_000 {
        return Err("--orders must be between 1 and 100000".into());
    }
    Ok(args)
}

#[actix::main]
async fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    if let Err(error) = run(args).await {
        eprintln!("quickstart failed: {error}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let url = format!("sqlite://{}", args.db);
    println!("outbox quickstart: {} orders into {}", args.orders, args.db);

    // 1. Open the database; `connect` creates the file and the outbox table.
    let outbox = SqliteOutbox::connect(&url).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (
            id INTEGER PRIMARY KEY, customer TEXT NOT NULL, total_cents INTEGER NOT NULL)",
    )
    .execute(outbox.pool())
    .await?;
    let before = outbox.stats(SystemClock.now()).await?;

    // 2. Place orders: the row and its event commit together, or not at all.
    let customers = [
        "ada", "grace", "linus", "barbara", "mallory", "ken", "margaret",
    ];
    for n in 0..args.orders {
        let mut tx = outbox.pool().begin().await?;
        let customer = customers[n as usize % customers.len()];
        let total_cents = 1_000 + i64::from(n % 50) * 137;
        let order_id: i64 = sqlx::query_scalar(
            "INSERT INTO orders (customer, total_cents) VALUES (?, ?) RETURNING id",
        )
        .bind(customer)
        .bind(total_cents)
        .fetch_one(&mut *tx)
        .await?;
        let event = OrderPlaced {
            order_id,
            customer: customer.into(),
            total_cents,
        };
        outbox.enqueue_event_in(&mut tx, &event).await?;
        tx.commit().await?;
    }

    // 3. Start the drain: handler actors, a listener, a coordinator on a schedule.
    let heard = Arc::new(Mutex::new(Heard::default()));
    let listener = Listener(heard.clone()).start();
    let duplicates = Arc::new(Mutex::new(0));
    let billing = Billing {
        charged: HashSet::new(),
        duplicates: duplicates.clone(),
    }
    .start();
    let shipping = Shipping.start();
    let config = DrainConfig {
        concurrency: 16,
        // A pass ends when its slowest delivery ends, so let one pass take
        // everything that is due rather than wait on a straggler.
        batch_size: 1_000,
        // Short enough that the tour shows a lost lease within a second or two.
        lease: Duration::from_secs(1),
        max_active: Duration::from_millis(1_500),
        every: Some(Duration::from_millis(200)),
        retry: RetryPolicy::fixed(Duration::from_millis(200)).with_max_attempts(3),
        ..DrainConfig::default()
    };
    // No registry: the subscriptions name the events, and their types.
    let coordinator = DrainCoordinator::builder(outbox.clone())
        .event_bus(
            RecipientBus::new()
                .subscribe(billing.clone().recipient())
                .subscribe(shipping.recipient()),
        )
        .config(config)
        .start()?;
    coordinator
        .send(Subscribe::LeaseLost(listener.clone().recipient()))
        .await?;
    coordinator
        .send(Subscribe::Outcomes(listener.recipient()))
        .await?;

    // 4. Watch it drain.
    let started = Instant::now();
    let target = u64::from(args.orders);
    let mut stats: OutboxStats;
    let mut shown = None;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        stats = outbox.stats(SystemClock.now()).await?;
        let settled =
            (stats.delivered - before.delivered) + (stats.dead_lettered - before.dead_lettered);
        progress(settled.min(target), target, &stats, &mut shown);
        if stats.pending + stats.claimed == 0 && settled >= target {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err("the outbox did not drain within two minutes".into());
        }
    }
    let elapsed = started.elapsed();
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
    let status = coordinator.send(GetStatus).await?;
    coordinator
        .send(Shutdown {
            grace: Duration::from_secs(1),
        })
        .await?;

    // 5. Summarize.
    let totals = status.totals;
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(outbox.pool())
        .await?;
    let heard = heard.lock().unwrap();
    let mut lease_kinds: BTreeMap<String, u64> = BTreeMap::new();
    for lost in &heard.leases {
        *lease_kinds
            .entry(format!("{:?} ({:?})", lost.state, lost.operation))
            .or_default() += 1;
    }
    let dead: Vec<_> = heard
        .dead_letters
        .iter()
        .map(|d| format!("{} ({})", d.id, d.error.message))
        .collect();

    println!();
    println!("  outcome                  count");
    println!("  ───────────────────────  ─────");
    for (label, value) in [
        ("claimed", totals.claimed),
        ("delivered", totals.delivered),
        ("retried", totals.retried),
        ("dead-lettered", totals.dead_lettered),
        ("lease lost", totals.lease_lost),
        ("settlement failed", totals.settlement_failed),
    ] {
        println!("  {label:<23}  {value:>5}");
    }
    println!("  ───────────────────────  ─────");
    println!("  passes                   {:>5}", status.passes);
    println!(
        "  messages per second      {:>5.0}",
        (totals.delivered + totals.dead_lettered) as f64 / elapsed.as_secs_f64()
    );
    println!("  (most of the run waits on the deliberate hangs, leases and retry delays)");
    println!();
    println!("  the lease-lost subscriber heard:");
    for (kind, count) in &lease_kinds {
        println!("    {count} × {kind}");
    }
    println!(
        "  billing skipped {} duplicate charges (at-least-once delivery, idempotent handler)",
        duplicates.lock().unwrap()
    );
    println!(
        "  the outcome subscriber heard {} dead letters, e.g. {}",
        dead.len(),
        dead.first().map_or("none", String::as_str)
    );
    println!();
    println!(
        "  in {}: {orders} orders; outbox {} delivered, {} dead-lettered, {} pending",
        args.db,
        stats.count(MessageStatus::Delivered),
        stats.count(MessageStatus::DeadLettered),
        stats.pending
    );
    println!("  inspect it: cargo run -p outbox-cli -- --database {url} status");
    Ok(())
}

/// Redraw the bar in place on a terminal; elsewhere (a log, CI) print a
/// line only when the count moved.
fn progress(done: u64, target: u64, stats: &OutboxStats, last: &mut Option<u64>) {
    const WIDTH: usize = 40;
    let filled = (done as usize * WIDTH) / target.max(1) as usize;
    let line = format!(
        "[{}{}] {done}/{target} settled, {} pending, {} in flight",
        "█".repeat(filled),
        "░".repeat(WIDTH - filled),
        stats.pending,
        stats.claimed
    );
    if std::io::stderr().is_terminal() {
        eprint!("\r  {line} ");
        let _ = std::io::stderr().flush();
    } else if *last != Some(done) {
        eprintln!("  {line}");
    }
    *last = Some(done);
}
