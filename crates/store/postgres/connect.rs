//! Opening the pool: the URL, TLS, the schema migration and the shared secret.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

use super::rows::db;
use super::rows::log_of;
use super::{schema, PgStore};
use crate::base::id::ConversationId;
use crate::redact::shown_url;
use crate::{ConversationLog, StoreError};

/// Checks that a postgres store's `store.url` parses, for the config's load; the
/// parser's message may quote the URL, password included, so it is never shown.
pub fn check_url(store: &crate::config::StoreConfig) -> Result<(), crate::config::ConfigError> {
    let url = store.url.as_deref().unwrap_or_default();
    if store.backend != crate::config::StoreBackend::Postgres
        || url.parse::<tokio_postgres::Config>().is_ok()
    {
        return Ok(());
    }
    Err(crate::config::ConfigError::Invalid {
        key: "store.url".into(),
        reason: "not a PostgreSQL connection URL (postgres://user:password@host:port/database)"
            .into(),
    })
}

impl PgStore {
    /// Connects to `url` with at most `pool_size` connections and brings the schema up
    /// to date; fails when the database cannot be reached now.
    pub async fn connect(url: &str, pool_size: usize) -> Result<Self, StoreError> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|_| db("store.url is not a PostgreSQL connection URL"))?;
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls_config()?);
        let manager = Manager::from_config(
            config,
            tls,
            ManagerConfig {
                // A connection broken by a database restart is dropped and replaced.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(pool_size)
            .runtime(Runtime::Tokio1)
            // A database that is down answers quickly with 503, not after minutes.
            .wait_timeout(Some(Duration::from_secs(5)))
            .create_timeout(Some(Duration::from_secs(5)))
            .recycle_timeout(Some(Duration::from_secs(5)))
            .build()
            .map_err(db)?;
        let store = Self {
            pool,
            shown: shown_url(url).into_owned(),
            // The nonce tells a restarted process (same host, same pid) from its ghost.
            holder: format!(
                "{}-{}-{}",
                hostname(),
                std::process::id(),
                hex(&random_bytes().map_err(db)?[..4])
            ),
            claims: std::sync::atomic::AtomicU64::new(0),
        };
        let mut client = store.pool.get().await.map_err(db)?;
        let applied = schema::migrate(&mut client).await.map_err(db)?;
        let version = schema::version(&client).await.map_err(db)?;
        if version > schema::latest() {
            return Err(db(format!(
                "the database schema is version {version}, newer than this build's {}; upgrade handoff",
                schema::latest()
            )));
        }
        tracing::info!(database = %store.shown, applied, version, "store: postgres");
        Ok(store)
    }

    /// The server secret, created once by whichever replica starts first.
    pub async fn secret(&self) -> Result<[u8; 32], StoreError> {
        self.secret_or(&random_bytes().map_err(db)?).await
    }

    /// The database's secret, which becomes `candidate` if it has none yet.
    pub(super) async fn secret_or(&self, candidate: &[u8; 32]) -> Result<[u8; 32], StoreError> {
        let client = self.pool.get().await.map_err(db)?;
        client
            .execute(
                "INSERT INTO handoff_secret (id, secret) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
                &[&candidate.as_slice()],
            )
            .await
            .map_err(db)?;
        let row = client
            .query_one("SELECT secret FROM handoff_secret WHERE id = 1", &[])
            .await
            .map_err(db)?;
        let bytes: Vec<u8> = row.get(0);
        bytes
            .try_into()
            .map_err(|_| db("handoff_secret.secret is not 32 bytes"))
    }

    pub(super) async fn lines_after(
        &self,
        id: &ConversationId,
        seq: u64,
    ) -> Result<ConversationLog, StoreError> {
        let client = self.pool.get().await.map_err(db)?;
        let after = i64::try_from(seq).unwrap_or(i64::MAX);
        let lines = client
            .prepare_cached(
                "SELECT seq, line FROM handoff_lines
                 WHERE tenant = $1 AND conversation = $2 AND seq > $3 ORDER BY seq",
            )
            .await
            .map_err(db)?;
        let records = client
            .prepare_cached(
                "SELECT seq, record FROM handoff_compactions
                 WHERE tenant = $1 AND conversation = $2 AND seq > $3 ORDER BY seq",
            )
            .await
            .map_err(db)?;
        let key = (id.tenant().as_str(), id.as_str());
        // Both queries in one round trip: the client pipelines them.
        let (lines, records) = futures_util::future::try_join(
            client.query(&lines, &[&key.0, &key.1, &after]),
            client.query(&records, &[&key.0, &key.1, &after]),
        )
        .await
        .map_err(db)?;
        Ok(log_of(&lines, &records, seq))
    }
}

/// Server certificates are checked against the Mozilla roots; `sslmode` in the URL
/// says whether TLS is tried (`prefer`, the default), required, or off.
fn tls_config() -> Result<rustls::ClientConfig, StoreError> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    Ok(
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(db)?
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

fn random_bytes() -> std::io::Result<[u8; 32]> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "replica".into())
}
