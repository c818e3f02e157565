//! The disk store's indexes of upstream ids. `tenants/<tenant>/responses.jsonl`, one
//! line `{"response", "conversation", "head"}` per logged response, so that a
//! `previous_response_id` continues its conversation after a restart too; and
//! `tenants/<tenant>/objects.jsonl`, one line `{"object"}` per upstream object the
//! tenant created, so that no other tenant may name it.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::layout::TENANTS_DIR;
use super::ResponseEnd;
use crate::base::digest::PrefixDigest;
use crate::base::id::ConversationId;
use crate::base::tenant::TenantId;

/// File name of a tenant's response index.
pub(crate) const RESPONSES_FILE: &str = "responses.jsonl";

/// One line of the index.
#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    response: String,
    conversation: String,
    head: Option<PrefixDigest>,
}

/// Where `tenant`'s index lives.
pub(crate) fn index_path(data_dir: &Path, tenant: &TenantId) -> PathBuf {
    data_dir
        .join(TENANTS_DIR)
        .join(tenant.as_str())
        .join(RESPONSES_FILE)
}

/// The line that records `response_id` as ending `head` of `id`.
pub(crate) fn encode_line(
    id: &ConversationId,
    response_id: &str,
    head: Option<PrefixDigest>,
) -> Result<Vec<u8>, serde_json::Error> {
    let mut line = serde_json::to_vec(&Entry {
        response: response_id.to_owned(),
        conversation: id.as_str().to_owned(),
        head,
    })?;
    line.push(b'\n');
    Ok(line)
}

/// Looks `response_id` up in the index at `path` under `data_dir` (blocking; a missing
/// file knows none). The newest line wins; an unreadable line is skipped.
pub(crate) fn lookup(
    data_dir: &Path,
    path: &Path,
    tenant: &TenantId,
    response_id: &str,
) -> std::io::Result<Option<ResponseEnd>> {
    let file = match super::perms::open_beneath(data_dir, path, super::perms::Access::Read) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err),
    };
    let mut found = None;
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        // Cheap filter first: most lines are other responses.
        if !line.contains(response_id) {
            continue;
        }
        let Ok(entry) = serde_json::from_str::<Entry>(&line) else {
            continue;
        };
        if entry.response == response_id {
            if let Ok(id) = ConversationId::parse(tenant.clone(), &entry.conversation) {
                found = Some((id, entry.head));
            }
        }
    }
    Ok(found)
}

/// Rewrites the index at `path` without the lines of the conversations `gone` says
/// (blocking; run where no append can interleave). The rewrite replaces the file in one
/// rename; a missing file has nothing to drop.
pub(crate) fn drop_conversations(path: &Path, gone: impl Fn(&str) -> bool) -> std::io::Result<()> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    };
    let mut kept = Vec::new();
    let mut dropped = false;
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        let named =
            serde_json::from_str::<Entry>(&line).is_ok_and(|entry| gone(&entry.conversation));
        if named {
            dropped = true;
        } else {
            kept.extend_from_slice(line.as_bytes());
            kept.push(b'\n');
        }
    }
    if !dropped {
        return Ok(());
    }
    super::perms::replace_file(path, &kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_response_is_found_again_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let tenant = TenantId::legacy();
        let path = index_path(dir.path(), &tenant);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let id = ConversationId::parse(tenant.clone(), "chain-1").unwrap();
        let head = Some(crate::base::digest::message_digest(&serde_json::json!("h")));
        let mut bytes = encode_line(&id, "resp_1", head).unwrap();
        bytes.extend(b"not json resp_2\n");
        bytes.extend(encode_line(&id, "resp_2", None).unwrap());
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(
            lookup(dir.path(), &path, &tenant, "resp_1").unwrap(),
            Some((id.clone(), head))
        );
        assert_eq!(
            lookup(dir.path(), &path, &tenant, "resp_2").unwrap(),
            Some((id, None))
        );
        assert_eq!(lookup(dir.path(), &path, &tenant, "resp_9").unwrap(), None);
        let missing = dir.path().join("none.jsonl");
        assert_eq!(
            lookup(dir.path(), &missing, &tenant, "resp_1").unwrap(),
            None
        );
    }

    #[test]
    fn a_tenant_folder_that_is_a_link_owns_nothing_and_reads_no_index() {
        let dir = tempfile::tempdir().unwrap();
        let a = TenantId::parse("team-a").unwrap();
        let b = TenantId::parse("team-b").unwrap();
        let objects = objects_path(dir.path(), &a);
        std::fs::create_dir_all(objects.parent().unwrap()).unwrap();
        std::fs::write(&objects, encode_object("file-a1")).unwrap();
        let id = ConversationId::parse(a.clone(), "chain-1").unwrap();
        std::fs::write(
            index_path(dir.path(), &a),
            encode_line(&id, "resp_1", None).unwrap(),
        )
        .unwrap();
        // team-b's folder planted as a link to team-a's.
        std::os::unix::fs::symlink(
            objects.parent().unwrap(),
            objects.parent().unwrap().with_file_name("team-b"),
        )
        .unwrap();
        let owners = ObjectOwners::load(dir.path()).unwrap();
        assert_eq!(owners.owner("file-a1"), Some(&a));
        let linked = index_path(dir.path(), &b);
        assert!(lookup(dir.path(), &linked, &b, "resp_1").is_err());
    }
}

