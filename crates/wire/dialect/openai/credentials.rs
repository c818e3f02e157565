//! OpenAiChat: credentials and objects: where the key goes, the API headers, what the provider names its stored objects by.

use super::*;
use crate::dialect::Credentials;

impl Credentials for OpenAiChat {
    fn objects(&self) -> crate::dialect::objects::Objects {
        crate::dialect::objects::Objects {
            id_fields: &[
                "file_id",
                "file_ids",
                "input_file_id",
                "vector_store_id",
                "vector_store_ids",
                "assistant_id",
                "thread_id",
                "batch_id",
            ],
            id_prefixes: &[
                "file-",
                "batch_",
                "vs_",
                "vsfb_",
                "chatcmpl-",
                "asst_",
                "thread_",
                "run_",
                "upload_",
                "part_",
                "ftjob-",
                "eval_",
                "evalrun_",
            ],
            listings: &[
                "/v1/files",
                "/v1/batches",
                "/v1/vector_stores",
                "/v1/chat/completions",
                "/v1/assistants",
                "/v1/threads",
                "/v1/fine_tuning/jobs",
                "/v1/evals",
            ],
        }
    }

    fn key_paths(&self) -> &'static [&'static str] {
        &[
            "/v1/completions",
            "/v1/embeddings",
            "/v1/moderations",
            "/v1/models",
            "/v1/audio",
            "/v1/images",
            "/v1/files",
            "/v1/uploads",
            "/v1/batches",
            "/v1/vector_stores",
        ]
    }

    fn api_headers(&self) -> &'static [&'static str] {
        &["openai-organization", "openai-project"]
    }
}
