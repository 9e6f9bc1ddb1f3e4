//! What a consumer runs for each new message: the user's handler, inside
//! the transaction that recorded the message in the inbox.

use futures_util::future::BoxFuture;
use outbox::sqlx::{Database, Transaction};

use super::received::Received;

/// What a handler fails with. The transaction is rolled back and the
/// broker redelivers the message.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Applies a message's effects inside the transaction that recorded it.
///
/// Write the effects through `tx` only: they commit with the inbox record,
/// or roll back with it. Return an error to roll back and have the message
/// redelivered. A handler runs only for the first copy of a message to
/// commit; copies of a committed message are acknowledged without it.
///
/// Closures are handlers through [`handler_fn`].
pub trait InboxHandler<DB: Database>: Send + Sync + 'static {
    /// Apply `message` in `tx`.
    fn handle<'a>(
        &'a self,
        tx: &'a mut Transaction<'static, DB>,
        message: &'a Received,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// A closure as an [`InboxHandler`].
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # {
/// use outbox::sqlx;
/// use outbox_brokers::consume::{Received, handler_fn};
///
/// let handler = handler_fn(|tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>, message: &Received| {
///     Box::pin(async move {
///         sqlx::query("INSERT INTO shipments (message_id) VALUES (?1)")
///             .bind(&message.id)
///             .execute(&mut **tx)
///             .await?;
///         Ok(())
///     })
/// });
/// # let _ = handler;
/// # }
/// ```
pub fn handler_fn<DB, F>(handle: F) -> FnHandler<F>
where
    DB: Database,
    F: for<'a> Fn(
            &'a mut Transaction<'static, DB>,
            &'a Received,
        ) -> BoxFuture<'a, Result<(), HandlerError>>
        + Send
        + Sync
        + 'static,
{
    FnHandler(handle)
}

/// A closure made an [`InboxHandler`] by [`handler_fn`].
#[derive(Debug, Clone, Copy)]
pub struct FnHandler<F>(F);

impl<DB, F> InboxHandler<DB> for FnHandler<F>
where
    DB: Database,
    F: for<'a> Fn(
            &'a mut Transaction<'static, DB>,
            &'a Received,
        ) -> BoxFuture<'a, Result<(), HandlerError>>
        + Send
        + Sync
        + 'static,
{
    fn handle<'a>(
        &'a self,
        tx: &'a mut Transaction<'static, DB>,
        message: &'a Received,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        (self.0)(tx, message)
    }
}