/// File name of a tenant's object index.
pub(crate) const OBJECTS_FILE: &str = "objects.jsonl";

/// One line of the object index.
#[derive(Debug, Serialize, Deserialize)]
struct Object {
    object: String,
}

/// Where `tenant`'s object index lives.
pub(crate) fn objects_path(data_dir: &Path, tenant: &TenantId) -> PathBuf {
    data_dir
        .join(TENANTS_DIR)
        .join(tenant.as_str())
        .join(OBJECTS_FILE)
}

/// The line that records `object`.
pub(crate) fn encode_object(object: &str) -> Vec<u8> {
    let mut line = serde_json::json!({"object": object})
        .to_string()
        .into_bytes();
    line.push(b'\n');
    line
}

/// Every tenant's upstream objects, by a digest of the id: 16 bytes and a shared
/// tenant name per object, however long the upstream made its ids. Loaded from the
/// tenants' object indexes once, then kept up to date by the appends.
#[derive(Default)]
pub(crate) struct ObjectOwners {
    owners: std::collections::HashMap<u128, TenantId>,
}

impl ObjectOwners {
    /// Reads every tenant's object index under `data_dir` (blocking). The first owner
    /// recorded for an object keeps it; an unreadable line is skipped.
    pub(crate) fn load(data_dir: &Path) -> std::io::Result<Self> {
        let mut owners = Self::default();
        for tenant in super::layout::tenants(data_dir)? {
            let path = objects_path(data_dir, &tenant);
            let file = match super::perms::open_beneath(data_dir, &path, super::perms::Access::Read)
            {
                Ok(file) => file,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                // A link in place of a tenant's folder is not a tenant: its objects
                // would become that name's.
                Err(err)
                    if [rustix::io::Errno::LOOP, rustix::io::Errno::NOTDIR]
                        .iter()
                        .any(|no| err.raw_os_error() == Some(no.raw_os_error())) =>
                {
                    tracing::warn!(path = %path.display(), "skipping a tenant folder that is a symbolic link");
                    continue;
                }
                Err(err) => return Err(err),
            };
            for line in std::io::BufReader::new(file).lines() {
                if let Ok(entry) = serde_json::from_str::<Object>(&line?) {
                    owners.insert(&entry.object, &tenant);
                }
            }
        }
        Ok(owners)
    }

    /// Records `tenant` as `object`'s owner, unless it has one already.
    pub(crate) fn insert(&mut self, object: &str, tenant: &TenantId) {
        self.owners
            .entry(object_key(object))
            .or_insert_with(|| tenant.clone());
    }

    /// The tenant that created `object`.
    pub(crate) fn owner(&self, object: &str) -> Option<&TenantId> {
        self.owners.get(&object_key(object))
    }
}

fn object_key(object: &str) -> u128 {
    twox_hash::XxHash3_128::oneshot(object.as_bytes())
}
