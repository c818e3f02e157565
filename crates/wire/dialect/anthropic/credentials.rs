//! AnthropicMessages: credentials and objects: where the key goes, the API headers, what the provider names its stored objects by.

use super::*;
use crate::dialect::Credentials;

impl Credentials for AnthropicMessages {
    fn objects(&self) -> crate::dialect::objects::Objects {
        crate::dialect::objects::Objects {
            // A custom skill is named by `skill_id` (in a request's `container`) and by
            // its path; a code-execution container by `container` (its id, or an object
            // with its `id`), and is the tenant's whose reply ran in it.
            id_fields: &["file_id", "skill_id", "container"],
            id_prefixes: &["file_", "msgbatch_", "skill_", "container_"],
            listings: &["/v1/messages/batches", "/v1/files", "/v1/skills"],
        }
    }

    fn key_header(&self) -> KeyHeader {
        KeyHeader::Named("x-api-key")
    }

    fn api_headers(&self) -> &'static [&'static str] {
        &["anthropic-version"]
    }

    fn key_env(&self) -> &'static str {
        "ANTHROPIC_API_KEY"
    }

    fn required_headers(&self) -> &'static [(&'static str, &'static str)] {
        &[("anthropic-version", "2023-06-01")]
    }
}
