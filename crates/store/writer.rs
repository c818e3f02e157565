//! The one thread that writes to disk, so that no runtime thread ever blocks on a
//! write or an fsync.
//!
//! Callers hand it whole batches of lines and wait for the acknowledgement before
//! they go on: an original is on disk before its request goes upstream. Each batch is
//! one `write` on an `O_APPEND` file, and a failed write is truncated away, so a full
//! disk never leaves a half line in the middle of the log.
//!
//! Durability by `store.fsync`:
//! - `always`: acknowledged only after `sync_data`; a failed sync truncates the batch
//!   away too, so the client's retry writes it once.
//! - `batch`: acknowledged after the write; dirty files are synced every 100 ms and
//!   before their handle is closed. A failed sync cannot be reported to the request
//!   anymore: it is logged and counted (`handoff_store_sync_failures_total`).
//! - `never`: left to the operating system.
//!
//! New folders and files are synced into their parent (except with `never`), so a
//! crash cannot lose a conversation's folder after its lines were acknowledged.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::config::FsyncPolicy;
use crate::metrics::Metrics;

/// Open files kept for appending; older ones are closed first.
const MAX_OPEN_FILES: usize = 256;

/// How often batched fsyncs run.
const BATCH_INTERVAL: Duration = Duration::from_millis(100);

enum Command {
    Append {
        path: PathBuf,
        bytes: Vec<u8>,
        /// Runs first, on the writer thread: what the lines name must exist before them.
        before: Option<Box<dyn FnOnce() -> std::io::Result<()> + Send>>,
        /// Only into a folder that exists ([`Access::AppendInFolder`]).
        ///
        /// [`Access::AppendInFolder`]: super::perms::Access::AppendInFolder
        in_folder: bool,
        reply: oneshot::Sender<std::io::Result<()>>,
    },
    Sync,
    /// Runs `job` on the writer thread with no handle open below `dir`: what it does to
    /// that folder cannot interleave with an append.
    Exclusive {
        dir: PathBuf,
        job: Box<dyn FnOnce() + Send>,
    },
}

/// A handle to the writer thread; cheap to clone.
#[derive(Clone)]
pub struct Writer {
    commands: mpsc::Sender<Command>,
}

impl Writer {
    /// Starts the writer thread with `policy` for files under `root` (the data dir),
    /// counting failed batched syncs in `metrics`.
    pub fn start(
        policy: FsyncPolicy,
        metrics: Arc<Metrics>,
        root: PathBuf,
    ) -> std::io::Result<Self> {
        let (commands, receiver) = mpsc::channel(1024);
        std::thread::Builder::new()
            .name("handoff-writer".into())
            .spawn(move || run(receiver, policy, &metrics, root))?;
        if policy == FsyncPolicy::Batch {
            let ticker = commands.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let mut interval = tokio::time::interval(BATCH_INTERVAL);
                    loop {
                        interval.tick().await;
                        if ticker.send(Command::Sync).await.is_err() {
                            return;
                        }
                    }
                });
            }
        }
        Ok(Self { commands })
    }

    /// Appends `bytes` (whole lines) to `path` and waits until it is written.
    pub async fn append(&self, path: PathBuf, bytes: Vec<u8>) -> std::io::Result<()> {
        self.append_with(path, bytes, None, false).await
    }

    /// [`Writer::append`] into a folder that exists: `NotFound` when it does not (the
    /// conversation was erased since its request began), and nothing is created.
    pub async fn append_in_folder(&self, path: PathBuf, bytes: Vec<u8>) -> std::io::Result<()> {
        self.append_with(path, bytes, None, true).await
    }

    /// Runs `before` on the writer thread, then appends `bytes` if it succeeded: one
    /// step that no other command (a [`Writer::exclusive`] sweep) comes between.
    pub(crate) async fn append_after(
        &self,
        path: PathBuf,
        bytes: Vec<u8>,
        before: impl FnOnce() -> std::io::Result<()> + Send + 'static,
    ) -> std::io::Result<()> {
        self.append_with(path, bytes, Some(Box::new(before)), false)
            .await
    }

    async fn append_with(
        &self,
        path: PathBuf,
        bytes: Vec<u8>,
        before: Option<Box<dyn FnOnce() -> std::io::Result<()> + Send>>,
        in_folder: bool,
    ) -> std::io::Result<()> {
        let (reply, done) = oneshot::channel();
        let gone = || std::io::Error::other("the writer thread has stopped");
        self.commands
            .send(Command::Append {
                path,
                bytes,
                before,
                in_folder,
                reply,
            })
            .await
            .map_err(|_| gone())?;
        done.await.map_err(|_| gone())?
    }

    /// Runs `job` on the writer thread once every handle below `dir` is synced and
    /// closed, so that no append lands between its checks and its changes (a removal, a
    /// folder swapped for its compressed copy). Keep it short: appends wait for it.
    pub async fn exclusive<T: Send + 'static>(
        &self,
        dir: PathBuf,
        job: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        let (reply, done) = oneshot::channel();
        let job = Box::new(move || {
            let _ = reply.send(job());
        });
        let gone = || std::io::Error::other("the writer thread has stopped");
        self.commands
            .send(Command::Exclusive { dir, job })
            .await
            .map_err(|_| gone())?;
        done.await.map_err(|_| gone())?
    }
}

