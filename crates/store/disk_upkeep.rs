//! The disk store's upkeep: ages, holds, removal, compression, tombstones and sizes.
//!
//! Whatever changes a conversation's folder runs on the writer thread
//! ([`crate::Writer::exclusive`]) once its files are closed, so no append lands between the
//! check (is it held, was it written since) and the change. A change is one rename:
//! - removal moves the folder into `upkeep/` and deletes it there;
//! - compression builds the compressed copy in `upkeep/` and swaps it in
//!   (`RENAME_EXCHANGE`), so a reader sees the old folder or the new, never half of
//!   either.
//!
//! A crash leaves at most a folder in `upkeep/`, removed at the next start.

use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::layout::{
    tenants, COLD_FILE, COMPACTIONS_FILE, CONVERSATIONS_DIR, HOLD_FILE, MESSAGES_FILE, TENANTS_DIR,
    UPKEEP_DIR,
};
use super::upkeep::{Activity, Hold, Removed, TenantStats, Unless};
use crate::base::id::ConversationId;
use crate::base::tenant::TenantId;

/// The zstd level of cold conversations: JSON logs compress 10-20× at it, at some
/// 100 MB/s on one core, off the request path.
const LEVEL: i32 = 9;

/// A folder retired by a compression is deleted after this long: a reader that opened
/// it just before the swap has long finished reading it.
const RETIRED_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// The folders of every conversation of `tenant` or of all, with their tenants.
fn folders(
    data_dir: &Path,
    tenant: Option<&TenantId>,
) -> std::io::Result<Vec<(TenantId, String, PathBuf)>> {
    let tenants = match tenant {
        Some(tenant) => vec![tenant.clone()],
        None => tenants(data_dir)?,
    };
    let mut out = Vec::new();
    for tenant in tenants {
        let dir = data_dir
            .join(TENANTS_DIR)
            .join(tenant.as_str())
            .join(CONVERSATIONS_DIR);
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => return Err(err),
        };
        for entry in entries.flatten() {
            if let Some(name) = entry.file_name().to_str() {
                out.push((tenant.clone(), name.to_owned(), entry.path()));
            }
        }
    }
    Ok(out)
}

/// When a conversation's folder was last written, and the bytes it holds; `None` when
/// it has no log.
fn folder_state(dir: &Path) -> Option<(SystemTime, u64, bool)> {
    let mut last = None::<SystemTime>;
    let mut bytes = 0;
    let mut logged = false;
    for name in [MESSAGES_FILE, COLD_FILE, COMPACTIONS_FILE] {
        let Ok(meta) = std::fs::symlink_metadata(dir.join(name)) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        logged |= name != COMPACTIONS_FILE;
        bytes += meta.len();
        if let Ok(modified) = meta.modified() {
            last = Some(last.map_or(modified, |l| l.max(modified)));
        }
    }
    logged.then_some((
        last.unwrap_or(SystemTime::UNIX_EPOCH),
        bytes,
        dir.join(COLD_FILE).is_file(),
    ))
}

