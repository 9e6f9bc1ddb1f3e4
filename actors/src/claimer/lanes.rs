//! The queues a pass serves, each a lane of slots of its own: how many of
//! its handlers run, how many of its messages wait for a slot or were asked
//! for by claims in flight, whether its last claim found it empty, and how
//! a claim's limit is shared among the lanes that have room.
//!
//! A drain that names no queue has one lane, `default`, with the drain's
//! concurrency and prefetch: every count then is the claimer's own, and a
//! claim asks that lane for all it claims.

use outbox::{DrainConfig, QueueLimit};

/// One served queue's slots.
#[derive(Debug)]
pub(super) struct Lane {
    /// The queue.
    pub(super) name: String,
    /// Its handlers that may run at once.
    pub(super) concurrency: usize,
    /// Its share of the drain's prefetch, in proportion to its concurrency.
    prefetch: usize,
    /// The attempt cap of its messages enqueued without one: its retry
    /// policy's, else the drain's.
    max_attempts: u32,
    /// Its deliveries whose handler still runs.
    pub(super) handling: usize,
    /// Its prefetched messages waiting for a slot.
    pub(super) waiting: usize,
    /// What the claims in flight asked of it.
    pub(super) asked: usize,
    /// Its last claim found nothing: it is asked again only after a
    /// refill (a wake-up, a tick, a `Drain`) or when one of its keyed
    /// deliveries ends.
    pub(super) idle: bool,
}

impl Lane {
    /// Slots it could take messages for now.
    fn room(&self) -> usize {
        (self.concurrency + self.prefetch).saturating_sub(self.handling + self.waiting + self.asked)
    }

    /// `true` when a handler of this queue can start now.
    pub(super) fn has_free_handler(&self) -> bool {
        self.handling < self.concurrency
    }
}

/// The lanes of a pass.
#[derive(Debug)]
pub(super) struct Lanes {
    lanes: Vec<Lane>,
    /// Handlers over every lane, which the prefetch is shared by.
    concurrency: usize,
    /// Where the next sharing of a limit starts, so no lane always comes
    /// last when a limit cannot serve them all.
    next: usize,
}

impl Lanes {
    /// A lane per queue `config` serves, none of it busy.
    pub(super) fn new(config: &DrainConfig) -> Self {
        let total = config.total_concurrency().max(1);
        let lanes = config
            .served_queues()
            .into_iter()
            .map(|(name, queue)| Lane {
                name,
                concurrency: queue.concurrency,
                prefetch: 0,
                max_attempts: queue
                    .retry
                    .as_ref()
                    .and_then(|retry| retry.max_attempts)
                    .unwrap_or_else(|| config.retry.attempt_cap()),
                handling: 0,
                waiting: 0,
                asked: 0,
                idle: false,
            })
            .collect();
        Lanes {
            lanes,
            concurrency: total,
            next: 0,
        }
    }

    /// Share `prefetch` among the lanes in proportion to their concurrency.
    pub(super) fn set_prefetch(&mut self, prefetch: usize) {
        for lane in &mut self.lanes {
            lane.prefetch = (prefetch * lane.concurrency).div_ceil(self.concurrency);
        }
    }

    /// The lane of `queue`, if the pass serves it.
    pub(super) fn of(&self, queue: &str) -> Option<usize> {
        self.lanes.iter().position(|lane| lane.name == queue)
    }

    pub(super) fn get(&self, lane: usize) -> &Lane {
        &self.lanes[lane]
    }

    pub(super) fn get_mut(&mut self, lane: usize) -> &mut Lane {
        &mut self.lanes[lane]
    }

    /// `limit` shared among the lanes with room that are not idle, one slot
    /// at a time in turn, each up to its room: per lane, what to ask of it
    /// (lanes asked nothing left out).
    pub(super) fn share(&mut self, limit: usize) -> Vec<(usize, usize)> {
        let count = self.lanes.len();
        let mut asks = vec![0; count];
        let mut left = limit;
        let mut progress = true;
        while left > 0 && progress {
            progress = false;
            for turn in 0..count {
                let lane = (self.next + turn) % count;
                let open = &self.lanes[lane];
                if left > 0 && !open.idle && asks[lane] < open.room() {
                    asks[lane] += 1;
                    left -= 1;
                    progress = true;
                }
            }
        }
        self.next = (self.next + 1) % count.max(1);
        asks.into_iter()
            .enumerate()
            .filter(|&(_, ask)| ask > 0)
            .collect()
    }

    /// The claim's queues for `asks`, each with its limit and attempt cap.
    pub(super) fn request(&self, asks: &[(usize, usize)]) -> Vec<QueueLimit> {
        asks.iter()
            .map(|&(lane, limit)| {
                let lane = &self.lanes[lane];
                QueueLimit {
                    max_attempts: Some(lane.max_attempts),
                    ..QueueLimit::new(lane.name.clone(), limit)
                }
            })
            .collect()
    }

