//! The `workers` key: how requests are spread over threads.

use serde::{Deserialize, Serialize};

/// How requests are spread over threads: `"auto"` (one worker per core, the default),
/// `0` (one work-stealing runtime over every core), or N workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "Written", into = "Written")]
pub enum Workers {
    /// One worker per core the process may run on (`available_parallelism`: its CPU
    /// affinity and a container's CPU quota count).
    #[default]
    Auto,
    /// One work-stealing runtime with a thread per core (`0`).
    Shared,
    /// This many workers, each a thread with its own runtime, listener and upstream
    /// connections.
    Count(usize),
}

impl Workers {
    /// The workers to start, or `None` for the shared work-stealing runtime.
    pub fn threads(self) -> Option<usize> {
        match self {
            Workers::Auto => Some(cores()),
            Workers::Shared => None,
            Workers::Count(count) => Some(count),
        }
    }
}

/// The cores the process may run on (`available_parallelism`: its CPU affinity and a
/// container's CPU quota count): `"auto"`'s workers, and the work-stealing runtime's
/// threads.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// The key as written: a count, or the word `auto`.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Written {
    Count(usize),
    Word(String),
}

impl TryFrom<Written> for Workers {
    type Error = String;

    fn try_from(written: Written) -> Result<Self, Self::Error> {
        match written {
            Written::Count(0) => Ok(Workers::Shared),
            Written::Count(count) => Ok(Workers::Count(count)),
            Written::Word(word) if word == "auto" => Ok(Workers::Auto),
            // An environment override arrives as text.
            Written::Word(word) => match word.parse::<usize>() {
                Ok(count) => Workers::try_from(Written::Count(count)),
                Err(_) => Err(format!(
                    "workers must be \"auto\", 0 or a number of threads, not {word:?}"
                )),
            },
        }
    }
}

impl From<Workers> for Written {
    fn from(workers: Workers) -> Self {
        match workers {
            Workers::Auto => Written::Word("auto".into()),
            Workers::Shared => Written::Count(0),
            Workers::Count(count) => Written::Count(count),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Serialize)]
    struct Holder {
        workers: Workers,
    }

    fn read(text: &str) -> Result<Workers, String> {
        use figment::providers::{Format, Toml};
        figment::Figment::from(Toml::string(text))
            .extract::<Holder>()
            .map(|holder| holder.workers)
            .map_err(|err| err.to_string())
    }

    #[test]
    fn each_written_form_reads_and_writes_back() {
        assert_eq!(read("workers = \"auto\""), Ok(Workers::Auto));
        assert_eq!(read("workers = 0"), Ok(Workers::Shared));
        assert_eq!(read("workers = 3"), Ok(Workers::Count(3)));
        assert_eq!(read("workers = \"2\""), Ok(Workers::Count(2)));
        for workers in [Workers::Auto, Workers::Shared, Workers::Count(3)] {
            let text = serde_json::to_string(&Holder { workers }).unwrap();
            let back: Holder = serde_json::from_str(&text).unwrap();
            assert_eq!(back.workers, workers, "{text}");
        }
        assert_eq!(Workers::Shared.threads(), None);
        assert_eq!(Workers::Count(3).threads(), Some(3));
        assert!(Workers::Auto.threads().is_some_and(|n| n >= 1));
    }

    #[test]
    fn anything_else_is_refused_with_what_is_allowed() {
        for bad in ["workers = \"many\"", "workers = -1", "workers = 1.5"] {
            let err = read(bad).unwrap_err();
            assert!(
                err.contains("workers") || err.contains("did not match"),
                "{bad}: {err}"
            );
        }
        assert!(read("workers = \"many\"")
            .unwrap_err()
            .contains("\"auto\", 0 or a number"));
    }
}
