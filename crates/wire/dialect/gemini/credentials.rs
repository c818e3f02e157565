//! Gemini: credentials and objects: where the key goes, the API headers, what the provider names its stored objects by.

use super::*;
use crate::dialect::Credentials;

impl Credentials for Gemini {
    /// Files, cached contents and batches, named `files/…`: in a path
    /// (`/v1beta/files/abc`), in `cachedContent`, and in a `fileUri` (a URL that ends
    /// with the name).
    fn objects(&self) -> crate::dialect::objects::Objects {
        crate::dialect::objects::Objects {
            // Both spellings: Google's parser reads `cached_content` as `cachedContent`.
            id_fields: &[
                "cachedContent",
                "cached_content",
                "fileUri",
                "file_uri",
                "fileSearchStoreNames",
                "file_search_store_names",
                "fileSearchStore",
                "file_search_store",
            ],
            id_prefixes: &[
                "files/",
                "cachedContents/",
                "batches/",
                "fileSearchStores/",
                "corpora/",
            ],
            listings: &[
                "/v1beta/files",
                "/v1beta/cachedContents",
                "/v1beta/batches",
                "/v1beta/fileSearchStores",
                "/v1beta/corpora",
            ],
        }
    }

    fn key_paths(&self) -> &'static [&'static str] {
        &[
            "/v1beta/files",
            "/upload/v1beta/files",
            "/v1beta/cachedContents",
            "/v1beta/batches",
            "/v1beta/fileSearchStores",
            "/upload/v1beta/fileSearchStores",
            "/v1/models",
        ]
    }

    fn key_header(&self) -> KeyHeader {
        KeyHeader::Named("x-goog-api-key")
    }

    fn query_key(&self) -> Option<&'static str> {
        Some("key")
    }

    fn api_headers(&self) -> &'static [&'static str] {
        &["x-goog-user-project"]
    }

    fn key_env(&self) -> &'static str {
        "GEMINI_API_KEY"
    }
}
