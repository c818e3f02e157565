//! OpenAiResponses: credentials and objects: where the key goes, the API headers, what the provider names its stored objects by.

use super::*;
use crate::dialect::Credentials;

impl Credentials for OpenAiResponses {
    fn objects(&self) -> crate::dialect::objects::Objects {
        crate::dialect::objects::Objects {
            id_fields: &[
                "previous_response_id",
                "conversation",
                "container",
                "container_id",
            ],
            id_prefixes: &["resp_", "conv_", "cntr_", "cfile_"],
            listings: &["/v1/containers"],
        }
    }

    fn key_paths(&self) -> &'static [&'static str] {
        &["/v1/conversations"]
    }

    fn api_headers(&self) -> &'static [&'static str] {
        &["openai-organization", "openai-project"]
    }
}
