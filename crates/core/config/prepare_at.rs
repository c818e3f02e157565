//! `compaction.prepare_at`: when a conversation's compaction starts in the background,
//! a share of the trigger or `"auto"`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// When a conversation's compaction is prepared in the background.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum PrepareAt {
    /// When the conversation, growing as it has per request and per second, would
    /// reach the trigger before the summariser, as fast as it has been, could finish.
    #[default]
    Auto,
    /// At this share of the trigger; 0: never.
    Share(f64),
}

impl PrepareAt {
    /// True when nothing is ever prepared (`0`).
    pub fn is_off(self) -> bool {
        matches!(self, PrepareAt::Share(share) if share <= 0.0)
    }
}

/// How the setting is written: a number, or a word.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Written {
    Share(f64),
    Word(String),
}

impl Serialize for PrepareAt {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            PrepareAt::Auto => Written::Word("auto".into()),
            PrepareAt::Share(share) => Written::Share(*share),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for PrepareAt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Written::deserialize(deserializer)? {
            Written::Share(share) => Ok(PrepareAt::Share(share)),
            Written::Word(word) if word == "auto" => Ok(PrepareAt::Auto),
            Written::Word(word) => Err(serde::de::Error::custom(format!(
                "expected a share of the trigger or \"auto\", found {word:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use figment::providers::Format;

    use super::*;

    #[derive(Deserialize)]
    struct Holder {
        prepare_at: PrepareAt,
    }

    fn read(toml: &str) -> Result<PrepareAt, String> {
        figment::Figment::from(figment::providers::Toml::string(toml))
            .extract::<Holder>()
            .map(|h| h.prepare_at)
            .map_err(|err| err.to_string())
    }

    #[test]
    fn a_share_or_auto_and_nothing_else() {
        assert_eq!(read("prepare_at = \"auto\""), Ok(PrepareAt::Auto));
        assert_eq!(read("prepare_at = 0.8"), Ok(PrepareAt::Share(0.8)));
        assert_eq!(read("prepare_at = 0"), Ok(PrepareAt::Share(0.0)));
        assert!(read("prepare_at = 0").unwrap().is_off());
        assert!(read("prepare_at = \"soon\"")
            .unwrap_err()
            .contains("\"auto\""));
    }
}
