//! Tenants: who a request belongs to. Every conversation is scoped by its tenant, so
//! two callers whose conversations open with the same message never share tracking,
//! compactions, calibration or views.
//!
//! A tenant is the matching proxy key's name when `[[auth.keys]]` is configured, and
//! otherwise `t-` + 16 hex digits of HMAC-SHA256(server secret, credential): the
//! credential never appears in it, and without the secret it cannot be guessed.

use std::fmt;
use std::sync::Arc;

pub use crate::base::tenant::{TenantError, TenantId, LEGACY};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub use crate::layout::SECRET_FILE;

/// The server's secret: the key of the HMAC that turns credentials into tenants.
///
/// Held keyed: keying the HMAC is half the work of a tenant (two of its four SHA-256
/// blocks), the same for every credential. The tenants of recent credentials are kept
/// too: a client sends the same credential with every request, and its tenant never
/// changes. They are kept in memory only, looked up by the credential's exact bytes,
/// and never logged.
#[derive(Clone)]
pub struct ServerSecret {
    mac: Hmac<Sha256>,
    tenants: Arc<quick_cache::sync::Cache<Box<[u8]>, TenantId>>,
}

/// How many credentials' tenants are kept.
const KEPT_TENANTS: usize = 4096;

/// The longest credential whose tenant is kept: a longer one is derived each time, so
/// no request can make the cache hold more than this per entry.
const KEPT_CREDENTIAL_BYTES: usize = 512;

impl fmt::Debug for ServerSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServerSecret(…)")
    }
}

impl ServerSecret {
    /// A secret from known bytes (tests, a shared backend).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        // HMAC pads a key shorter than the hash's block with zeros, so the padded key
        // is the same key, and keying with a full block cannot fail.
        let mut block = [0u8; 64];
        block[..32].copy_from_slice(&bytes);
        Self {
            mac: <Hmac<Sha256> as KeyInit>::new(&block.into()),
            tenants: Arc::new(quick_cache::sync::Cache::new(KEPT_TENANTS)),
        }
    }

    /// Reads `<data_dir>/secret`, creating it (0600, 32 random bytes) on first start.
    pub fn load_or_create(data_dir: &Path) -> std::io::Result<Self> {
        let path = data_dir.join(SECRET_FILE);
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(crate::perms::no_follow())
            .open(&path);
        match opened {
            Ok(mut file) => {
                // A secret planted by someone else would let them name every tenant.
                crate::perms::check_secret(&file, &path).map_err(std::io::Error::other)?;
                let mut bytes = [0u8; 32];
                file.read_exact(&mut bytes)?;
                return Ok(Self::from_bytes(bytes));
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(err),
        }
        let mut bytes = [0u8; 32];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
        std::fs::create_dir_all(data_dir)?;
        // create_new: two processes starting at once must not each write their own.
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(crate::perms::no_follow())
            .open(&path)
        {
            Ok(mut file) => {
                file.write_all(&bytes)?;
                file.sync_all()?;
                Ok(Self::from_bytes(bytes))
            }
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
                Self::load_or_create(data_dir)
            }
            Err(err) => Err(err),
        }
    }

    /// The tenant of a caller presenting `credential` (what
    /// `dialect::credential` reads from a request).
    pub fn tenant_for(&self, credential: &[u8]) -> TenantId {
        if let Some(tenant) = self.tenants.get(credential) {
            return tenant;
        }
        let tenant = self.derive(credential);
        if credential.len() <= KEPT_CREDENTIAL_BYTES {
            self.tenants.insert(Box::from(credential), tenant.clone());
        }
        tenant
    }

    /// A short keyed digest of `text` within `tenant`, for the marker that replaces a
    /// redacted text: the same text gets the same marker in every request of the
    /// tenant, and the marker tells nothing of the text to one without the secret.
    pub fn redaction_tag(&self, tenant: &TenantId, text: &str) -> String {
        let mut mac = self.mac.clone();
        mac.update(b"redaction\0");
        mac.update(tenant.as_str().as_bytes());
        mac.update(b"\0");
        mac.update(text.as_bytes());
        let digest = mac.finalize().into_bytes();
        digest[..5].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The keyed digest of `parts` within `tenant` under `purpose`: what authenticates
    /// a value handoff hands a client and reads back (a compaction handle), so that
    /// without the secret none can be made, and one tenant's never passes for
    /// another's.
    pub fn seal(&self, purpose: &str, tenant: &TenantId, parts: &[&[u8]]) -> [u8; 32] {
        self.keyed(purpose, tenant, parts)
            .finalize()
            .into_bytes()
            .into()
    }

    /// True when `tag` is [`ServerSecret::seal`]'s for these parts, compared in
    /// constant time.
    pub fn verify(&self, purpose: &str, tenant: &TenantId, parts: &[&[u8]], tag: &[u8]) -> bool {
        self.keyed(purpose, tenant, parts).verify_slice(tag).is_ok()
    }

    /// The MAC over `purpose`, `tenant` and `parts`, each length-prefixed so that no
    /// two lists of parts collide.
    fn keyed(&self, purpose: &str, tenant: &TenantId, parts: &[&[u8]]) -> Hmac<Sha256> {
        let mut mac = self.mac.clone();
        mac.update(purpose.as_bytes());
        mac.update(b"\0");
        for part in std::iter::once(tenant.as_str().as_bytes()).chain(parts.iter().copied()) {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        mac
    }

    /// The tenant of `credential`, worked out from the secret.
    fn derive(&self, credential: &[u8]) -> TenantId {
        let mut mac = self.mac.clone();
        mac.update(credential);
        let digest = mac.finalize().into_bytes();
        TenantId::derived(&digest[..8])
    }
}
