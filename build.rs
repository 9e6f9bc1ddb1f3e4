//! Rebuilds the crate when a migration changes.
//!
//! `sqlx::migrate!` embeds the migration files when the crate compiles, and
//! cargo does not know it read them: without this, a new or changed
//! migration would not rebuild the crate, and a build would carry the old set.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
