//! `sql_store!`, which each SQL store invokes on its own types to get its
//! public trait impls and typed enqueue methods.

/// The public face of a SQL store, written once for both: the
/// [`OutboxStore`](crate::OutboxStore) and [`OutboxAdmin`](crate::OutboxAdmin)
/// impls, the builder's `settlement` setter, `pool`, `table`, and the typed
/// `enqueue_event_in`/`enqueue_job_in`.
///
/// The store is a struct with a field `inner: SqlOutbox<Core>`, and has the
/// inherent methods `enqueue_now` and `enqueue_batch_now` (enqueue through
/// the store's own pool), `subscribe` (its wake-ups), `enqueue_in`,
/// `enqueue_batch_in` and `schedules_now` (its periodic schedules), and
/// implements `ScheduleStore`; its `Core` has `claim` and `list`. The
/// builder has a field `settlement`.
macro_rules! sql_store {
    ($store:ident, $builder:ident, $pool:ty, $conn:ty) => {
        impl $builder {
            /// How renewals and settlements are sent; batched by default
            /// ([`SettlementMode::DEFAULT_BATCHED`]).
            pub fn settlement(mut self, mode: $crate::SettlementMode) -> $crate::Result<Self> {
                self.settlement = mode.validate()?;
                Ok(self)
            }
        }

        impl $store {
            /// The pool the store uses.
            pub fn pool(&self) -> &$pool {
                &self.inner.parts().pool
            }

            /// The table the store uses.
            pub fn table(&self) -> &$crate::TableName {
                &self.inner.parts().table
            }

            #[doc = concat!("[`", stringify!($store), "::enqueue_in`] for an event of registered type `E`.")]
            pub async fn enqueue_event_in<E: $crate::Event>(
                &self,
                conn: &mut $conn,
                payload: &E,
            ) -> $crate::Result<$crate::Enqueued> {
                self.enqueue_in(conn, $crate::NewMessage::event(payload)?).await
            }

            #[doc = concat!("[`", stringify!($store), "::enqueue_in`] for an event of registered type `E`, with [`EnqueueOptions`](crate::EnqueueOptions).")]
            pub async fn enqueue_event_with<E: $crate::Event>(
                &self,
                conn: &mut $conn,
                payload: &E,
                options: $crate::EnqueueOptions,
            ) -> $crate::Result<$crate::Enqueued> {
                self.enqueue_in(conn, $crate::NewMessage::event(payload)?.with_options(options))
                    .await
            }

            #[doc = concat!("[`", stringify!($store), "::enqueue_in`] for a job of registered type `J`, with [`EnqueueOptions`](crate::EnqueueOptions).")]
            pub async fn enqueue_job_with<J: $crate::Job>(
                &self,
                conn: &mut $conn,
                payload: &J,
                options: $crate::EnqueueOptions,
            ) -> $crate::Result<$crate::Enqueued> {
                self.enqueue_in(conn, $crate::NewMessage::job(payload)?.with_options(options))
                    .await
            }

            #[doc = concat!("[`", stringify!($store), "::enqueue_in`] for a job of registered type `J`.")]
            pub async fn enqueue_job_in<J: $crate::Job>(
                &self,
                conn: &mut $conn,
                payload: &J,
            ) -> $crate::Result<$crate::Enqueued> {
                self.enqueue_in(conn, $crate::NewMessage::job(payload)?).await
            }

            #[doc = concat!("[`", stringify!($store), "::enqueue_batch_in`] for events of registered type `E`, one per payload, answered in order.")]
            pub async fn enqueue_events_in<'p, E: $crate::Event + 'p>(
                &self,
                conn: &mut $conn,
                payloads: impl IntoIterator<Item = &'p E>,
            ) -> $crate::Result<Vec<$crate::Enqueued>> {
                let messages = payloads
                    .into_iter()
                    .map($crate::NewMessage::event)
                    .collect::<$crate::Result<Vec<_>>>()?;
                self.enqueue_batch_in(conn, messages).await
            }

            #[doc = concat!("[`", stringify!($store), "::enqueue_batch_in`] for jobs of registered type `J`, one per payload, answered in order.")]
            pub async fn enqueue_jobs_in<'p, J: $crate::Job + 'p>(
                &self,
                conn: &mut $conn,
                payloads: impl IntoIterator<Item = &'p J>,
            ) -> $crate::Result<Vec<$crate::Enqueued>> {
                let messages = payloads
                    .into_iter()
                    .map($crate::NewMessage::job)
                    .collect::<$crate::Result<Vec<_>>>()?;
                self.enqueue_batch_in(conn, messages).await
            }
        }

        impl $crate::OutboxStore for $store {
            async fn enqueue(&self, message: $crate::NewMessage) -> $crate::Result<$crate::Enqueued> {
                self.enqueue_now(message).await
            }

            async fn enqueue_batch(
                &self,
                messages: Vec<$crate::NewMessage>,
            ) -> $crate::Result<Vec<$crate::Enqueued>> {
                self.enqueue_batch_now(messages).await
            }

            async fn claim_batch(
                &self,
                params: $crate::ClaimBatch,
            ) -> $crate::Result<$crate::ClaimedBatch> {
                self.inner.core.claim(params).await
            }

            async fn renew_claim(
                &self,
                params: $crate::RenewClaim,
            ) -> $crate::Result<chrono::DateTime<chrono::Utc>> {
                Ok(self.inner.renew_lease(params).await?.locked_until)
            }

            async fn renew_lease(&self, params: $crate::RenewClaim) -> $crate::Result<$crate::Lease> {
                self.inner.renew_lease(params).await
            }

            async fn mark_delivered(&self, params: $crate::MarkDelivered) -> $crate::Result<()> {
                self.inner.mark_delivered(params).await
            }

            async fn mark_failed(&self, params: $crate::MarkFailed) -> $crate::Result<()> {
                self.inner.settle_failure(params).await.map(drop)
            }

            async fn settle_failure(
                &self,
                params: $crate::MarkFailed,
            ) -> $crate::Result<$crate::MessageStatus> {
                self.inner.settle_failure(params).await
            }

            async fn release_claim(&self, params: $crate::ReleaseClaim) -> $crate::Result<()> {
                self.inner.release_claim(params).await
            }

            fn wakeups(&self) -> Option<$crate::Wakeups> {
                self.subscribe()
            }

            async fn purge_batch(&self, params: $crate::PurgeBatch) -> $crate::Result<u64> {
                self.inner.purge_batch(params).await
            }

            async fn vacuum(&self) -> $crate::Result<()> {
                self.inner.vacuum().await
            }

            /// Counts from the partial indexes of pending rows, never
            /// touching settled ones.
            async fn pending_count(&self) -> $crate::Result<Option<u64>> {
                self.inner.pending_count().await
            }

            async fn warm_up(&self, claims: usize) -> $crate::Result<()> {
                self.inner.core.warm_up(claims).await
            }

            fn claim_parallelism(&self) -> usize {
                self.inner.core.claim_parallelism()
            }

            fn claims_ahead(&self) -> bool {
                self.inner.core.claims_ahead()
            }

            fn prefetch_limit(&self) -> usize {
                self.inner.core.prefetch_limit()
            }

            fn schedules(&self) -> Option<&dyn $crate::ScheduleStore> {
                Some(self)
            }
        }

        impl $crate::OutboxAdmin for $store {
            async fn stats(
                &self,
                now: chrono::DateTime<chrono::Utc>,
            ) -> $crate::Result<$crate::OutboxStats> {
                self.inner.stats(now).await
            }

            async fn list_messages(
                &self,
                params: $crate::ListMessages,
            ) -> $crate::Result<$crate::MessagePage> {
                self.inner.core.list(params).await
            }

            async fn get_message(&self, id: &str) -> $crate::Result<$crate::OutboxMessage> {
                self.inner.get_message(id).await
            }

            async fn requeue_dead_letters(
                &self,
                params: $crate::RequeueDeadLetters,
            ) -> $crate::Result<u64> {
                self.inner.requeue_dead_letters(params).await
            }

            async fn purge(&self, params: $crate::PurgeMessages) -> $crate::Result<u64> {
                self.inner.purge(params).await
            }

            async fn count_purgeable(&self, params: $crate::PurgeMessages) -> $crate::Result<u64> {
                self.inner.count_purgeable(params).await
            }

            async fn activity(
                &self,
                since: chrono::DateTime<chrono::Utc>,
            ) -> $crate::Result<Vec<$crate::MinuteActivity>> {
                self.inner.core.activity(since).await
            }

            async fn retry_now(&self, params: $crate::RetryNow) -> $crate::Result<()> {
                self.inner
                    .retry_now(self.inner.core.retry_statement(), &params.id, params.now)
                    .await
            }

            async fn skip_dead_letter(&self, params: $crate::SkipDeadLetter) -> $crate::Result<()> {
                self.inner.skip_dead_letter(params).await
            }

            async fn blocked_keys(&self, limit: usize) -> $crate::Result<Vec<$crate::BlockedKey>> {
                self.inner.blocked_keys(limit).await
            }

            async fn pause_queue(&self, params: $crate::PauseQueue) -> $crate::Result<bool> {
                self.inner.pause_queue(params).await
            }

            async fn resume_queue(&self, queue: &str) -> $crate::Result<bool> {
                self.inner.resume_queue(queue).await
            }

            async fn queues(&self) -> $crate::Result<Vec<$crate::QueueState>> {
                self.inner.queues().await
            }

            async fn cancel_messages(
                &self,
                params: $crate::CancelMessages,
            ) -> $crate::Result<$crate::CancelReport> {
                self.inner.cancel_messages(params).await
            }

            async fn list_schedules(&self) -> $crate::Result<Vec<$crate::ScheduleState>> {
                self.schedules_now().await
            }
        }
    };
}
pub(crate) use sql_store;
