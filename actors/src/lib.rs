//! The actix drain runtime for the [`outbox`] crate.
pub use outbox;
