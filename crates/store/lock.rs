//! One `serve` per data dir: an exclusive lock on `data_dir/lock`, held for the life of
//! the process. Two writers on one folder could truncate away each other's
//! acknowledged lines. `audit` reads without it; the commands that change the data
//! dir (erase, hold, prune) take it, or ask the server that holds it, whose address
//! it names.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

/// The lock file's name under `data_dir`.
pub const LOCK_FILE: &str = "lock";

/// Why the data dir could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error("data_dir {data_dir} is in use by another handoff serve (pid {holder}); stop it or choose another data_dir")]
    Held {
        /// The folder.
        data_dir: String,
        /// The holder's pid as it wrote it, or `unknown`.
        holder: String,
        /// Where the holder listens (`http://127.0.0.1:8080`), once it said so.
        listening: Option<String>,
    },
    /// The folder is not safe to write in.
    #[error("refusing data_dir: {0}")]
    Unsafe(#[from] super::perms::PermError),
    /// The lock file could not be opened or written.
    #[error("cannot lock data_dir {data_dir}: {source}")]
    Io {
        /// The folder.
        data_dir: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The held lock; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct DataDirLock {
    file: File,
}

impl DataDirLock {
    /// Takes the lock, creating the folder if needed, and writes this process's pid.
    pub fn acquire(data_dir: &Path) -> Result<Self, LockError> {
        let io = |source| LockError::Io {
            data_dir: data_dir.display().to_string(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(data_dir)
            .map_err(io)?;
        super::perms::check_data_dir(data_dir)?;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(super::perms::no_follow())
            .open(data_dir.join(LOCK_FILE))
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let mut lines = text.lines().map(str::trim);
                let holder = lines.next().unwrap_or_default();
                return Err(LockError::Held {
                    data_dir: data_dir.display().to_string(),
                    holder: if holder.is_empty() { "unknown" } else { holder }.to_owned(),
                    listening: lines.next().filter(|l| !l.is_empty()).map(str::to_owned),
                });
            }
            Err(std::fs::TryLockError::Error(err)) => return Err(io(err)),
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(Self { file })
    }

    /// Writes where this process listens (`http://127.0.0.1:8080`) after its pid, so
    /// that a command run beside it (`handoff audit erase`) can reach its admin API.
    pub fn advertise(&self, url: &str) -> std::io::Result<()> {
        let mut file = &self.file;
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
        writeln!(file, "{}\n{url}", std::process::id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let held = DataDirLock::acquire(dir.path()).unwrap();
        let err = DataDirLock::acquire(dir.path()).unwrap_err().to_string();
        assert!(err.contains(&std::process::id().to_string()), "{err}");
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        drop(held);
        assert!(DataDirLock::acquire(dir.path()).is_ok(), "released on drop");
    }
}