/// Every conversation of `tenant` or of all, with its age, hold and size (blocking).
pub(super) fn activity(
    data_dir: &Path,
    tenant: Option<&TenantId>,
) -> std::io::Result<Vec<Activity>> {
    let mut out = Vec::new();
    for (tenant, name, dir) in folders(data_dir, tenant)? {
        let Ok(id) = ConversationId::parse(tenant, &name) else {
            continue;
        };
        if let Some((last, bytes, compressed)) = folder_state(&dir) {
            out.push(Activity {
                id,
                last,
                held: dir.join(HOLD_FILE).is_file(),
                bytes,
                compressed,
            });
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// A fresh name under `upkeep/` for `what`, the folder created with it if needed.
fn upkeep_path(data_dir: &Path, what: &str) -> std::io::Result<PathBuf> {
    let dir = data_dir.join(UPKEEP_DIR);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    Ok(dir.join(format!("{what}-{nanos}-{}", std::process::id())))
}

/// A short name for the conversation folder `dir`, carried by the upkeep folders made
/// from it, so that its erasure finds them.
fn folder_tag(dir: &Path) -> String {
    let hash = blake3::hash(dir.as_os_str().as_encoded_bytes()).to_hex();
    hash[..16].to_owned()
}

/// The upkeep folders made from the conversation folder `dir`: a compression's copy,
/// or the old folder a compression swapped out, which readers may still hold for a
/// while, but which an erasure must not leave behind.
fn made_from(data_dir: &Path, dir: &Path) -> Vec<PathBuf> {
    let prefix = format!("compressing-{}-", folder_tag(dir));
    let Ok(entries) = std::fs::read_dir(data_dir.join(UPKEEP_DIR)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .map(|entry| entry.path())
        .collect()
}

/// Syncs a folder, so that a rename in it survives a crash.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Moves a conversation's folder out of the tree unless `unless` applies; run on the
/// writer thread. Returns where it went and where the copies a compression made of it
/// are, for deletion, and the bytes it held.
pub(super) fn retire(
    data_dir: &Path,
    dir: &Path,
    unless: Unless,
) -> std::io::Result<(Removed, Vec<PathBuf>)> {
    let Some((last, bytes, _)) = folder_state(dir) else {
        return Ok((Removed::Missing, Vec::new()));
    };
    if dir.join(HOLD_FILE).is_file() {
        return Ok((Removed::Held, Vec::new()));
    }
    if let Unless::HeldOrWrittenSince(since) = unless {
        if last >= since {
            return Ok((Removed::Active, Vec::new()));
        }
    }
    // Neither the folder nor the upkeep folder it goes to may be reached through a
    // link: what is deleted next is what the rename moved.
    super::perms::open_dir_beneath(data_dir, dir)?;
    let trash = upkeep_path(data_dir, "removed")?;
    super::perms::open_dir_beneath(data_dir, &data_dir.join(UPKEEP_DIR))?;
    std::fs::rename(dir, &trash)?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    let mut gone = vec![trash];
    gone.extend(made_from(data_dir, dir));
    Ok((Removed::Removed(bytes), gone))
}

/// Writes or removes a conversation's hold; run on the writer thread. False when the
/// conversation has no log.
pub(super) fn write_hold(dir: &Path, hold: Option<&Hold>) -> std::io::Result<bool> {
    if folder_state(dir).is_none() {
        return Ok(false);
    }
    let path = dir.join(HOLD_FILE);
    match hold {
        None => match std::fs::remove_file(&path) {
            Ok(()) => sync_dir(dir)?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(err),
        },
        Some(hold) => super::perms::replace_file(&path, &serde_json::to_vec(hold)?)?,
    }
    Ok(true)
}

/// A compressed copy of a conversation's folder, built under `upkeep/` while appends go
/// on (blocking), and what its plain log was when it was read.
pub(super) struct Compressed {
    /// The copy.
    pub folder: PathBuf,
    /// The plain log's length and time when it was compressed: the swap happens only
    /// if it is still so.
    pub hot: (u64, SystemTime),
    /// The folder's bytes before and after.
    pub bytes: (u64, u64),
}

/// Builds the compressed copy of `dir` if its log was last written before
/// `idle_since`: the cold lines so far, then one more zstd frame of the plain log, an
/// empty plain log, the records and the hold as they are. `None` when there is nothing
/// to compress.
pub(super) fn build_compressed(
    data_dir: &Path,
    dir: &Path,
    idle_since: SystemTime,
) -> std::io::Result<Option<Compressed>> {
    let Some((last, before, _)) = folder_state(dir) else {
        return Ok(None);
    };
    let hot_path = dir.join(MESSAGES_FILE);
    let hot_meta = std::fs::symlink_metadata(&hot_path)?;
    if last >= idle_since || hot_meta.len() == 0 {
        return Ok(None);
    }
    let hot = (hot_meta.len(), hot_meta.modified()?);
    // Named after the conversation: an erasure finds the old folder this becomes.
    let folder = upkeep_path(data_dir, &format!("compressing-{}", folder_tag(dir)))?;
    std::fs::DirBuilder::new().mode(0o700).create(&folder)?;
    let create = |name: &str| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(folder.join(name))
    };
    let mut cold = create(COLD_FILE)?;
    if let Ok(mut old) = std::fs::File::open(dir.join(COLD_FILE)) {
        // zstd reads concatenated frames as one stream: the old frames stay as they are.
        std::io::copy(&mut old, &mut cold)?;
    }
    let plain = std::fs::File::open(&hot_path)?;
    // Exactly the bytes measured: an append after them is not in this copy, and the
    // swap will see the length changed and give up.
    let mut encoder = zstd::stream::write::Encoder::new(&mut cold, LEVEL)?;
    // With the size declared, the frame's window is the conversation's size, not the
    // level's 8 MiB: a reader then allocates kilobytes per conversation, not megabytes.
    encoder.set_pledged_src_size(Some(hot.0))?;
    encoder.include_contentsize(true)?;
    std::io::copy(&mut plain.take(hot.0), &mut encoder)?;
    encoder.finish()?;
    cold.sync_all()?;
    create(MESSAGES_FILE)?.sync_all()?;
    for name in [COMPACTIONS_FILE, HOLD_FILE] {
        if let Ok(mut from) = std::fs::File::open(dir.join(name)) {
            let mut to = create(name)?;
            std::io::copy(&mut from, &mut to)?;
            to.sync_all()?;
        }
    }
    sync_dir(&folder)?;
    let after = folder_state(&folder).map_or(0, |(_, bytes, _)| bytes);
    Ok(Some(Compressed {
        folder,
        hot,
        bytes: (before, after),
    }))
}

/// Swaps the compressed copy in for `dir` if nothing was written to it since the copy
/// was built; run on the writer thread. True when swapped; the old folder is then at
/// the copy's path, and deleted by a later [`clean`].
pub(super) fn swap_compressed(dir: &Path, copy: &Compressed) -> std::io::Result<bool> {
    let unchanged = std::fs::symlink_metadata(dir.join(MESSAGES_FILE))
        .ok()
        .and_then(|meta| Some((meta.len(), meta.modified().ok()?)))
        == Some(copy.hot);
    let same_records = std::fs::symlink_metadata(dir.join(COMPACTIONS_FILE))
        .map(|m| m.len())
        .ok()
        == std::fs::symlink_metadata(copy.folder.join(COMPACTIONS_FILE))
            .map(|m| m.len())
            .ok();
    let same_hold = dir.join(HOLD_FILE).is_file() == copy.folder.join(HOLD_FILE).is_file();
    if !(unchanged && same_records && same_hold) {
        return Ok(false);
    }
    rustix::fs::renameat_with(
        rustix::fs::CWD,
        &copy.folder,
        rustix::fs::CWD,
        dir,
        rustix::fs::RenameFlags::EXCHANGE,
    )?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    Ok(true)
}

/// Deletes what upkeep left under `upkeep/`: removed folders at once, folders retired
/// by a compression once no reader can still be in them, and copies a crash
/// interrupted (blocking). `all` deletes everything: at start, nothing reads them.
pub(super) fn clean(data_dir: &Path, all: bool) -> std::io::Result<()> {
    let dir = data_dir.join(UPKEEP_DIR);
    // A link in its place would have its target emptied: never followed for deletion.
    match super::perms::open_dir_beneath(data_dir, &dir) {
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => {
            tracing::warn!(path = %dir.display(), error = %err, "not cleaning an upkeep folder that is not a folder under the data dir (a symbolic link?)");
            return Ok(());
        }
    }
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    };
    let now = SystemTime::now();
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|at| now.duration_since(at).unwrap_or_default() > RETIRED_FOR);
        let removed = entry.file_name().to_string_lossy().starts_with("removed-");
        if all || removed || old {
            let path = entry.path();
            let gone = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            if let Err(err) = gone {
                if err.kind() != std::io::ErrorKind::NotFound {
                    return Err(err);
                }
            }
        }
    }
    Ok(())
}

