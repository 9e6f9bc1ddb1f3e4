//! The fenced writer against a recording backend, on virtual time.

use std::sync::Mutex;

use futures_util::future::join_all;

use super::*;
use crate::error::{ClaimError, ClaimLoss};

/// Records each batch; refuses rows whose token is `lost`, fails whole
/// batches that contain the id `broken`.
#[derive(Default)]
struct Recorder {
    batches: Mutex<Vec<Vec<String>>>,
    /// How long each statement takes.
    delay: Duration,
}

impl FencedBackend for Recorder {
    async fn apply(&self, rows: &[FencedWrite]) -> Result<Vec<Result<CancelRequested>>> {
        self.batches
            .lock()
            .unwrap()
            .push(rows.iter().map(|r| r.id.clone()).collect());
        tokio::time::sleep(self.delay).await;
        if rows.iter().any(|r| r.id == "broken") {
            return Err(Error::store(
                "settle",
                std::io::Error::other("connection reset"),
            ));
        }
        Ok(rows
            .iter()
            .map(|r| match r.claim_token.as_str() {
                "lost" => Err(ClaimError::new(&r.id, ClaimLoss::TokenMismatch).into()),
                _ => Ok(false),
            })
            .collect())
    }
}

fn row(id: &str, token: &str) -> FencedWrite {
    FencedWrite {
        op: FencedOp::Deliver,
        id: id.into(),
        claim_token: token.into(),
        now: DateTime::UNIX_EPOCH,
        error: None,
    }
}

fn batched(window_ms: u64, max_rows: usize) -> (Arc<Recorder>, FencedWriter<Recorder>) {
    let recorder = Arc::new(Recorder::default());
    let mode = SettlementMode::Batched {
        window: Duration::from_millis(window_ms),
        max_rows,
    };
    (recorder.clone(), FencedWriter::new(recorder, mode, 1))
}

fn outcome(result: &Result<CancelRequested>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(Error::Claim(_)) => "lost",
        Err(Error::Store {
            operation: "mark_delivered",
            ..
        }) => "store",
        Err(_) => "other",
    }
}

#[tokio::test(start_paused = true)]
async fn concurrent_calls_share_one_statement_with_a_result_each() {
    let (recorder, writer) = batched(1, 128);
    let rows = [row("a", "t"), row("b", "lost"), row("c", "t")];
    let results = join_all(rows.map(|r| writer.run(r))).await;
    assert_eq!(
        results.iter().map(outcome).collect::<Vec<_>>(),
        ["ok", "lost", "ok"]
    );
    assert_eq!(*recorder.batches.lock().unwrap(), [["a", "b", "c"]]);
}

#[tokio::test(start_paused = true)]
async fn batches_close_at_max_rows_and_at_a_repeated_id() {
    let (recorder, writer) = batched(1, 2);
    let rows = [row("a", "t"), row("b", "t"), row("c", "t")];
    join_all(rows.map(|r| writer.run(r))).await;
    assert_eq!(
        *recorder.batches.lock().unwrap(),
        [vec!["a", "b"], vec!["c"]]
    );

    let (recorder, writer) = batched(1, 128);
    let rows = [row("a", "t"), row("a", "lost"), row("b", "t")];
    let results = join_all(rows.map(|r| writer.run(r))).await;
    assert_eq!(
        results.iter().map(outcome).collect::<Vec<_>>(),
        ["ok", "lost", "ok"]
    );
    // The second write to `a` waits for the next statement, in call order.
    assert_eq!(
        *recorder.batches.lock().unwrap(),
        [vec!["a"], vec!["a", "b"]]
    );
}

#[tokio::test(start_paused = true)]
async fn a_lone_call_does_not_wait_for_the_window() {
    let (recorder, writer) = batched(50, 128);
    let start = tokio::time::Instant::now();
    writer.run(row("a", "t")).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(*recorder.batches.lock().unwrap(), [["a"]]);
}

#[tokio::test(start_paused = true)]
async fn calls_made_while_a_statement_runs_share_the_next_one() {
    let recorder = Arc::new(Recorder {
        delay: Duration::from_millis(5),
        ..Recorder::default()
    });
    let mode = SettlementMode::Batched {
        window: Duration::from_millis(1),
        max_rows: 128,
    };
    let writer = Arc::new(FencedWriter::new(recorder.clone(), mode, 1));
    let start = tokio::time::Instant::now();
    let calls = ["a", "b", "c"].into_iter().enumerate().map(|(i, id)| {
        let writer = writer.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(2 * i as u64)).await;
            writer.run(row(id, "t")).await.unwrap();
            tokio::time::Instant::now()
        })
    });
    let finished: Vec<_> = join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    // `a` goes alone; `b` and `c` arrive while it runs (past their
    // window) and go out together as soon as it ends.
    assert_eq!(
        *recorder.batches.lock().unwrap(),
        [vec!["a"], vec!["b", "c"]]
    );
    let ms = |at: tokio::time::Instant| (at - start).as_millis();
    assert_eq!(
        finished.into_iter().map(ms).collect::<Vec<_>>(),
        [5, 10, 10]
    );
}

