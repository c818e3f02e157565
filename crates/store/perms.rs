//! What the disk store's folder and its files must be before handoff trusts them: owned
//! by the user handoff runs as, writable by no one else, and never a symbolic link. A
//! data dir others can write to lets them plant a link that handoff (as root, say)
//! would follow and append a client's text to, or a `secret` of their choosing.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// `O_NOFOLLOW`, for every file the store opens: a link in its place is an error.
pub(crate) fn no_follow() -> i32 {
    // The flag's bits fit an i32 on every Unix.
    i32::try_from(rustix::fs::OFlags::NOFOLLOW.bits()).unwrap_or(0)
}

/// How [`open_beneath`] opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// For reading.
    Read,
    /// For appending, creating `0700` folders and a `0600` file; with `durable`, each
    /// folder and file it creates is synced into its parent.
    Append {
        /// Sync what it creates.
        durable: bool,
    },
    /// For appending to a file of a folder that exists: a `0600` file is created, a
    /// folder never is. A request's reply must not bring back a conversation erased
    /// while the request was in flight.
    AppendInFolder {
        /// Sync what it creates.
        durable: bool,
    },
}

/// Opens `path`, which lies under `root`, without following a symbolic link at any
/// component below `root`: each folder is opened from the one before with
/// `O_NOFOLLOW | O_DIRECTORY`, so a link planted in place of a tenant's or a
/// conversation's folder is an error, not a way into another folder. `root` itself (the
/// data dir) may be a link.
pub(crate) fn open_beneath(root: &Path, path: &Path, access: Access) -> std::io::Result<File> {
    use rustix::fs::{fsync, mkdirat, openat, Mode, OFlags, CWD};
    use rustix::io::Errno;
    use std::path::Component;

    let outside = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a file under {}", path.display(), root.display()),
        )
    };
    let mut parts = Vec::new();
    for component in path.strip_prefix(root).map_err(|_| outside())?.components() {
        match component {
            Component::Normal(part) => parts.push(part),
            _ => return Err(outside()),
        }
    }
    let name = parts.pop().ok_or_else(outside)?;
    let (create, durable) = match access {
        Access::Read => (false, false),
        Access::Append { durable } => (true, durable),
        Access::AppendInFolder { durable } => (false, durable),
    };
    let folder = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
    let mut dir = openat(CWD, root, folder, Mode::empty())?;
    for part in parts {
        dir = match openat(&dir, part, folder | OFlags::NOFOLLOW, Mode::empty()) {
            Err(Errno::NOENT) if create => {
                match mkdirat(&dir, part, Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(err) => return Err(err.into()),
                }
                if durable {
                    fsync(&dir)?;
                }
                openat(&dir, part, folder | OFlags::NOFOLLOW, Mode::empty())?
            }
            opened => opened?,
        };
    }
    let file = OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = match access {
        Access::Read => openat(&dir, name, file | OFlags::RDONLY, Mode::empty())?,
        Access::Append { .. } | Access::AppendInFolder { .. } => {
            let append = file | OFlags::RDWR | OFlags::APPEND;
            match openat(&dir, name, append, Mode::empty()) {
                Err(Errno::NOENT) => {
                    let fd = openat(
                        &dir,
                        name,
                        append | OFlags::CREATE,
                        Mode::from_raw_mode(0o600),
                    )?;
                    if durable {
                        fsync(&dir)?;
                    }
                    fd
                }
                opened => opened?,
            }
        }
    };
    Ok(File::from(fd))
}

/// Opens the folder `dir` under `root` for reading its files with [`open_in`], without
/// following a link below `root`. Files read through it are one version of the
/// folder, even if the folder is swapped for another meanwhile (a compression).
pub(crate) fn open_dir_beneath(root: &Path, dir: &Path) -> std::io::Result<rustix::fd::OwnedFd> {
    use rustix::fs::{openat, Mode, OFlags, CWD};
    use std::path::Component;

    let outside = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a folder under {}", dir.display(), root.display()),
        )
    };
    let folder = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
    let mut fd = openat(CWD, root, folder, Mode::empty())?;
    for component in dir.strip_prefix(root).map_err(|_| outside())?.components() {
        match component {
            Component::Normal(part) => {
                fd = openat(&fd, part, folder | OFlags::NOFOLLOW, Mode::empty())?;
            }
            _ => return Err(outside()),
        }
    }
    Ok(fd)
}

/// Opens the file `name` of a folder opened by [`open_dir_beneath`], never through a
/// link.
pub(crate) fn open_in(dir: &rustix::fd::OwnedFd, name: &str) -> std::io::Result<File> {
    use rustix::fs::{openat, Mode, OFlags};
    let flags = OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY;
    Ok(File::from(openat(dir, name, flags, Mode::empty())?))
}

/// Replaces the file at `path` with `bytes` in one rename: written to a `.new` beside
/// it (`0600`, never through a link), synced, renamed over it, and the folder synced.
/// A reader sees the old file or the new one, never part of either.
pub(crate) fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut fresh = path.as_os_str().to_owned();
    fresh.push(".new");
    let fresh = std::path::PathBuf::from(fresh);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(no_follow())
        .open(&fresh)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&fresh, path)?;
    if let Some(parent) = path.parent() {
        File::open(parent)?.sync_all()?;
    }
    Ok(())
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
pub(crate) fn check_data_dir(dir: &Path) -> Result<(), PermError> {
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
pub(crate) fn check_secret(file: &File, path: &Path) -> Result<(), PermError> {
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

    #[test]
    fn a_linked_folder_below_the_root_is_never_followed() {
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("messages.jsonl"), "theirs\n").unwrap();
        let tenant = root.path().join("tenants/a/conversations");
        std::fs::create_dir_all(&tenant).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), tenant.join("c-1")).unwrap();
        let linked = tenant.join("c-1/messages.jsonl");
        assert!(open_beneath(root.path(), &linked, Access::Read).is_err());
        assert!(open_beneath(root.path(), &linked, Access::Append { durable: true }).is_err());
        // A link higher up, in place of a tenant's folder, too.
        std::os::unix::fs::symlink(elsewhere.path(), root.path().join("tenants/b")).unwrap();
        let higher = root.path().join("tenants/b/messages.jsonl");
        assert!(open_beneath(root.path(), &higher, Access::Read).is_err());
        assert_eq!(
            std::fs::read_to_string(elsewhere.path().join("messages.jsonl")).unwrap(),
            "theirs\n"
        );
        // What is not a link is created and opened, and `..` never leaves the root.
        let own = root
            .path()
            .join("tenants/a/conversations/c-2/messages.jsonl");
        let mut file = open_beneath(root.path(), &own, Access::Append { durable: true }).unwrap();
        std::io::Write::write_all(&mut file, b"ours\n").unwrap();
        assert!(open_beneath(root.path(), &own, Access::Read).is_ok());
        let escape = root.path().join("tenants/../../x");
        assert!(open_beneath(root.path(), &escape, Access::Read).is_err());
    }
}
