//! Tenants: who a request belongs to. Every conversation is scoped by its tenant, so
//! two callers whose conversations open with the same message never share tracking,
//! compactions, calibration or views.
//!
//! A tenant is the matching proxy key's name when `[[auth.keys]]` is configured, and
//! otherwise `t-` + 16 hex digits of HMAC-SHA256(server secret, credential): the
//! credential never appears in it, and without the secret it cannot be guessed.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

pub use crate::base::tenant::{TenantError, TenantId, LEGACY};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub use crate::store::layout::SECRET_FILE;

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
            .custom_flags(crate::store::perms::no_follow())
            .open(&path);
        match opened {
            Ok(mut file) => {
                // A secret planted by someone else would let them name every tenant.
                crate::store::perms::check_secret(&file, &path).map_err(std::io::Error::other)?;
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
            .custom_flags(crate::store::perms::no_follow())
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

    /// The tenant of a caller presenting `credential` (an `Authorization` or
    /// `x-api-key` value, or `anonymous`).
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

    /// The tenant of `credential`, worked out from the secret.
    fn derive(&self, credential: &[u8]) -> TenantId {
        let mut mac = self.mac.clone();
        mac.update(credential);
        let digest = mac.finalize().into_bytes();
        TenantId::derived(&digest[..8])
    }
}

/// The credential a request presents: `Authorization`, else `x-api-key` read as the
/// `Bearer` value it stands for, else `anonymous`. One key is one tenant whichever
/// header carries it: Anthropic's SDKs send `x-api-key` or `Authorization: Bearer`.
pub fn credential(headers: &http::HeaderMap) -> Cow<'_, [u8]> {
    if let Some(value) = headers.get(http::header::AUTHORIZATION) {
        return Cow::Borrowed(value.as_bytes());
    }
    match headers.get("x-api-key") {
        Some(key) => Cow::Owned([b"Bearer ".as_slice(), key.as_bytes()].concat()),
        None => Cow::Borrowed(b"anonymous".as_slice()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_one_tenant_in_either_header() {
        let mut bearer = http::HeaderMap::new();
        bearer.insert(http::header::AUTHORIZATION, "Bearer sk-1".parse().unwrap());
        let mut api_key = http::HeaderMap::new();
        api_key.insert("x-api-key", "sk-1".parse().unwrap());
        assert_eq!(credential(&bearer), credential(&api_key));
        assert_eq!(&*credential(&http::HeaderMap::new()), b"anonymous");
    }

    #[test]
    fn tenants_are_stable_per_credential_and_hide_it() {
        let secret = ServerSecret::from_bytes([7; 32]);
        let a = secret.tenant_for(b"Bearer sk-alpha");
        assert_eq!(a, secret.tenant_for(b"Bearer sk-alpha"));
        assert_ne!(a, secret.tenant_for(b"Bearer sk-beta"));
        assert!(
            a.as_str().starts_with("t-") && a.as_str().len() == 18,
            "{a}"
        );
        assert!(!a.as_str().contains("alpha"));
        let other = ServerSecret::from_bytes([8; 32]);
        assert_ne!(
            a,
            other.tenant_for(b"Bearer sk-alpha"),
            "the secret keys it"
        );
    }

    #[test]
    fn a_tenant_is_the_standard_hmac_so_its_name_never_changes() {
        // HMAC-SHA256(key = 32 bytes of 7, "Bearer sk-alpha"), its first 8 bytes: what
        // any HMAC implementation gives (Python's `hmac` made this one), and so the
        // name every tenant logged so far has on disk.
        let secret = ServerSecret::from_bytes([7; 32]);
        assert_eq!(
            secret.tenant_for(b"Bearer sk-alpha").as_str(),
            "t-17de92ddd6557509"
        );
    }

    #[test]
    fn a_kept_tenant_is_the_derived_one_and_only_for_the_same_bytes() {
        let secret = ServerSecret::from_bytes([7; 32]);
        let long = [b"Bearer ".as_slice(), &[b'k'; 600]].concat();
        for credential in [b"Bearer sk-alpha".as_slice(), b"Bearer sk-alph", &long] {
            let first = secret.tenant_for(credential);
            assert_eq!(first, secret.derive(credential));
            assert_eq!(
                secret.tenant_for(credential),
                first,
                "kept, or derived again"
            );
        }
        // A clone shares what is kept, and keeps deriving the same names.
        let clone = secret.clone();
        assert_eq!(
            clone.tenant_for(b"Bearer sk-alpha").as_str(),
            "t-17de92ddd6557509"
        );
        assert_ne!(
            secret.tenant_for(b"Bearer sk-alph"),
            secret.tenant_for(b"Bearer sk-alpha")
        );
        assert_eq!(secret.tenants.len(), 2, "the long credential is not kept");
    }

    #[test]
    fn the_secret_is_created_once_with_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let first = ServerSecret::load_or_create(dir.path()).unwrap();
        let again = ServerSecret::load_or_create(dir.path()).unwrap();
        assert_eq!(
            first.tenant_for(b"k"),
            again.tenant_for(b"k"),
            "the same key"
        );
        let mode = std::fs::metadata(dir.path().join(SECRET_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
