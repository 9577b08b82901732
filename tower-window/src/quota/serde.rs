//! `serde` for [`Quota`]: the DSL string, or `{ name, quota, scope }`.

use serde::{Deserialize, Serialize};

use super::{Quota, Scope, DEFAULT_NAME};

/// A quota as it appears in configuration: the DSL string, or a table with
/// a name.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum QuotaRepr {
    Text(String),
    Named {
        name: String,
        quota: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<String>,
    },
}

impl Serialize for Quota {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let scope = (self.scope() != Scope::Subject).then(|| self.scope().to_string());
        let repr = if self.name() == DEFAULT_NAME && scope.is_none() {
            QuotaRepr::Text(self.to_string())
        } else {
            QuotaRepr::Named {
                name: self.name().to_string(),
                quota: self.to_string(),
                scope,
            }
        };
        repr.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Quota {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match QuotaRepr::deserialize(deserializer)? {
            QuotaRepr::Text(text) => text.parse().map_err(serde::de::Error::custom),
            QuotaRepr::Named { name, quota, scope } => {
                let scope = scope.as_deref().map_or(Ok(Scope::Subject), str::parse);
                quota
                    .parse::<Quota>()
                    .and_then(|q| q.named(&name))
                    .and_then(|q| Ok(q.scoped(scope?)))
                    .map_err(serde::de::Error::custom)
            }
        }
    }
}
