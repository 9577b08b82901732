//! An answer's `dynamic_metadata`, as envoyproxy/ratelimit writes it with
//! `RESPONSE_DYNAMIC_METADATA` (`--dynamic-metadata`): Envoy hands it to
//! the filters after the rate limit filter (a router choosing a backend
//! that still has quota, say).
//!
//! ```text
//! domain          the request's domain
//! descriptors     each descriptor: entries ["key=value", ...], its limit
//!                 override and its hitsAddend when it has them
//! hitsAddend      the request's, when not 0
//! metadata        the rules' `metadata` of the descriptors that passed,
//!                 merged (the first one's value wins; mappings merge)
//! passedBackends  with quota-mode descriptors: each `backend_name` /
//!                 `model_name_override` pair that passed, once
//! ```
//!
//! A descriptor *passed* when its code is `OK` and, for a quota-mode one,
//! its quota group is not over (an exhausted model is never advertised);
//! unlimited descriptors are not listed.

use std::collections::HashMap;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, NullValue, Struct, Value};

/// What a prepared request keeps to write its metadata on every answer.
#[derive(Debug, Clone)]
pub struct Base {
    /// `domain`, `descriptors` and `hitsAddend`.
    fields: HashMap<String, Value>,
    /// Each descriptor's `backend_name` / `model_name_override` pair, if
    /// it has either.
    backends: Vec<Option<(String, String)>>,
}

impl Base {
    /// The parts of `request` every answer repeats.
    pub fn of(request: &RateLimitRequest) -> Self {
        let mut fields = HashMap::new();
        fields.insert("domain".to_owned(), text(&request.domain));
        let descriptors = request.descriptors.iter().map(descriptor).collect();
        fields.insert("descriptors".to_owned(), list(descriptors));
        if request.hits_addend != 0 {
            fields.insert(
                "hitsAddend".to_owned(),
                number(f64::from(request.hits_addend)),
            );
        }
        let backends = request.descriptors.iter().map(backend_of).collect();
        Self { fields, backends }
    }

    /// The metadata of an answer: `passed` holds each descriptor that
    /// passed, with its rule's `metadata`; `quota` says whether any
    /// descriptor is a quota-mode one.
    pub fn answer<'a>(
        &self,
        passed: impl Iterator<Item = (usize, Option<&'a Struct>)>,
        quota: bool,
    ) -> Struct {
        let mut fields = self.fields.clone();
        let mut merged = Struct::default();
        let mut backends: Vec<&(String, String)> = Vec::new();
        for (i, metadata) in passed {
            if let Some(metadata) = metadata {
                merge(&mut merged, metadata);
            }
            if let Some(Some(pair)) = self.backends.get(i) {
                if !backends.contains(&pair) {
                    backends.push(pair);
                }
            }
        }
        if !merged.fields.is_empty() {
            fields.insert("metadata".to_owned(), structure(merged));
        }
        if quota && !backends.is_empty() {
            let pairs = backends
                .into_iter()
                .map(|(backend, model)| {
                    let mut pair = HashMap::new();
                    pair.insert("backend_name".to_owned(), text(backend));
                    pair.insert("model_name_override".to_owned(), text(model));
                    structure(Struct { fields: pair })
                })
                .collect();
            fields.insert("passedBackends".to_owned(), list(pairs));
        }
        Struct { fields }
    }
}

/// A rule's `metadata` (YAML) as a protobuf `Struct`; a value that is not
/// a mapping is kept under `value`.
pub fn from_yaml(yaml: &serde_norway::Value) -> Struct {
    match value_of(yaml).kind {
        Some(Kind::StructValue(s)) => s,
        other => {
            let mut fields = HashMap::new();
            fields.insert("value".to_owned(), Value { kind: other });
            Struct { fields }
        }
    }
}

fn value_of(yaml: &serde_norway::Value) -> Value {
    use serde_norway::Value as Yaml;
    let kind = match yaml {
        Yaml::Null => Kind::NullValue(NullValue::NullValue as i32),
        Yaml::Bool(b) => Kind::BoolValue(*b),
        Yaml::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Yaml::String(s) => Kind::StringValue(s.clone()),
        Yaml::Sequence(items) => Kind::ListValue(ListValue {
            values: items.iter().map(value_of).collect(),
        }),
        Yaml::Mapping(map) => Kind::StructValue(Struct {
            fields: map
                .iter()
                .map(|(k, v)| (key_text(k), value_of(v)))
                .collect(),
        }),
        Yaml::Tagged(tagged) => return value_of(&tagged.value),
    };
    Value { kind: Some(kind) }
}

