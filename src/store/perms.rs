//! What the disk store's folder and its files must be before handoff trusts them: owned
//! by the user handoff runs as, writable by no one else, and never a symbolic link. A
//! data dir others can write to lets them plant a link that handoff (as root, say)
//! would follow and append a client's text to, or a `secret` of their choosing.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// `O_NOFOLLOW`, for every file the store opens: a link in its place is an error.
pub fn no_follow() -> i32 {
    // The flag's bits fit an i32 on every Unix.
    i32::try_from(rustix::fs::OFlags::NOFOLLOW.bits()).unwrap_or(0)
}

/// Why a path is not trusted.
#[derive(Debug, thiserror::Error)]
pub enum PermError {
    /// Owned by another user.
    #[error("{path} belongs to uid {owner}, not to the user handoff runs as (uid {me}); chown it")]
    Owner {
        /// The path.
        path: String,
        /// Its owner.
        owner: u32,
        /// handoff's user.
        me: u32,
    },
    /// Writable, or readable for a secret, by others.
    #[error("{path} has mode {mode:04o}: {why}; chmod {fix} it")]
    Mode {
        /// The path.
        path: String,
        /// Its permission bits.
        mode: u32,
        /// What is wrong.
        why: &'static str,
        /// The mode to set.
        fix: &'static str,
    },
    /// It could not be read.
    #[error("cannot check {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Refuses a data dir that another user owns or that group or others may write to.
pub fn check_data_dir(dir: &Path) -> Result<(), PermError> {
    let path = dir.display().to_string();
    let meta = std::fs::metadata(dir).map_err(|source| PermError::Io {
        path: path.clone(),
        source,
    })?;
    owned(&path, meta.uid())?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(PermError::Mode {
            path,
            mode,
            why: "group or others may write to it, and plant links or files",
            fix: "700",
        });
    }
    Ok(())
}

/// Refuses an open secret file that another user owns or others may read or write.
pub fn check_secret(file: &File, path: &Path) -> Result<(), PermError> {
    let shown = path.display().to_string();
    let meta = file.metadata().map_err(|source| PermError::Io {
        path: shown.clone(),
        source,
    })?;
    owned(&shown, meta.uid())?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(PermError::Mode {
            path: shown,
            mode,
            why: "the secret that names tenants must be readable by handoff's user only",
            fix: "600",
        });
    }
    Ok(())
}

fn owned(path: &str, owner: u32) -> Result<(), PermError> {
    let me = rustix::process::geteuid().as_raw();
    if owner != me {
        return Err(PermError::Owner {
            path: path.to_owned(),
            owner,
            me,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_folder_and_a_readable_secret_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_data_dir(dir.path()).is_ok());
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = check_data_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("0777") && err.contains("chmod 700"), "{err}");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, [0u8; 32]).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        let file = File::open(&secret).unwrap();
        assert!(check_secret(&file, &secret).is_err());
        // A link in a store file's place is not followed.
        let link = dir.path().join("messages.jsonl");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        use std::os::unix::fs::OpenOptionsExt;
        let opened = std::fs::OpenOptions::new()
            .append(true)
            .custom_flags(no_follow())
            .open(&link);
        assert!(opened.is_err());
    }
}
