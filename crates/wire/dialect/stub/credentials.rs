//! StubDialect: credentials and objects: where the key goes, the API headers, what the provider names its stored objects by.

use super::*;
use crate::dialect::Credentials;

impl Credentials for StubDialect {
    fn key_header(&self) -> KeyHeader {
        KeyHeader::Named("x-tally-key")
    }

    fn api_headers(&self) -> &'static [&'static str] {
        &["tally-version"]
    }
}
