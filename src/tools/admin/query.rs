//! The admin API's query strings.

/// The value of `name` in a query string (ids and tenants need no decoding).
pub(super) fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_owned())
}
