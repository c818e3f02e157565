//! Where the key variables the config names are read from: the process environment, or
//! values the caller hands over (the in-process tests, which share one environment and
//! run at once, each with keys of its own).

use std::collections::HashMap;
use std::sync::Arc;

/// The source of the variables `upstream.api_key_env`, `auth.keys[].key_env` and the
/// dialects' key variables name.
#[derive(Debug, Clone, Default)]
pub(crate) struct Secrets {
    /// The values handed over; `None` reads the environment.
    given: Option<Arc<HashMap<String, String>>>,
}

impl Secrets {
    /// These values, and no other: the environment is not read.
    #[cfg(test)]
    pub(crate) fn given(values: &[(&str, &str)]) -> Self {
        let map = values
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        Self {
            given: Some(Arc::new(map)),
        }
    }

    /// The value of `variable`; an empty one counts as unset.
    pub(crate) fn get(&self, variable: &str) -> Option<String> {
        let value = match &self.given {
            Some(given) => given.get(variable).cloned(),
            None => std::env::var(variable).ok(),
        };
        value.filter(|v| !v.is_empty())
    }
}
