//! A wire format's credentials and objects: where the key goes, the API headers, what the provider names its stored objects by.

use crate::dialect::objects;
use crate::dialect::KeyHeader;

/// One wire format's credentials and objects.
pub trait Credentials: Send + Sync {
    /// Paths of the provider's API, besides [`crate::dialect::Api::path`], that a proxy key may use
    /// when its `paths` is unset: the objects this API's requests use (files, models…),
    /// each with everything under it. Not its admin APIs, which act for the account.
    fn key_paths(&self) -> &'static [&'static str] {
        &[]
    }

    /// What the provider's API names its stored objects by.
    fn objects(&self) -> objects::Objects {
        objects::Objects::NONE
    }

    /// Where the API takes a key.
    fn key_header(&self) -> KeyHeader {
        KeyHeader::Bearer
    }

    /// The client's API headers a summary call carries besides the credential: the
    /// API's version and account headers.
    fn api_headers(&self) -> &'static [&'static str];

    /// The environment variable this API's SDKs read the key from, for the calls
    /// `handoff eval` makes on its own.
    fn key_env(&self) -> &'static str {
        "OPENAI_API_KEY"
    }

    /// Headers every request of this API must carry, with the value handoff sends when
    /// it makes a call of its own and no client gave one (`anthropic-version`).
    fn required_headers(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }

    /// The query parameter some of the API's clients send the key in (`?key=`): moved
    /// into [`crate::dialect::Credentials::key_header`] before anything reads the request.
    fn query_key(&self) -> Option<&'static str> {
        None
    }
}
