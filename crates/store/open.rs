//! Opening the configured store: the disk folder or the shared database.

use std::path::Path;
use std::sync::Arc;

use super::{DiskStore, PgStore, Store, StoreError, Writer};
use crate::config::{StoreBackend, StoreConfig};
use crate::metrics::Metrics;

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The writer thread could not start.
    #[error("cannot start the log writer: {0}")]
    Writer(std::io::Error),
    /// The database could not be reached or migrated.
    #[error("cannot open the postgres store: {0}")]
    Database(#[from] StoreError),
}

/// An open store, and the tenant secret when the store keeps it.
pub struct Opened {
    /// The store.
    pub store: Arc<dyn Store>,
    /// The server secret kept in a shared store; `None` for the disk, whose secret is
    /// a file under `data_dir`.
    pub secret: Option<[u8; 32]>,
}

/// Opens the store of `config`: for postgres, connects, migrates and reads (or makes)
/// the shared secret.
pub async fn open(
    config: &StoreConfig,
    data_dir: &Path,
    metrics: Arc<Metrics>,
) -> Result<Opened, OpenError> {
    match (config.backend, config.url.as_deref()) {
        (StoreBackend::Postgres, Some(url)) => {
            let store = PgStore::connect(url, config.pool_size).await?;
            let secret = store.secret().await?;
            Ok(Opened {
                store: Arc::new(store),
                secret: Some(secret),
            })
        }
        (StoreBackend::Postgres, None) => Err(OpenError::Database(StoreError::Database(
            "store.url is not set".into(),
        ))),
        (StoreBackend::Disk, _) => {
            let writer = Writer::start(config.fsync, metrics, data_dir.to_owned())
                .map_err(OpenError::Writer)?;
            Ok(Opened {
                store: Arc::new(DiskStore::new(data_dir, writer)),
                secret: None,
            })
        }
    }
}