    /// `true` when `asks`, not yet counted as asked for, may leave a
    /// message waiting for a handler: some lane is asked for more than its
    /// idle handlers, those no running delivery, waiting message or claim
    /// in flight will take.
    pub(super) fn may_wait(&self, asks: &[(usize, usize)]) -> bool {
        asks.iter().any(|&(lane, ask)| {
            let lane = &self.lanes[lane];
            ask > lane
                .concurrency
                .saturating_sub(lane.handling + lane.waiting + lane.asked)
        })
    }

    /// Count `asks` as asked for, or, with `back`, as answered.
    pub(super) fn ask(&mut self, asks: &[(usize, usize)], back: bool) {
        for &(lane, limit) in asks {
            let lane = &mut self.lanes[lane];
            if back {
                lane.asked -= limit;
            } else {
                lane.asked += limit;
            }
        }
    }

    /// `true` when no lane that may still have messages has a free
    /// handler: a claim now would start nothing at once.
    pub(super) fn all_fed(&self) -> bool {
        self.lanes
            .iter()
            .all(|lane| lane.idle || !lane.has_free_handler())
    }

    /// `true` when every lane's last claim found it empty.
    pub(super) fn all_idle(&self) -> bool {
        self.lanes.iter().all(|lane| lane.idle)
    }

    /// New messages may be due in every queue.
    pub(super) fn wake(&mut self) {
        for lane in &mut self.lanes {
            lane.idle = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use outbox::QueueConfig;

    use super::*;

    fn lanes(queues: &[(&str, usize)], prefetch: usize) -> Lanes {
        let config = DrainConfig {
            batch_size: 100,
            queues: queues
                .iter()
                .map(|&(name, concurrency)| (name.to_owned(), QueueConfig::new(concurrency)))
                .collect(),
            ..DrainConfig::default()
        };
        let mut lanes = Lanes::new(&config);
        lanes.set_prefetch(prefetch);
        lanes
    }

    #[test]
    fn one_lane_gets_all_a_claim_asks_for() {
        let mut one = Lanes::new(&DrainConfig {
            concurrency: 8,
            ..DrainConfig::default()
        });
        one.set_prefetch(4);
        assert_eq!(one.get(0).name, "default");
        assert_eq!(one.share(12), [(0, 12)]);
        assert_eq!(one.share(20), [(0, 12)], "no more than its room");
    }

    #[test]
    fn a_limit_is_shared_in_turn_and_idle_lanes_are_left_out() {
        let mut two = lanes(&[("a", 4), ("b", 4)], 0);
        assert_eq!(two.share(3).iter().map(|(_, n)| n).sum::<usize>(), 3);
        assert_eq!(two.share(8), [(0, 4), (1, 4)]);
        two.get_mut(0).handling = 4;
        assert_eq!(two.share(8), [(1, 4)]);
        two.get_mut(1).idle = true;
        assert!(two.share(8).is_empty());
        assert!(!two.all_idle());
        two.get_mut(0).idle = true;
        assert!(two.all_idle());
        two.wake();
        assert!(!two.all_idle());
    }

    #[test]
    fn a_claim_may_leave_messages_waiting_when_one_lane_lacks_idle_handlers() {
        let mut two = lanes(&[("a", 4), ("b", 4)], 8);
        assert!(!two.may_wait(&[(0, 4), (1, 4)]));
        assert!(two.may_wait(&[(0, 5)]), "more than its handlers");
        two.get_mut(0).handling = 2;
        two.get_mut(0).waiting = 1;
        assert!(!two.may_wait(&[(0, 1), (1, 4)]));
        assert!(two.may_wait(&[(0, 2)]), "a message already waits for one");
        two.ask(&[(1, 3)], false);
        assert!(two.may_wait(&[(1, 2)]), "a claim in flight takes three");
    }

    #[test]
    fn prefetch_is_shared_by_concurrency_and_caps_come_from_retry_policies() {
        let mut config = DrainConfig {
            batch_size: 100,
            ..DrainConfig::default()
        };
        config.queues.insert("big".into(), QueueConfig::new(8));
        config.queues.insert(
            "small".into(),
            QueueConfig::new(2).retry(outbox::RetryPolicy::default().with_max_attempts(3)),
        );
        let mut lanes = Lanes::new(&config);
        lanes.set_prefetch(10);
        let asks = lanes.share(100);
        assert_eq!(asks, [(0, 16), (1, 4)]);
        let request = lanes.request(&asks);
        assert_eq!(request[1].max_attempts, Some(3));
        assert_eq!(
            request[0].max_attempts,
            Some(config.retry.attempt_cap()),
            "a queue without a policy of its own takes the drain's cap"
        );
    }
}