fn run(
    mut receiver: mpsc::Receiver<Command>,
    policy: FsyncPolicy,
    metrics: &Metrics,
    root: PathBuf,
) {
    let mut files: HashMap<PathBuf, File> = HashMap::new();
    let mut dirty: HashSet<PathBuf> = HashSet::new();
    while let Some(command) = receiver.blocking_recv() {
        match command {
            Command::Append {
                path,
                bytes,
                before,
                in_folder,
                reply,
            } => {
                if !files.contains_key(&path) && files.len() >= MAX_OPEN_FILES {
                    // A handle is closed only after its pending sync.
                    sync_dirty(&files, &mut dirty, metrics);
                    files.clear();
                }
                let result = match before.map_or(Ok(()), |before| before()) {
                    Ok(()) => append(&root, &mut files, &path, &bytes, policy, in_folder),
                    Err(err) => Err(err),
                };
                if result.is_ok() && policy == FsyncPolicy::Batch {
                    dirty.insert(path);
                }
                let _ = reply.send(result);
            }
            Command::Sync => sync_dirty(&files, &mut dirty, metrics),
            Command::Exclusive { dir, job } => {
                let below: Vec<PathBuf> = files
                    .keys()
                    .filter(|path| path.starts_with(&dir))
                    .cloned()
                    .collect();
                for path in below {
                    if let Some(file) = files.remove(&path) {
                        if dirty.remove(&path) && file.sync_data().is_err() {
                            metrics.add("handoff_store_sync_failures_total", &[], 1.0);
                        }
                    }
                }
                job();
            }
        }
    }
    sync_dirty(&files, &mut dirty, metrics);
}

/// Syncs every dirty file; a failure is logged and counted, the lines being already
/// acknowledged.
fn sync_dirty(files: &HashMap<PathBuf, File>, dirty: &mut HashSet<PathBuf>, metrics: &Metrics) {
    for path in dirty.drain() {
        if let Some(file) = files.get(&path) {
            if let Err(err) = file.sync_data() {
                metrics.add("handoff_store_sync_failures_total", &[], 1.0);
                tracing::error!(path = %path.display(), error = %err, "fsync failed: lines acknowledged in the last 100 ms may not survive a crash");
            }
        }
    }
}

fn append(
    root: &Path,
    files: &mut HashMap<PathBuf, File>,
    path: &Path,
    bytes: &[u8],
    policy: FsyncPolicy,
    in_folder: bool,
) -> std::io::Result<()> {
    if !files.contains_key(path) {
        // Never through a link, at any folder below the data dir: one planted there
        // would redirect the append.
        let durable = policy != FsyncPolicy::Never;
        let access = if in_folder {
            super::perms::Access::AppendInFolder { durable }
        } else {
            super::perms::Access::Append { durable }
        };
        let file = super::perms::open_beneath(root, path, access)?;
        files.insert(path.to_owned(), file);
    }
    let Some(file) = files.get_mut(path) else {
        return Err(std::io::Error::other("append file vanished from the cache"));
    };
    let before = seal_torn_line(file)?;
    if let Err(err) = file.write_all(bytes) {
        // Never leave a partial line that the next append would glue onto.
        let _ = file.set_len(before);
        files.remove(path);
        return Err(err);
    }
    if policy == FsyncPolicy::Always {
        if let Err(err) = file.sync_data() {
            // Not acknowledged, so not kept: the retry must not find it twice.
            let _ = file.set_len(before);
            let _ = file.sync_data();
            files.remove(path);
            return Err(err);
        }
    }
    Ok(())
}

/// Ends a torn last line (a crash mid-write) so that the next line starts clean;
/// returns the file length before the coming append.
///
/// Checked before every append, not only at open: one pread is cheap next to gluing a
/// good line onto a fragment, which would lose both.
fn seal_torn_line(file: &mut File) -> std::io::Result<u64> {
    let len = file.seek(SeekFrom::End(0))?;
    if len == 0 {
        return Ok(0);
    }
    let mut last = [0u8; 1];
    file.read_exact_at(&mut last, len - 1)?;
    if last[0] == b'\n' {
        return Ok(len);
    }
    // The fragment stays one bad line that readers skip and `audit verify` reports.
    file.write_all(b"\n")?;
    Ok(len + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_log_file;

    #[tokio::test]
    async fn a_torn_line_is_sealed_and_the_next_append_stays_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c/messages.jsonl");
        let writer =
            Writer::start(FsyncPolicy::Always, Arc::default(), dir.path().to_owned()).unwrap();
        let line = br#"{"v":1,"at":"t","kind":"request","model":"m","head":null,"pinned":null,"stream":false,"new_messages":0}"#;
        writer
            .append(path.clone(), [line.as_slice(), b"\n"].concat())
            .await
            .unwrap();
        // A crash mid-append leaves half a line.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(b"{\"v\":1,\"at\":\"t\",\"ki");
        std::fs::write(&path, &bytes).unwrap();
        writer
            .append(path.clone(), [line.as_slice(), b"\n"].concat())
            .await
            .unwrap();

        let log = read_log_file(dir.path(), &path).unwrap();
        assert_eq!(log.lines.len(), 2, "both whole lines survive");
        assert_eq!(log.problems.len(), 1);
        assert_eq!(log.problems[0].line, 2);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::metadata(path.parent().unwrap())
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
    }
}
