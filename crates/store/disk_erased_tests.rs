//! A conversation erased while it was being compacted stays erased: the compaction's
//! commit, fenced by the erasure's tombstone, writes nothing, whichever process erased.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use super::*;

fn writer(dir: &Path) -> Writer {
    Writer::start(
        crate::config::FsyncPolicy::Never,
        Default::default(),
        dir.to_owned(),
    )
    .unwrap()
}

fn message(text: &str) -> Line {
    super::tests::message(serde_json::json!({"role": "user", "content": text}))
}

#[tokio::test]
async fn a_compaction_committed_after_its_conversation_was_erased_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::new(dir.path(), writer(dir.path()));
    let tenant = TenantId::parse("team-a").unwrap();
    let id = ConversationId::parse(tenant.clone(), "compacting").unwrap();
    store.append(&id, vec![message("ERASE-ME")]).await.unwrap();
    let lease = store
        .acquire(&id, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    // Erased as the CLI or the admin API erases: the folder, then the tombstone.
    assert!(matches!(
        store.remove(&id, Unless::Held).await.unwrap(),
        Removed::Removed(_)
    ));
    let mut tombstone = Tombstone::now("erase", "cli:test", &tenant);
    tombstone.conversations = vec![id.as_str().to_owned()];
    store.tombstone(tombstone).await.unwrap();

    let record = crate::adoption::tests::record("cmp-late", 1);
    let committed = store.commit_compaction(&id, record.clone(), &lease).await;
    assert!(
        matches!(committed, Err(StoreError::LeaseLost(_))),
        "{committed:?}"
    );
    assert!(
        !conversation_dir(dir.path(), &id).exists(),
        "the compaction brought the erased conversation back"
    );

    // A conversation of that name started after the erasure compacts as any other.
    tokio::time::sleep(Duration::from_millis(5)).await;
    store
        .append(&id, vec![message("a new start")])
        .await
        .unwrap();
    let lease = store
        .acquire(&id, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let committed = store.commit_compaction(&id, record, &lease).await;
    assert!(matches!(committed, Ok(Committed::Written)), "{committed:?}");
}
