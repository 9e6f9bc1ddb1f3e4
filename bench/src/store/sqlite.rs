//! SQLite: a fresh database file per store, removed with its WAL and
//! shared-memory files when the benchmark is done with it.

use std::path::{Path, PathBuf};

use outbox::SqliteOutbox;

/// A database file in the temporary directory, removed on drop with its
/// `-wal` and `-shm` files.
pub struct TempDatabase {
    /// The database file.
    path: PathBuf,
}

impl TempDatabase {
    /// A new file name, `outbox-<tag>-<pid>-<random>.db`; nothing is
    /// created until a store opens it.
    pub fn new(tag: &str) -> Self {
        let random = &outbox::kit::new_claim_token()[..8];
        let path =
            std::env::temp_dir().join(format!("outbox-{tag}-{}-{random}.db", std::process::id()));
        TempDatabase { path }
    }

    /// The file as a `sqlite://` URL.
    pub fn url(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }

    /// The store on this file, its table set up.
    ///
    /// # Panics
    ///
    /// When the file cannot be opened or set up.
    pub async fn open(&self) -> SqliteOutbox {
        SqliteOutbox::connect(&self.url())
            .await
            .expect("open the bench database")
    }
}

impl Drop for TempDatabase {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut name = self.path.clone().into_os_string();
            name.push(suffix);
            let _ = std::fs::remove_file(Path::new(&name));
        }
    }
}

super::fill_in_transactions!(SqliteOutbox);

/// The file's size, free pages included: `page_count * page_size`.
///
/// # Panics
///
/// When the store does not answer.
pub async fn file_bytes(store: &SqliteOutbox) -> u64 {
    let (pages, size): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT page_count FROM pragma_page_count()), \
         (SELECT page_size FROM pragma_page_size())",
    )
    .fetch_one(store.pool())
    .await
    .expect("page count");
    (pages * size) as u64
}
