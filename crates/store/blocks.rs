//! Content stored once per tenant: a pinned set (a system prompt, an agent's standing
//! context) that many conversations open with is written once, to
//! `tenants/<tenant>/blocks/<blake3>.json`, and each conversation's `pinned` line names
//! it ([`PinnedLine::block`]). Readers put the messages back, checked against the
//! digest, so every consumer of a log sees the line as it was sent.
//!
//! A block is written (and synced) before the line that names it, in the same step of
//! the writer thread, so a crash never leaves a name without its block. A block no
//! remaining conversation names is removed by [`unnamed`] and [`remove_unnamed`] after
//! a prune or an erasure: the logs are read first, then, on the writer thread, a block
//! goes only if it was not written or reused since the reading began. A line that names
//! it was appended in the step that wrote or reused it, so before the reading began,
//! and the reading saw it.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde_json::value::RawValue;

use super::layout::{COLD_FILE, CONVERSATIONS_DIR, MESSAGES_FILE, TENANTS_DIR};
use crate::base::line::{Entry, Line, PinnedLine, BLOCK_VERSION, FORMAT_VERSION};
use crate::base::tenant::TenantId;

/// Pinned sets shorter than this stay in their line: a block costs a file.
pub(crate) const BLOCK_MIN: usize = 1024;

/// Folder of a tenant's blocks.
pub(crate) const BLOCKS_DIR: &str = "blocks";

/// The folder of `tenant`'s blocks.
pub(crate) fn blocks_dir(data_dir: &Path, tenant: &TenantId) -> PathBuf {
    data_dir
        .join(TENANTS_DIR)
        .join(tenant.as_str())
        .join(BLOCKS_DIR)
}

/// The blocks folder of the conversation whose log is `messages`, by the layout.
pub fn blocks_of(messages: &Path) -> Option<PathBuf> {
    Some(messages.parent()?.parent()?.parent()?.join(BLOCKS_DIR))
}

/// A pinned line that should be stored as a block: its digest and bytes.
pub(crate) fn candidate(line: &Line) -> Option<(String, String)> {
    let Entry::Pinned(pinned) = &line.entry else {
        return None;
    };
    if pinned.block.is_some() {
        return None;
    }
    let array = pinned.array();
    (array.len() >= BLOCK_MIN).then(|| (blake3::hash(array.as_bytes()).to_hex().to_string(), array))
}

/// `line` naming the block `digest` instead of holding its messages.
pub(crate) fn by_reference(line: &mut Line, digest: String) {
    if let Entry::Pinned(pinned) = &mut line.entry {
        pinned.messages.clear();
        pinned.block = Some(digest);
        line.v = BLOCK_VERSION;
    }
}