/// The requests and raw bytes of one conversation's folder (blocking): its logs read
/// through, the compressed one decompressed.
fn measure(dir: &Path) -> std::io::Result<(u64, u64)> {
    let finder = memchr::memmem::Finder::new(br#""kind":"request""#);
    let mut requests = 0u64;
    let mut raw = 0u64;
    let mut count = |reader: &mut dyn Read| -> std::io::Result<()> {
        let mut buffer = vec![0u8; 1 << 16];
        // A match can straddle two reads: keep the tail of each.
        let keep = finder.needle().len() - 1;
        let mut filled = 0;
        loop {
            let read = reader.read(&mut buffer[filled..])?;
            if read == 0 {
                break;
            }
            raw += read as u64;
            let end = filled + read;
            requests += finder.find_iter(&buffer[..end]).count() as u64;
            let tail = end.saturating_sub(keep);
            buffer.copy_within(tail..end, 0);
            filled = end - tail;
        }
        Ok(())
    };
    if let Ok(file) = std::fs::File::open(dir.join(COLD_FILE)) {
        count(&mut zstd::stream::read::Decoder::new(file)?)?;
    }
    if let Ok(mut file) = std::fs::File::open(dir.join(MESSAGES_FILE)) {
        count(&mut file)?;
    }
    if let Ok(meta) = std::fs::metadata(dir.join(COMPACTIONS_FILE)) {
        raw += meta.len();
    }
    Ok((requests, raw))
}

/// Conversations, requests and bytes per tenant (blocking).
pub(super) fn stats(
    data_dir: &Path,
    tenant: Option<&TenantId>,
) -> std::io::Result<Vec<TenantStats>> {
    let mut by_tenant: std::collections::BTreeMap<TenantId, TenantStats> = Default::default();
    for conversation in activity(data_dir, tenant)? {
        let dir = super::layout::conversation_dir(data_dir, &conversation.id);
        let (requests, raw) = measure(&dir)?;
        let stats = by_tenant
            .entry(conversation.id.tenant().clone())
            .or_insert_with(|| TenantStats {
                tenant: conversation.id.tenant().to_string(),
                ..TenantStats::default()
            });
        stats.conversations += 1;
        stats.compressed += u64::from(conversation.compressed);
        stats.held += u64::from(conversation.held);
        stats.requests += requests;
        stats.bytes_raw += raw;
        stats.bytes_stored += conversation.bytes;
    }
    Ok(by_tenant.into_values().collect())
}