#[tokio::test(start_paused = true)]
async fn statements_overlap_but_never_on_one_message() {
    let recorder = Arc::new(Recorder {
        delay: Duration::from_millis(5),
        ..Recorder::default()
    });
    let mode = SettlementMode::Batched {
        window: Duration::from_millis(1),
        max_rows: 128,
    };
    let writer = Arc::new(FencedWriter::new(recorder.clone(), mode, 3));
    let start = tokio::time::Instant::now();
    // `a`, `b`, `c` together; `d` while their statement runs; a second
    // write to `a` a moment later.
    let calls = [(0, "a"), (0, "b"), (0, "c"), (1, "d"), (2, "a")].map(|(at, id)| {
        let writer = writer.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(at)).await;
            writer.run(row(id, "t")).await.unwrap();
            tokio::time::Instant::now()
        })
    });
    let finished: Vec<_> = join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    // `d` does not wait for the statement in flight; the second write
    // to `a` does, and goes after it, in call order.
    assert_eq!(
        *recorder.batches.lock().unwrap(),
        [vec!["a", "b", "c"], vec!["d"], vec!["a"]]
    );
    let ms = |at: tokio::time::Instant| (at - start).as_millis();
    assert_eq!(
        finished.into_iter().map(ms).collect::<Vec<_>>(),
        [5, 5, 5, 6, 10]
    );
}

#[tokio::test(start_paused = true)]
async fn calls_wait_for_a_free_statement_slot_and_share_it() {
    let recorder = Arc::new(Recorder {
        delay: Duration::from_millis(5),
        ..Recorder::default()
    });
    let mode = SettlementMode::Batched {
        window: Duration::from_millis(1),
        max_rows: 128,
    };
    let writer = Arc::new(FencedWriter::new(recorder.clone(), mode, 2));
    let start = tokio::time::Instant::now();
    let calls = [(0, "a"), (1, "b"), (2, "c"), (3, "d")].map(|(at, id)| {
        let writer = writer.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(at)).await;
            writer.run(row(id, "t")).await.unwrap();
            tokio::time::Instant::now()
        })
    });
    let finished: Vec<_> = join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    // Two statements run at once; `c` and `d` arrive while both slots
    // are taken and share the next statement, once `a`'s ends.
    assert_eq!(
        *recorder.batches.lock().unwrap(),
        [vec!["a"], vec!["b"], vec!["c", "d"]]
    );
    let ms = |at: tokio::time::Instant| (at - start).as_millis();
    assert_eq!(
        finished.into_iter().map(ms).collect::<Vec<_>>(),
        [5, 6, 10, 10]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_statement_fails_every_row_as_its_own_operation() {
    let (_, writer) = batched(1, 128);
    let rows = [row("a", "t"), row("broken", "t")];
    let results = join_all(rows.map(|r| writer.run(r))).await;
    assert_eq!(
        results.iter().map(outcome).collect::<Vec<_>>(),
        ["store", "store"]
    );
}

#[tokio::test]
async fn per_message_mode_sends_each_call_alone() {
    let recorder = Arc::new(Recorder::default());
    let writer = FencedWriter::new(recorder.clone(), SettlementMode::PerMessage, 1);
    let rows = [row("a", "t"), row("b", "lost")];
    let results = join_all(rows.map(|r| writer.run(r))).await;
    assert_eq!(
        results.iter().map(outcome).collect::<Vec<_>>(),
        ["ok", "lost"]
    );
    assert_eq!(*recorder.batches.lock().unwrap(), [["a"], ["b"]]);
}

#[test]
fn a_batch_outlives_the_runtime_that_started_it() {
    let recorder = Arc::new(Recorder::default());
    let writer = FencedWriter::new(recorder.clone(), SettlementMode::DEFAULT_BATCHED, 1);
    for _ in 0..2 {
        // Each runtime shuts down after its call, taking the batch task
        // with it; the next call starts a new one.
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(writer.run(row("a", "t")))
            .unwrap();
    }
    assert_eq!(recorder.batches.lock().unwrap().len(), 2);
}