/// Makes sure the block `digest` holds `bytes` (blocking; on the writer thread): writes
/// it if new, marks it reused if not. True when it was written.
pub(crate) fn ensure(root: &Path, dir: &Path, digest: &str, bytes: &str) -> std::io::Result<bool> {
    let path = dir.join(format!("{digest}.json"));
    if let Ok(file) = std::fs::File::options().write(true).open(&path) {
        file.set_modified(SystemTime::now())?;
        return Ok(false);
    }
    let fresh = dir.join(format!("{digest}.json.new"));
    let _ = std::fs::remove_file(&fresh);
    let mut file =
        super::perms::open_beneath(root, &fresh, super::perms::Access::Append { durable: true })?;
    file.write_all(bytes.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&fresh, &path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(true)
}

/// The blocks read so far by one reader, by digest.
#[derive(Default)]
pub(crate) struct Resolver {
    dir: Option<(PathBuf, PathBuf)>,
    read: HashMap<String, Option<Vec<Box<RawValue>>>>,
}

impl Resolver {
    /// A resolver for the conversation whose log is `messages` under `root`.
    pub(crate) fn new(root: &Path, messages: &Path) -> Self {
        Self {
            dir: blocks_of(messages).map(|dir| (root.to_owned(), dir)),
            read: HashMap::new(),
        }
    }

    /// Puts a block's messages back into `line`; an error says why it cannot.
    pub(crate) fn resolve(&mut self, line: &mut Line) -> Result<(), String> {
        let Entry::Pinned(PinnedLine {
            messages, block, ..
        }) = &mut line.entry
        else {
            return Ok(());
        };
        let Some(digest) = block.clone() else {
            return Ok(());
        };
        let dir = self.dir.clone();
        let found = self
            .read
            .entry(digest.clone())
            .or_insert_with(|| dir.and_then(|(root, dir)| load(&root, &dir, &digest)));
        let Some(found) = found else {
            return Err(format!("pinned block {digest} is missing or damaged"));
        };
        *messages = found.clone();
        *block = None;
        line.v = FORMAT_VERSION;
        Ok(())
    }
}

/// The messages of block `digest`, if it is there and its bytes have that digest.
fn load(root: &Path, dir: &Path, digest: &str) -> Option<Vec<Box<RawValue>>> {
    let path = dir.join(format!("{digest}.json"));
    let mut file = super::perms::open_beneath(root, &path, super::perms::Access::Read).ok()?;
    let mut bytes = String::new();
    file.read_to_string(&mut bytes).ok()?;
    if blake3::hash(bytes.as_bytes()).to_hex().as_str() != digest {
        return None;
    }
    serde_json::from_str(&bytes).ok()
}

/// The blocks `tenant`'s conversations name (blocking): each log read through, the
/// compressed part decompressed.
fn named(data_dir: &Path, tenant: &TenantId) -> std::io::Result<HashSet<String>> {
    let finder = memchr::memmem::Finder::new(br#""block":""#);
    let mut names = HashSet::new();
    let conversations = data_dir
        .join(TENANTS_DIR)
        .join(tenant.as_str())
        .join(CONVERSATIONS_DIR);
    let Ok(entries) = std::fs::read_dir(&conversations) else {
        return Ok(names);
    };
    for entry in entries.flatten() {
        let mut bytes = Vec::new();
        if let Ok(cold) = std::fs::File::open(entry.path().join(COLD_FILE)) {
            zstd::stream::read::Decoder::new(cold)?.read_to_end(&mut bytes)?;
        }
        if let Ok(mut hot) = std::fs::File::open(entry.path().join(MESSAGES_FILE)) {
            hot.read_to_end(&mut bytes)?;
        }
        for at in finder.find_iter(&bytes) {
            let start = at + finder.needle().len();
            if let Some(hex) = bytes.get(start..start + 64) {
                names.insert(String::from_utf8_lossy(hex).into_owned());
            }
        }
    }
    Ok(names)
}

/// The blocks of `tenant` that no conversation names (blocking), and when the
/// reading began: [`remove_unnamed`] spares a block touched since.
pub(crate) fn unnamed(
    data_dir: &Path,
    tenant: &TenantId,
) -> std::io::Result<(Vec<PathBuf>, SystemTime)> {
    let began = SystemTime::now();
    let dir = blocks_dir(data_dir, tenant);
    // A link in its place would name another folder's files for deletion.
    if let Err(err) = super::perms::open_dir_beneath(data_dir, &dir) {
        if err.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %dir.display(), error = %err, "not removing blocks from a folder that is not a folder under the data dir (a symbolic link?)");
        }
        return Ok((Vec::new(), began));
    }
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok((Vec::new(), began));
    };
    let blocks: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    if blocks.is_empty() {
        return Ok((blocks, began));
    }
    let named = named(data_dir, tenant)?;
    let unnamed = blocks
        .into_iter()
        .filter(|path| {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| !named.contains(n.trim_end_matches(".json")))
        })
        .collect();
    Ok((unnamed, began))
}

/// Removes each of `blocks` not written or reused since `began` (blocking; on the
/// writer thread). Returns how many went.
pub(crate) fn remove_unnamed(
    root: &Path,
    blocks: &[PathBuf],
    began: SystemTime,
) -> std::io::Result<usize> {
    let mut removed = 0;
    // Through the folder opened without following a link, as the reading found it.
    let Some(dir) = blocks.first().and_then(|p| p.parent()) else {
        return Ok(0);
    };
    let folder = super::perms::open_dir_beneath(root, dir)?;
    for path in blocks.iter().filter(|p| p.parent() == Some(dir)) {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let untouched = super::perms::open_in(&folder, name)
            .and_then(|file| file.metadata()?.modified())
            .is_ok_and(|at| at < began);
        if untouched {
            rustix::fs::unlinkat(&folder, name, rustix::fs::AtFlags::empty())?;
            removed += 1;
        }
    }
    if removed > 0 {
        rustix::fs::fsync(&folder)?;
    }
    Ok(removed)
}