fn key_text(key: &serde_norway::Value) -> String {
    match key {
        serde_norway::Value::String(s) => s.clone(),
        other => serde_norway::to_string(other)
            .map(|s| s.trim_end().to_owned())
            .unwrap_or_default(),
    }
}

/// Merges `src` into `dest`: a key `dest` has keeps its value, unless both
/// are mappings, which merge.
fn merge(dest: &mut Struct, src: &Struct) {
    for (key, value) in &src.fields {
        match dest.fields.get_mut(key) {
            Some(Value {
                kind: Some(Kind::StructValue(inner)),
            }) => {
                if let Some(Kind::StructValue(src_inner)) = &value.kind {
                    merge(inner, src_inner);
                }
            }
            Some(_) => {}
            None => {
                dest.fields.insert(key.clone(), value.clone());
            }
        }
    }
}

fn descriptor(descriptor: &RateLimitDescriptor) -> Value {
    let mut fields = HashMap::new();
    let entries = descriptor
        .entries
        .iter()
        .map(|e| text(&format!("{}={}", e.key, e.value)))
        .collect();
    fields.insert("entries".to_owned(), list(entries));
    if let Some(limit) = &descriptor.limit {
        let unit = Unit::try_from(limit.unit).unwrap_or(Unit::Unknown);
        fields.insert(
            "limit".to_owned(),
            text(&format!(
                "requests_per_unit:{} unit:{}",
                limit.requests_per_unit,
                unit.as_str_name()
            )),
        );
    }
    if let Some(hits) = &descriptor.hits_addend {
        // A JSON number, as the reference writes it.
        #[allow(clippy::cast_precision_loss)]
        fields.insert("hitsAddend".to_owned(), number(hits.value as f64));
    }
    structure(Struct { fields })
}

fn backend_of(descriptor: &RateLimitDescriptor) -> Option<(String, String)> {
    model_of(descriptor).map(|(backend, model)| (backend.to_owned(), model.to_owned()))
}

/// A descriptor's `backend_name` and `model_name_override` values (the last
/// of each, `""` for one absent), when it has either: the model it names,
/// as envoyproxy/ratelimit reads it for quota groups and dynamic metadata.
pub(super) fn model_of(descriptor: &RateLimitDescriptor) -> Option<(&str, &str)> {
    let value_of = |key: &str| {
        descriptor
            .entries
            .iter()
            .rev()
            .find(|e| e.key == key)
            .map(|e| e.value.as_str())
    };
    let (backend, model) = (value_of("backend_name"), value_of("model_name_override"));
    (backend.is_some() || model.is_some())
        .then(|| (backend.unwrap_or_default(), model.unwrap_or_default()))
}

fn text(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn structure(s: Struct) -> Value {
    Value {
        kind: Some(Kind::StructValue(s)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_first_passed_value_wins_and_mappings_merge() {
        let a = from_yaml(&serde_norway::from_str("{name: a, nested: {x: 1}}").unwrap());
        let b = from_yaml(&serde_norway::from_str("{name: b, other: 2, nested: {y: 2}}").unwrap());
        let base = Base::of(&RateLimitRequest {
            domain: "d".to_owned(),
            ..RateLimitRequest::default()
        });
        let answer = base.answer([(0, Some(&a)), (1, Some(&b))].into_iter(), false);
        let Some(Kind::StructValue(metadata)) = &answer.fields["metadata"].kind else {
            panic!("a struct");
        };
        assert_eq!(metadata.fields["name"], text("a"));
        assert_eq!(metadata.fields["other"], number(2.0));
        let Some(Kind::StructValue(nested)) = &metadata.fields["nested"].kind else {
            panic!("a struct");
        };
        assert_eq!(nested.fields.len(), 2);
        assert_eq!(answer.fields["domain"], text("d"));
    }
}
