//! The `--keys` comparison: a claim of 100 from a store whose messages
//! carry ordering keys against the same claim from one without.

use std::sync::atomic::Ordering;

use outbox::OutboxStore;
use outbox_bench::report::print_json;
use outbox_bench::stats::{median, micros, round};
use serde::Serialize;

use super::{CLAIM, HOT, KEYED_BELOW, KEYS, at, claim_cost};

/// The shape of a `--keys` run.
#[derive(Clone, Copy)]
pub(super) struct KeysRun {
    /// Ordering keys the keyed messages are spread over, round-robin.
    pub(super) keys: u64,
    /// Keyed messages, and the keyless store's messages besides `hot`.
    pub(super) pending: u64,
    /// Keyless messages behind the keyed ones (`--mixed`).
    pub(super) mixed: bool,
    /// Messages of one hot key in front of all the others (`--hot`).
    pub(super) hot: u64,
}

impl KeysRun {
    /// The size of the keyless store: as many messages as the keyed
    /// store's backlog, the hot key's included.
    pub(super) fn keyless_fill(&self) -> u64 {
        self.pending + self.hot
    }

    /// Sets the keys of the messages enqueued from now on, and returns the
    /// size of the keyed store: the hot key's backlog, `pending` keyed
    /// messages, and with `mixed` as many keyless ones after them.
    pub(super) fn keyed_fill(&self) -> u64 {
        KEYS.store(self.keys, Ordering::Relaxed);
        HOT.store(self.hot, Ordering::Relaxed);
        let keyed = self.hot + self.pending;
        if self.mixed {
            KEYED_BELOW.store(keyed, Ordering::Relaxed);
            keyed + self.pending
        } else {
            keyed
        }
    }
}

/// The JSON line of a `--keys` run.
#[derive(Serialize)]
struct KeysSummary<'a> {
    store: &'a str,
    pending: u64,
    keys: u64,
    mixed: bool,
    /// Messages of the hot key in front of the others.
    hot_backlog: u64,
    /// Messages a keyed claim finds: one head per key at most, keyless
    /// messages filling the rest.
    claimed_keyed: usize,
    /// Median claim of 100 without ordering keys, µs.
    claim100_us_keyless: f64,
    /// The same over the keyed store, µs.
    claim100_us_keyed: f64,
    ratio_keyed_vs_keyless: f64,
}

/// Times the claim of 100 from `keyless` and from `keyed`, filled as
/// `run` says, and prints both and the ratio.
pub(super) async fn compare_keys<S: OutboxStore>(name: &str, run: KeysRun, keyless: &S, keyed: &S) {
    let KeysRun {
        keys,
        pending,
        mixed,
        hot,
    } = run;
    let now = at((hot + 2 * pending) as i64 + 1_000);
    // One head per key at most (the hot key is one more); keyless
    // messages fill the rest.
    let keyed_claim = if mixed {
        CLAIM
    } else {
        CLAIM.min((keys + u64::from(hot > 0)) as usize)
    };
    // Alternating, so neither side gets a warmer machine.
    let mut keyless_cost = Vec::new();
    let mut keyed_cost = Vec::new();
    for _ in 0..3 {
        keyless_cost.push(claim_cost(keyless, now, CLAIM).await);
        keyed_cost.push(claim_cost(keyed, now, keyed_claim).await);
    }
    let (keyless_cost, keyed_cost) = (median(keyless_cost), median(keyed_cost));
    let ratio = keyed_cost.as_secs_f64() / keyless_cost.as_secs_f64();
    println!(
        "{name}: claim of {CLAIM} with {} pending: {:.2} µs without ordering keys, \
         {:.2} µs over {keys} keys{}{}, {keyed_claim} a claim ({ratio:.2}x)",
        run.keyless_fill(),
        micros(keyless_cost),
        micros(keyed_cost),
        if hot > 0 {
            format!(" behind a hot key's {hot}")
        } else {
            String::new()
        },
        if mixed {
            " with as many keyless behind"
        } else {
            ""
        }
    );
    print_json(&KeysSummary {
        store: name,
        pending,
        keys,
        mixed,
        hot_backlog: hot,
        claimed_keyed: keyed_claim,
        claim100_us_keyless: micros(keyless_cost),
        claim100_us_keyed: micros(keyed_cost),
        ratio_keyed_vs_keyless: round(ratio, 2),
    });
}
