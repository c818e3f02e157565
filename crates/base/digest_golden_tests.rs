//! Digests are the log's identity: every message of the shared real conversations
//! must keep the digest it had when `tests/fixtures/digests.json` was written (before
//! echo forms were merged), or existing logs would stop matching their requests.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;

use super::{message_digest, prefix_digests, Digest};

#[test]
fn every_message_of_the_real_conversations_keeps_its_digest() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let golden: Value =
        serde_json::from_slice(&std::fs::read(root.join("digests.json")).unwrap()).unwrap();
    let golden = golden.as_object().unwrap();
    assert_eq!(golden.len(), 6, "one entry per shared conversation");
    let mut checked = 0;
    for (name, expected) in golden {
        let conversation: Value =
            serde_json::from_slice(&std::fs::read(root.join("conversations").join(name)).unwrap())
                .unwrap();
        let digests: Vec<_> = conversation["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(message_digest)
            .collect();
        let hex =
            |d: &[Digest]| -> Vec<Value> { d.iter().map(|d| Value::String(d.to_hex())).collect() };
        assert_eq!(
            hex(&digests),
            *expected["messages"].as_array().unwrap(),
            "{name}"
        );
        assert_eq!(
            hex(&prefix_digests(&digests)),
            *expected["chain"].as_array().unwrap(),
            "{name}"
        );
        checked += digests.len();
    }
    assert!(checked >= 97, "only {checked} messages checked");
}
